"""A decode step's decoder as one kernel (padfree.h: padfree_decode_program).

Record the step's decode_linear / decoder_self_attention / cross_attention calls with their usual
arguments, then run() launches them as one cooperative grid with a grid barrier between consecutive
ones: results equal the calls one by one (the same device code per operation), without a kernel
launch per operation. The program keeps the tensors it was given (and the outputs it allocated) until
it is dropped; the attention runs unsplit, without a workspace.
"""
from __future__ import annotations

import ctypes

import torch

from ._tensors import InputError, call_kernel, ptr, stream_handle
from .decoder import (
    DECODE_LINEAR_MAX_ROWS,
    _checked_cross_attention,
    _checked_decode_linear,
    _checked_self_attention,
)

MAX_OPS = 200  # kernels/decoder/decode_program.h: kDecodeProgramMaxOps
LINEAR, SELF_ATTENTION, CROSS_ATTENTION = 0, 1, 2  # padfree_decode_op_kind


class DecodeOp(ctypes.Structure):
    """padfree.h: padfree_decode_op (field for field)."""
    _fields_ = [("kind", ctypes.c_int32), ("activation", ctypes.c_int32), ("input", ctypes.c_void_p),
                ("weight", ctypes.c_void_p), ("bias", ctypes.c_void_p), ("residual", ctypes.c_void_p),
                ("ln_gamma", ctypes.c_void_p), ("ln_beta", ctypes.c_void_p), ("out", ctypes.c_void_p),
                ("x_norm_out", ctypes.c_void_p), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p),
                ("cache_indir", ctypes.c_void_p), ("step", ctypes.c_void_p), ("kv_mem", ctypes.c_void_p),
                ("cu_seqlens", ctypes.c_void_p), ("total_tokens", ctypes.c_int64), ("in_features", ctypes.c_int32),
                ("out_features", ctypes.c_int32), ("eps", ctypes.c_float), ("num_heads", ctypes.c_int32),
                ("head_dim", ctypes.c_int32), ("max_len", ctypes.c_int32), ("batch", ctypes.c_int32),
                ("num_beams", ctypes.c_int32), ("max_seqlen", ctypes.c_int32), ("softmax_scale", ctypes.c_float)]


def new_barrier(device: torch.device) -> torch.Tensor:
    """A grid barrier's state for decode programs (8 zeroed bytes; each run leaves it ready for the next).
    Programs that may run at the same time (concurrent streams) need one each."""
    return torch.zeros(2, dtype=torch.int32, device=device)


