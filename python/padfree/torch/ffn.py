"""The FFN up-projection with its activation: in the cuBLASLt epilogue where that computes the model's
activation to the dtype's precision, else a plain GEMM followed by padfree.ops.bias_gelu.

torch._addmm_activation(use_gelu=True) runs cuBLASLt's GELU epilogue, which is the tanh form. BERT's
"gelu" is the erf form: the two differ by at most 4.7e-4 (near |x| = 2.7), under half an fp16/bf16
ulp there but far above fp32's. Rather than assume what a given torch/cuBLASLt does, a probe measures
the epilogue against the exact activation once per (device, dtype, shape) at load time.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

# Allowed |epilogue - exact| in units of the dtype's eps times max(1, |exact|): covers the final
# rounding and a few ulps of the activation's own arithmetic, not a different function in fp32.
PROBE_ULPS = 4.0
PROBE_ROWS = 64
PROBE_RANGE = 6.0  # GELU's tanh/erf difference lives in |x| < 6


def epilogue_matches(activation: str, dtype: torch.dtype, device: torch.device, in_features: int,
                     out_features: int) -> bool:
    """Whether _addmm_activation computes `activation` ("erf", "tanh" GELU or "relu") to PROBE_ULPS.

    The probe multiplies by a 0/1 selection matrix (exact in every dtype) so that the epilogue sees
    known pre-activations over [-6, 6]; it uses the model's GEMM shape so that torch picks the same
    path (cuBLASLt or its fallback) as for the real layer. Synchronizes (load time only).
    """
    if activation == "relu":
        return True  # exact in any implementation
    x = torch.linspace(-PROBE_RANGE, PROBE_RANGE, PROBE_ROWS * in_features, device=device,
                       dtype=torch.float64).reshape(PROBE_ROWS, in_features).to(dtype)
    cols = torch.arange(out_features, device=device) % in_features
    select = torch.zeros(out_features, in_features, device=device, dtype=dtype)
    select[torch.arange(out_features, device=device), cols] = 1
    bias = torch.zeros(out_features, device=device, dtype=dtype)
    got = torch._addmm_activation(bias, x, select.t(), use_gelu=True).double()
    exact = F.gelu(x.double()[:, cols], approximate="tanh" if activation == "tanh" else "none")
    tolerance = PROBE_ULPS * torch.finfo(dtype).eps * exact.abs().clamp(min=1.0)
    return bool(((got - exact).abs() <= tolerance).all())


class FfnUp:
    """out = act(x @ weight.T + bias), writing into a preallocated `out` (graph-capturable)."""

    def __init__(self, activation: str, use_epilogue: bool, ops):
        self.activation = activation
        self.use_epilogue = use_epilogue
        self._ops = ops

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, out: torch.Tensor):
        if self.use_epilogue:
            torch._addmm_activation(bias, x, weight.t(), use_gelu=self.activation != "relu", out=out)
        else:
            torch.mm(x, weight.t(), out=out)
            self._ops.bias_gelu(out, bias, approximate="tanh" if self.activation == "tanh" else "none",
                                out=out)
        return out

    def __repr__(self) -> str:
        return f"FfnUp({self.activation}, {'epilogue' if self.use_epilogue else 'bias_gelu kernel'})"
