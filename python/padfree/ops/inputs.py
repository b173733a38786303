"""A right-padded batch of integer model inputs on the GPU -> packed int32 inputs, in two calls
around one read-back of three ints (plugins/kernels/inputs.h): padded_input_stats measures and checks
every row, the caller reads the totals to size its buffers (a CUDA graph's bucket), pack_padded_inputs
writes them. The host never reads the padded tensors themselves."""
from __future__ import annotations

import torch

from ._tensors import InputError, call_kernel, check, check_int32, ptr, stream_handle

MASK_BYTES = {torch.bool: 1, torch.uint8: 1, torch.int32: 4, torch.int64: 8}
ID_BYTES = {torch.int32: 4, torch.int64: 8}
# the bits of stats[batch] (PADFREE_INPUT_* in padfree.h)
FLAG_NAMES = {1: "a mask value other than 0 and 1", 2: "a mask row that is not ones then zeros",
              4: "an empty sequence", 8: "a token id out of range", 16: "a token type id out of range"}


def padded_input_stats(input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                       token_type_ids: torch.Tensor | None, vocab_size: int, type_vocab_size: int,
                       out: torch.Tensor | None = None, host_stats: torch.Tensor | None = None) -> torch.Tensor:
    """input_ids [B, S] int32/int64, attention_mask [B, S] bool/uint8/int32/int64 or None (all tokens),
    token_type_ids [B, S] like input_ids or None -> int32 [B + 3]: seqlens [B], then the OR of the
    FLAG_NAMES bits, the total and the longest length. Ids are checked at valid positions only.
    out: an int32 [B + 3] buffer to write instead of a new one. host_stats: a pinned int32 [3] CPU
    tensor that receives a stream-ordered copy of the last three (read it after synchronizing)."""
    check(input_ids, "input_ids", dtype=tuple(ID_BYTES), shape=[None, None])
    shape = list(input_ids.shape)
    check(attention_mask, "attention_mask", dtype=tuple(MASK_BYTES), shape=shape, device=input_ids.device,
          optional=True)
    check(token_type_ids, "token_type_ids", dtype=input_ids.dtype, shape=shape, device=input_ids.device,
          optional=True)
    batch, padded_seqlen = (check_int32(n, f"input_ids: {what}", minimum=1) for n, what in zip(shape, ("batch", "width")))
    if out is None:
        out = torch.empty(batch + 3, dtype=torch.int32, device=input_ids.device)
    check(out, "out", dtype=torch.int32, shape=[batch + 3], device=input_ids.device)
    if host_stats is not None and not (isinstance(host_stats, torch.Tensor) and host_stats.device.type == "cpu"
                                       and host_stats.is_pinned() and host_stats.dtype == torch.int32
                                       and host_stats.shape == (3,) and host_stats.is_contiguous()):
        raise InputError("host_stats: expected a pinned, contiguous int32 CPU tensor of shape [3]")
    mask_bytes = 0 if attention_mask is None else MASK_BYTES[attention_mask.dtype]
    call_kernel("padfree_padded_input_stats", input_ids.device, ptr(attention_mask), mask_bytes, ptr(input_ids),
                ptr(token_type_ids), ID_BYTES[input_ids.dtype], batch, padded_seqlen, int(vocab_size),
                int(type_vocab_size), ptr(out), out.data_ptr() + 4 * batch, ptr(host_stats),
                stream_handle(input_ids.device))
    return out


def pack_padded_inputs(input_ids: torch.Tensor, token_type_ids: torch.Tensor | None, seqlens: torch.Tensor,
                       packed_ids: torch.Tensor, packed_token_type_ids: torch.Tensor | None,
                       cu_seqlens: torch.Tensor) -> None:
    """seqlens (int32 [B], from padded_input_stats) -> cu_seqlens [C + 1] (C >= B; entries past B repeat
    the total), packed_ids [>= total] int32 and packed_token_type_ids likewise where token_type_ids is
    given. Positions past the packed buffers' length are never written."""
    check(input_ids, "input_ids", dtype=tuple(ID_BYTES), shape=[None, None])
    batch, padded_seqlen = input_ids.shape
    device = input_ids.device
    check(token_type_ids, "token_type_ids", dtype=input_ids.dtype, shape=[batch, padded_seqlen], device=device,
          optional=True)
    check(seqlens, "seqlens", dtype=torch.int32, shape=[batch], device=device)
    check(packed_ids, "packed_ids", dtype=torch.int32, shape=[None], device=device)
    check(packed_token_type_ids, "packed_token_type_ids", dtype=torch.int32, shape=[packed_ids.shape[0]],
          device=device, optional=token_type_ids is None)
    check(cu_seqlens, "cu_seqlens", dtype=torch.int32, shape=[None], device=device)
    check_int32(batch, "input_ids: batch", minimum=1)
    check_int32(padded_seqlen, "input_ids: width", minimum=1)
    check_int32(cu_seqlens.shape[0] - 1, "cu_seqlens: capacity", minimum=batch)
    check_int32(packed_ids.shape[0], "packed_ids: length")
    pack_padded_inputs_prechecked(input_ids, token_type_ids, seqlens, packed_ids, packed_token_type_ids, cu_seqlens)


def pack_padded_inputs_prechecked(input_ids: torch.Tensor, token_type_ids: torch.Tensor | None,
                                  seqlens: torch.Tensor, packed_ids: torch.Tensor,
                                  packed_token_type_ids: torch.Tensor | None, cu_seqlens: torch.Tensor) -> None:
    """pack_padded_inputs without its Python-side checks, for a caller that had padded_input_stats
    accept input_ids / token_type_ids and owns the other buffers (padfree.torch's DeviceInputs): the
    checks cost ~30 us per call on a slow host, on the path before a CUDA graph can start. The C ABI
    still checks the sizes, and the kernel writes nothing past the packed buffers."""
    batch, padded_seqlen = input_ids.shape
    call_kernel("padfree_pack_padded_inputs", input_ids.device, input_ids.data_ptr(), ptr(token_type_ids),
                ID_BYTES[input_ids.dtype], seqlens.data_ptr(), batch, padded_seqlen, cu_seqlens.shape[0] - 1,
                packed_ids.shape[0], packed_ids.data_ptr(), ptr(packed_token_type_ids), cu_seqlens.data_ptr(),
                stream_handle(input_ids.device))
