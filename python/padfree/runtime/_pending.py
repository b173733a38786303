"""What Runtime.submit returns: a batch whose work is enqueued, and its outputs once they are ready."""
from __future__ import annotations

from typing import Any, Callable

import torch


class PendingRun:
    """A submitted batch (Runtime.submit). Its GPU work is enqueued on the runtime's stream; the host
    is free to validate and pack the next batch meanwhile.

    result(): the outputs, as Runtime.run returns them. For output="numpy" it waits until the GPU has
      written them; for output="torch" it returns at once, the tensors ready in the stream's order (as
      run() does: later work on that stream sees them; work on another stream waits on `ready` first).
    done(): whether the GPU has finished the batch (never blocks). synchronize(): wait until it has.
    ready: the torch.cuda.Event recorded after the batch's last work (None for a CPU backend).
    """

    __slots__ = ("ready", "_host", "_outputs", "_finish")

    def __init__(self, ready: torch.cuda.Event | None, host: bool, outputs: dict[str, Any] | None,
                 finish: Callable[[], dict[str, Any]] | None = None):
        """host: the outputs are host memory the GPU writes (result() waits for `ready`); outputs: them,
        or None where they are only built by finish() once the data is there (bfloat16 -> numpy)."""
        self.ready = ready
        self._host = host
        self._outputs = outputs
        self._finish = finish

    def done(self) -> bool:
        return self.ready is None or self.ready.query()

    def synchronize(self) -> None:
        if self.ready is not None:
            self.ready.synchronize()

    def result(self) -> dict[str, Any]:
        if self._host:
            self.synchronize()  # a completed event returns at once: result() may be called again
        if self._outputs is None:
            self._outputs, self._finish = self._finish(), None
        return self._outputs

    def __repr__(self) -> str:
        return f"PendingRun({'done' if self.done() else 'running'})"