class DecodeProgram:
    """Operations over `rows` rows (1 to 8) of one dtype on one device, run in order by run().

    barrier: new_barrier()'s tensor, kept by a caller that runs programs again and again (a captured
    step: allocating one inside a CUDA-graph capture would add its zeroing to every replay); None
    allocates one."""

    def __init__(self, rows: int, dtype: torch.dtype, device: torch.device, barrier: torch.Tensor | None = None):
        if not 1 <= rows <= DECODE_LINEAR_MAX_ROWS:
            raise InputError(f"rows: a decode program takes 1 to {DECODE_LINEAR_MAX_ROWS} rows, got {rows}")
        self.rows, self.dtype, self.device = rows, dtype, torch.device(device)
        if barrier is not None and (barrier.dtype != torch.int32 or barrier.numel() != 2
                                    or barrier.device != self.device or not barrier.is_contiguous()):
            raise InputError("barrier: expected new_barrier()'s tensor (2 int32 on the program's device)")
        self._barrier = barrier
        self._ops: list[DecodeOp] = []
        self._tensors: list[torch.Tensor] = []   # alive until the program is dropped
        self._dtype_code: int | None = None

    def __len__(self) -> int:
        return len(self._ops)

    def _add(self, op: DecodeOp, dtype_code: int, rows: int, tensors) -> None:
        if rows != self.rows:
            raise InputError(f"decode program: an operation of {rows} rows in a program of {self.rows}")
        if self._dtype_code not in (None, dtype_code):
            raise InputError("decode program: every operation takes the program's dtype")
        if len(self._ops) == MAX_OPS:
            raise InputError(f"decode program: at most {MAX_OPS} operations")
        self._dtype_code = dtype_code
        self._ops.append(op)
        self._tensors += [t for t in tensors if t is not None]

    def linear(self, x, weight, bias=None, residual=None, ln=None, activation=None, out=None,
               x_norm_out=None) -> torch.Tensor:
        """decode_linear's arguments and result (its output is written when the program runs)."""
        out, call = _checked_decode_linear(x, weight, bias, residual, ln, activation, out, x_norm_out)
        gamma, beta, eps = call["ln"]
        op = DecodeOp(kind=LINEAR, activation=call["activation"], input=ptr(x), weight=ptr(weight), bias=ptr(bias),
                      residual=ptr(residual), ln_gamma=ptr(gamma), ln_beta=ptr(beta), out=ptr(out),
                      x_norm_out=ptr(x_norm_out), in_features=call["in_features"],
                      out_features=call["out_features"], eps=eps)
        self._add(op, call["dtype"], call["rows"], (x, weight, bias, residual, gamma, beta, out, x_norm_out))
        return out

    def self_attention(self, qkv, k_cache, v_cache, cache_indir, step, num_heads, qkv_bias=None,
                       softmax_scale=None, out=None) -> torch.Tensor:
        """decoder_self_attention's arguments (no workspace) and result."""
        out, call = _checked_self_attention(qkv, k_cache, v_cache, cache_indir, step, num_heads, qkv_bias,
                                            softmax_scale, out)
        op = DecodeOp(kind=SELF_ATTENTION, input=ptr(qkv), bias=ptr(qkv_bias), out=ptr(out), k_cache=ptr(k_cache),
                      v_cache=ptr(v_cache), cache_indir=ptr(cache_indir), step=ptr(step),
                      num_heads=call["num_heads"], head_dim=call["head_dim"], max_len=call["max_len"],
                      softmax_scale=call["scale"])
        self._add(op, call["dtype"], call["rows"], (qkv, k_cache, v_cache, cache_indir, step, qkv_bias, out))
        return out

    def cross_attention(self, q, kv_mem, cu_seqlens, max_seqlen, num_beams, num_heads, q_bias=None,
                        softmax_scale=None, out=None) -> torch.Tensor:
        """cross_attention's arguments (no workspace) and result."""
        out, call = _checked_cross_attention(q, kv_mem, cu_seqlens, max_seqlen, num_beams, num_heads, q_bias,
                                             softmax_scale, out)
        op = DecodeOp(kind=CROSS_ATTENTION, input=ptr(q), bias=ptr(q_bias), out=ptr(out), kv_mem=ptr(kv_mem),
                      cu_seqlens=ptr(cu_seqlens), total_tokens=kv_mem.shape[0], batch=call["batch"],
                      num_beams=call["num_beams"], max_seqlen=call["max_seqlen"], num_heads=call["num_heads"],
                      head_dim=call["head_dim"], softmax_scale=call["scale"])
        self._add(op, call["dtype"], call["rows"], (q, kv_mem, cu_seqlens, q_bias, out))
        return out

    def run(self) -> None:
        """Enqueues the operations as one kernel on torch's current stream."""
        if not self._ops:
            return
        if self._barrier is None:
            self._barrier = new_barrier(self.device)
        ops = (DecodeOp * len(self._ops))(*self._ops)
        call_kernel("padfree_decode_program", self.device, ctypes.addressof(ops), len(self._ops), self.rows,
                    ptr(self._barrier), self._dtype_code, stream_handle(self.device))


def decode_program(rows: int, dtype: torch.dtype, device: torch.device,
                   barrier: torch.Tensor | None = None) -> DecodeProgram:
    """An empty decode program (record its operations, then run())."""
    return DecodeProgram(rows, dtype, device, barrier)
