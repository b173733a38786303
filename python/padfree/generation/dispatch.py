"""The one place that decides which implementation of each contract op generation calls.

padfree.ops' CUDA kernel where the device is CUDA, the kernel library loads, the binding exists in
padfree.ops and the library exports its symbol (and, for the encoder's attention, the head_dim is one
the kernel is built for); else the pure-torch reference (reference_ops), with the reason logged once
per op and device. A kernel that refuses a configuration at its first call
(KernelUnsupportedError) is replaced by the reference for the rest of the process's use of this
DecoderOps, logged likewise. Nothing else in padfree.generation imports padfree.ops.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from .. import env, kernel_sizes
from . import reference_ops

log = logging.getLogger(__name__)

# The most rows a step runs its linear layers in fragment order for (DecoderOps.fragment_step_rows): up
# to 16, where whole steps measured faster than on decode_linear's CUDA-core and cluster kernels and
# cuBLAS (H200: 1-8 rows 6-13 %, Marian at 16 rows 7-9 %; KERNELS.md). The kernel takes up to 64 rows
# (17-64 on a thread-block cluster, faster than cuBLAS per layer at 32 rows), but whole steps of 32 rows
# were within the run-to-run spread and steps of 64 rows 7-38 % slower; PADFREE_FRAGMENT_ROWS tries it.
FRAGMENT_STEP_ROWS = 16

# The rows a step runs its linear layers as decode_gemm for (DecoderOps.decode_gemm_layers): from past the
# few-row kernels' range to the kernel's 256, past 64 rows only where its grids stay within two waves
# (post-LN Marian-base against cuBLAS with its LayerNorm and activation kernels, H200, ms/step: 8x4 0.305
# -> 0.278, 16x4 0.358 -> 0.278, 64x1 0.355 -> 0.275).
# Below 17 rows its 64-row tiles are no faster than the fragment kernel (H200, NLLB steps, one process:
# 1x4 1.21x, 2x4 1.14x, 4x4 1.03x, 12x1 0.96x, within the spread from 12 rows on).
DECODE_GEMM_ROWS = (FRAGMENT_STEP_ROWS + 1, 256)


class GemmLayer:
    """A decoder layer's six linear layers for decode_gemm (ops.decode_gemm.fold_layernorm): pre-LN, QKV,
    cross Q and fc1 with the LayerNorm before each folded in, and their biases (the attention kernels then
    add none), the output projections and fc2 as they are; post-LN, all six as they are."""

    __slots__ = ("qkv", "out", "q", "cross_out", "fc1", "fc2")

    @staticmethod
    def fold(layer, pre_ln: bool = True) -> "GemmLayer":
        """pre_ln False: a post-LN layer's linear layers as they are (its LayerNorms follow the residual
        sums, skip_layernorm kernels, and their outputs are the next residuals)."""
        from ..ops.decode_gemm import fold_layernorm

        def ln(weights):
            return (weights.weight, weights.bias, weights.eps) if pre_ln else None
        attn, cross, f = layer.self_attn, layer.cross_attn, layer.ffn
        g = GemmLayer()
        g.qkv = fold_layernorm(attn.qkv_weight, attn.qkv_bias, ln(attn.ln))
        g.out = fold_layernorm(attn.out_weight, attn.out_bias, None)
        g.q = fold_layernorm(cross.q_weight, cross.q_bias, ln(cross.ln))
        g.cross_out = fold_layernorm(cross.out_weight, cross.out_bias, None)
        g.fc1 = fold_layernorm(f.fc1_weight, f.fc1_bias, ln(f.ln))
        g.fc2 = fold_layernorm(f.fc2_weight, f.fc2_bias, None)
        return g


# contract op -> the C symbol its padfree.ops binding calls (the library must export it)
CONTRACT_OPS = {
    "decoder_self_attention": "padfree_decoder_self_attention",
    "beam_reorder_cache_indir": "padfree_beam_reorder_cache_indir",
    "cross_attention": "padfree_decoder_cross_attention",
    "log_softmax_topk": "padfree_logits_topk",
}
ENCODER_OPS = {"attention_varlen": "padfree_attention_varlen"}
# kernels that fuse what the caller otherwise does in torch ops, which are their reference: the searches'
# per-step bookkeeping (beam_search.py, sampling.py), the decoder's bias + residual + LayerNorm and its
# step embedding (decoder.py); the attribute is None where the kernel does not run. fragment_layout: the
# few-row step's weights in fragment order for decode_linear's fragment kernel (weight_fragments; where it
# does not run, decode_linear reads the nn.Linear weights)
FUSED_OPS = {"beam_search_step": "padfree_beam_search_step", "greedy_step": "padfree_greedy_step",
             "skip_layernorm": "padfree_skip_layernorm", "decode_linear": "padfree_decode_linear",
             "decoder_step_embedding": "padfree_decoder_step_embedding",
             "fragment_layout": "padfree_decode_linear_fragments", "decode_gemm": "padfree_decode_gemm"}


def _kernel_unavailable(name: str, symbol: str, device: torch.device) -> tuple[Callable | None, str]:
    """(the padfree.ops binding, "") or (None, why not)."""
    if device.type != "cuda":
        return None, f"device is {device.type}, the kernels run on CUDA"
    try:
        from .. import _lib, ops
        lib = _lib.load()
    except Exception as e:  # noqa: BLE001 - any failure to load means the reference runs; the reason is logged
        return None, f"kernel library not loadable ({type(e).__name__}: {e})"
    binding = getattr(ops, name, None)
    if binding is None:
        return None, f"padfree.ops has no {name} binding in this build"
    if not hasattr(lib, symbol):
        return None, f"the kernel library does not export {symbol}"
    return binding, ""


class DecoderOps:
    """The contract's ops (plus the encoder's attention_varlen) bound to one device.

    Attributes named as the ops; `sources` maps each op to "kernel" or "reference: <reason>".
    force_reference=True takes the reference for every op (the GPU tests' reference run).
    """

    def __init__(self, device: torch.device, encoder_head_dim: int, force_reference: bool = False):
        self.device = torch.device(device)
        self.sources: dict[str, str] = {}
        # ops named in PADFREE_GENERATION_TORCH_OPS (comma-separated) run their torch reference: to
        # compare a kernel's effect within one process, or to rule one out
        torch_ops = {n.strip() for n in (env.get("PADFREE_GENERATION_TORCH_OPS") or "").split(",") if n.strip()}
        for name, symbol in {**ENCODER_OPS, **CONTRACT_OPS}.items():
            reference = getattr(reference_ops, name)
            if force_reference or name in torch_ops:
                self._bind(name, reference, "reference: requested")
                continue
            kernel, reason = _kernel_unavailable(name, symbol, self.device)
            if kernel is not None and name == "attention_varlen":
                problem = kernel_sizes.head_dim_problem(encoder_head_dim)
                if problem:
                    kernel, reason = None, problem
            if kernel is None:
                self._bind(name, reference, f"reference: {reason}")
            else:
                self._bind(name, self._guarded(name, kernel, reference), "kernel")
        for name, symbol in FUSED_OPS.items():
            kernel, reason = ((None, "requested") if force_reference or name in torch_ops
                              else _kernel_unavailable(name, symbol, self.device))
            setattr(self, name, kernel)
            self.sources[name] = "kernel" if kernel is not None else f"reference: {reason} (torch ops)"
        # the torch computation behind log_softmax_topk, for full-vocabulary sampling (no kernel by design)
        self.process_scores = reference_ops.process_scores

    def _bind(self, name: str, fn: Callable, source: str) -> None:
        setattr(self, name, fn)
        self.sources[name] = source
        if source != "kernel":
            log.info("padfree.generation: %s on %s runs the torch %s", name, self.device, source)

    def _refused(self, name: str, error: Exception) -> None:
        """The kernel of `name` refused a configuration: the reference serves it from now on (logged)."""
        log.warning("padfree.generation: %s kernel refused this configuration (%s); using the torch "
                    "reference from now on", name, error)
        self._bind(name, getattr(reference_ops, name), f"reference: kernel refused ({error})")

    def _guarded(self, name: str, kernel: Callable, reference: Callable) -> Callable:
        """kernel, replaced by the reference on its first KernelUnsupportedError (logged)."""
        from .._lib import KernelUnsupportedError

        def call(*args, **kwargs):
            try:
                return kernel(*args, **kwargs)
            except KernelUnsupportedError as e:
                self._refused(name, e)
                return reference(*args, **kwargs)   # the reference takes (and ignores) workspace=
        return call

    def workspace(self, name: str, *sizes: int) -> torch.Tensor | None:
        """A uint8 scratch for op `name`'s kernel at these sizes (self/cross attention: rows, heads,
        head_dim, positions; log_softmax_topk: rows, vocab, k), allocated once by the caller's state so
        that no step allocates (CUDA-graph capture); None where the reference runs or the kernel needs none.
        The size is the one the binding would allocate itself, so the split count, and with it every
        rounding, is the same as a call without it."""
        if self.sources.get(name) != "kernel":
            return None
        from .._lib import KernelUnsupportedError
        from ..ops import decoder as kernels_decoder, decoding as kernels_decoding
        try:
            with torch.cuda.device(self.device):
                if name == "log_softmax_topk":
                    nbytes = kernels_decoding._workspace_bytes(*sizes)
                else:
                    symbol = {"decoder_self_attention": "padfree_decoder_self_attention_workspace_size",
                              "cross_attention": "padfree_decoder_cross_attention_workspace_size"}[name]
                    nbytes = kernels_decoder._workspace_bytes(symbol, torch.cuda.current_device(), *sizes)
        except KernelUnsupportedError as e:   # e.g. a head_dim the kernels are not built for
            self._refused(name, e)
            return None
        if nbytes == 0:
            return None
        return torch.empty(nbytes, dtype=torch.uint8, device=self.device)

    def search_kernel(self, name: str, beams: int = 1, keep: int = 1) -> Callable | None:
        """The search bookkeeping kernel `name` (FUSED_OPS) where it runs and takes these sizes, else None
        (the search runs its torch ops)."""
        kernel = getattr(self, name, None)
        if kernel is None:
            return None
        from ..ops import search
        if beams > search.MAX_BEAMS or keep > search.MAX_KEEP:
            return None
        return kernel

    def fragment_step_rows(self) -> int:
        """The most rows a step multiplies in fragment order (FRAGMENT_STEP_ROWS; PADFREE_FRAGMENT_ROWS)."""
        value = env.get("PADFREE_FRAGMENT_ROWS")
        if value is None:
            return FRAGMENT_STEP_ROWS
        try:
            rows = int(value)
        except ValueError:
            rows = 0
        if not 1 <= rows <= 64:
            raise ValueError(f"PADFREE_FRAGMENT_ROWS: expected a row count in [1, 64], got {value!r}")
        return rows

    def decode_linear_fits(self, rows: int, stack, spec) -> bool:
        """Whether the decoder's step for `rows` hypotheses runs its linear layers as decode_linear (post-LN
        models with a final LayerNorm after the last sublayer's are left to the GEMM path): up to 8 rows
        where the kernel takes every layer's input width; past 8 (tensor cores) where the fragment kernel
        takes the fused QKV projection at this row count (fragments_run) or decode_linear is the faster
        kernel for it (ops.decoder.decode_linear_pays; the layers neither takes are GEMMs:
        Decoder._linear)."""
        if getattr(self, "decode_linear", None) is None or (not spec.pre_ln and stack.final_layer_norm is not None):
            return False
        from ..ops.decoder import DECODE_LINEAR_MAX_ROWS, decode_linear_fits, decode_linear_pays
        dtype = stack.embed_tokens.dtype
        if rows <= DECODE_LINEAR_MAX_ROWS:
            widths = {stack.hidden} | {layer.ffn.fc2_weight.shape[1] for layer in stack.layers}
            return all(decode_linear_fits(rows, width, dtype) for width in widths)
        if self.fragments_run(rows, dtype):
            from ..ops.fragments import fragments_fit
            if fragments_fit(rows, stack.hidden, 3 * stack.hidden, dtype, self.device):
                return True
        return decode_linear_pays(rows, stack.hidden, 3 * stack.hidden, dtype, ln=True)

    def step_linear_choice(self, rows: int, in_features: int, out_features: int, dtype: torch.dtype, *, ln: bool,
                           fragments: bool) -> str | None:
        """How a step of `rows` runs this linear layer: "fragments" (decode_linear on its fragment-order copy,
        where there is one, `fragments`, and past 8 rows where the fragment kernel's shared memory holds
        the rows), "decode_linear" (on the nn.Linear weight, where it is the faster kernel:
        ops.decoder.decode_linear_pays), or None (a GEMM)."""
        from ..ops.decoder import DECODE_LINEAR_MAX_ROWS, decode_linear_pays
        if fragments:
            if rows <= DECODE_LINEAR_MAX_ROWS:
                return "fragments"
            from ..ops.fragments import fragments_fit
            if fragments_fit(rows, in_features, out_features, dtype, self.device, ln=ln):
                return "fragments"
        return "decode_linear" if decode_linear_pays(rows, in_features, out_features, dtype, ln=ln) else None

    def fragments_run(self, rows: int, dtype: torch.dtype) -> bool:
        """Whether a step of `rows` hypotheses multiplies in fragment order (weight_fragments): up to
        fragment_step_rows() rows (the layers whose rows fit the kernel's shared memory; the others are
        GEMMs: Decoder._linear)."""
        return (getattr(self, "fragment_layout", None) is not None and getattr(self, "decode_linear", None) is not None
                and rows <= self.fragment_step_rows() and dtype in (torch.float16, torch.bfloat16))

    def weight_fragments(self, weights, rows: int) -> dict:
        """id(weight) -> its fragment-order copy for each of weights.step_linear_weights() the fragment kernel
        takes (ops.fragments.fragments_fit): made once per weights and kept there (weights.fragments); {}
        where a step of `rows` does not use them (fragments_run)."""
        if not self.fragments_run(rows, weights.dtype):
            return {}
        if weights.fragments is None:
            from ..ops.fragments import fragments_fit
            made = {}
            with torch.cuda.device(self.device):
                for w in weights.step_linear_weights():
                    if fragments_fit(1, w.shape[1], w.shape[0], w.dtype, self.device):
                        made[id(w)] = self.fragment_layout(w)
            weights.fragments = made
        return weights.fragments

    def decode_gemm_layers(self, weights, rows: int) -> list | None:
        """Per decoder layer, its linear layers folded for decode_gemm (GemmLayer), where a step of `rows`
        runs them that way: float16 / bfloat16 on 17-256 rows (DECODE_GEMM_ROWS; fewer run the fragment
        kernel; past 64 where every layer's grid is within two waves of resident blocks; PADFREE_DECODE_GEMM=0
        turns it off, =1 takes it from 1 row and past the waves' bound), pre-LN models and post-LN ones
        without a final LayerNorm (the layers unfolded: Decoder._logits_decode_gemm_post_ln), whose every
        layer decode_gemm takes; else None (GEMMs). Made once per weights and kept there (weights.folded)."""
        from ..ops._tensors import device_properties
        from ..ops.decode_gemm import BLOCKS_PER_SM, TILE_ROWS, decode_gemm_fits, grid_blocks
        choice = env.get("PADFREE_DECODE_GEMM")
        if choice not in (None, "0", "1"):
            raise ValueError(f"PADFREE_DECODE_GEMM: expected 0 or 1, got {choice!r}")
        low = 1 if choice == "1" else DECODE_GEMM_ROWS[0]
        stack = weights.decoder
        post_ln_ok = (not weights.spec.pre_ln and stack.final_layer_norm is None
                      and getattr(self, "skip_layernorm", None) is not None)
        if (getattr(self, "decode_gemm", None) is None or choice == "0"
                or not (weights.spec.pre_ln or post_ln_ok) or not low <= rows <= DECODE_GEMM_ROWS[1]):
            return None
        shapes = {(w.shape[1], w.shape[0]) for w in weights.step_linear_weights()}
        if not all(decode_gemm_fits(rows, k, n, weights.dtype, self.device) for k, n in shapes):
            return None
        if rows > TILE_ROWS and choice != "1":
            # Past 64 rows every 64-row tile is a grid row of its own that reads the layer's weights again.
            # Where a layer's grid passes two waves of resident blocks, those reads and waves cost more than
            # the LayerNorm kernels and cuBLAS boundaries decode_gemm saves (H200, ms/step, cuBLAS ->
            # decode_gemm: Marian-base 32x4 0.356 -> 0.256 and 64x4 0.407 -> 0.331, grids of at most 256
            # blocks; NLLB-600M-size 32x4 0.939 -> 0.911, 512 blocks, and 64x4 1.146 -> 1.400, 1024).
            index = self.device.index if self.device.index is not None else torch.cuda.current_device()
            waves = 2 * BLOCKS_PER_SM * device_properties(index).multi_processor_count
            if max(grid_blocks(rows, k, n) for k, n in shapes) > waves:
                return None
        if weights.folded is None:
            with torch.cuda.device(self.device):
                weights.folded = [GemmLayer.fold(layer, weights.spec.pre_ln) for layer in stack.layers]
        return weights.folded

    def beam_search_workspace(self, batch: int, beams: int, max_length: int,
                              indir_len: int) -> tuple[torch.Tensor, int]:
        """A zeroed workspace for beam_search_step and the offset of the counters the kernel keeps zero."""
        from ..ops import search
        with torch.cuda.device(self.device):
            offset = search.beam_search_workspace(batch, beams, max_length, indir_len)[1]
            return search.new_beam_search_workspace(batch, beams, max_length, indir_len, self.device), offset

    def describe(self) -> str:
        return ", ".join(f"{name}={source}" for name, source in self.sources.items())
