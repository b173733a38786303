"""A progress display for engine builds, through TensorRT's IProgressMonitor: top-level phases as
lines on a log; on a terminal, the innermost running phase redrawn in place with a bar."""
from __future__ import annotations

import sys
import time


def monitor_class(trt):
    """An IProgressMonitor subclass for this TensorRT module (the base class differs per module)."""
    base = getattr(trt, "IProgressMonitor", None)
    if base is None:
        return None

    class Progress(base):
        def __init__(self, stream=sys.stderr):
            base.__init__(self)
            self._stream = stream
            self._tty = stream.isatty()
            self._phases: dict[str, tuple[int, int, float]] = {}  # name -> (depth, steps, start)

        def phase_start(self, phase_name, parent_phase, num_steps):
            depth = self._phases[parent_phase][0] + 1 if parent_phase in self._phases else 0
            self._phases[phase_name] = (depth, max(int(num_steps), 1), time.perf_counter())
            if depth == 0:
                self._write(f"{phase_name} ({num_steps} steps)", newline=not self._tty)

        def step_complete(self, phase_name, step):
            if self._tty and phase_name in self._phases:
                depth, steps, _ = self._phases[phase_name]
                done = min(int(step) + 1, steps)
                bar = "#" * (20 * done // steps)
                self._write(f"{'  ' * depth}{phase_name} [{bar:<20}] {done}/{steps}", newline=False)
            return True  # never cancel

        def phase_finish(self, phase_name):
            depth, _, start = self._phases.pop(phase_name, (0, 1, time.perf_counter()))
            if depth == 0:
                self._write(f"{phase_name} done in {time.perf_counter() - start:.1f} s", newline=True)

        def _write(self, text, newline):
            if self._tty:
                self._stream.write("\r\033[K" + text + ("\n" if newline else ""))
            else:
                self._stream.write(text + "\n")
            self._stream.flush()

    return Progress
