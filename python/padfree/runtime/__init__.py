"""padfree.runtime: serving variable-length batches over an engine or the PyTorch path.

    rt = padfree.Runtime("model.engine")            # or Runtime(padfree.torch.from_hf(model))
    out = rt.run([[101, 2023, 102], [101, 102]])    # out["last_hidden_state"]: [len_i, H] each

See docs/RUNTIME.md. Host-side logic (_inputs, _plan, _staging, _outputs) needs no CUDA, so it is
tested on the CPU with a backend test double.
"""
from ..ops._tensors import InputError  # noqa: F401
from ._pending import PendingRun  # noqa: F401
from ._runtime import Runtime, open_backend  # noqa: F401
from .backends.base import PER_SEQUENCE_OUTPUTS, Backend, Limits, limits_of, per_sequence_outputs_of  # noqa: F401
from .backends.encoder import EncoderBackend  # noqa: F401
