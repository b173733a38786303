"""Pure-torch implementation of the decoder kernel contract (docs/DECODER_OPS.md).

Same names, arguments, shapes and semantics as the CUDA kernels in padfree.ops; this module is the
CPU path of padfree.generation and the reference the GPU tests compare the kernels against. It runs
on any device (CPU or CUDA tensors) and never synchronizes with the host when `step` is a CUDA
tensor: it then computes over the whole cache capacity L with a mask instead of slicing to `step`
(O(L) per call instead of O(step), the price of staying sync-free; on the CPU, where reading the
step is free, it slices).

Shapes: rows = batch * num_beams hypotheses (row r belongs to source r // num_beams), H heads of D
dims (hidden = H * D), T packed source tokens, L the cache capacity, V the vocabulary.
Activations and caches share one dtype per call (float32, float16 or bfloat16); math in float32.
Every function takes `out=` (a preallocated output, written in place and returned); the three the
kernels give a `workspace=` take it too and ignore it, so callers pass one either way.
"""
from __future__ import annotations

import math

import torch

__all__ = ["attention_varlen", "decoder_self_attention", "beam_reorder_cache_indir", "cross_attention",
           "log_softmax_topk", "process_scores", "topk_smaller_id_first", "MAX_TOPK"]

MAX_TOPK = 64  # the contract's bound on log_softmax_topk's k


def _scale(softmax_scale: float | None, head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)


def _write(out: torch.Tensor | None, value: torch.Tensor) -> torch.Tensor:
    """value cast into `out` (allocated when None) and returned."""
    if out is None:
        return value.contiguous()
    out.copy_(value)
    return out


def _host_step(step: int | torch.Tensor) -> int | None:
    """The step as a Python int when reading it costs no device sync (an int or a CPU tensor), else None."""
    if isinstance(step, int):
        return step
    if step.device.type == "cpu":
        return int(step.reshape(-1)[0])
    return None


def attention_varlen(qkv: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, num_heads: int,
                     qkv_bias: torch.Tensor | None = None, softmax_scale: float | None = None,
                     out: torch.Tensor | None = None, *, causal: bool = False) -> torch.Tensor:
    """Bidirectional (or causal) self-attention per packed sequence, as padfree.ops.attention_varlen.

    qkv: [T, 3*hidden] (Q | K | V blocks, bias not added: qkv_bias [3*hidden] or None);
    cu_seqlens: int32 [batch+1]. Returns [T, hidden]. The encoder's attention on the CPU path.
    """
    total, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // num_heads
    x = qkv.float()
    if qkv_bias is not None:
        x = x + qkv_bias.float()
    batch = cu_seqlens.numel() - 1
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens[1:].long() - starts
    pos = torch.arange(max_seqlen, device=qkv.device)
    valid = pos[None, :] < lengths[:, None]                                  # [batch, S]
    idx = (starts[:, None] + pos[None, :]).clamp(max=max(total - 1, 0))      # [batch, S]
    q, k, v = x[idx].view(batch, max_seqlen, 3, num_heads, head_dim).unbind(2)  # each [batch, S, H, D]
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k) * _scale(softmax_scale, head_dim)
    mask = valid[:, None, None, :]
    if causal:
        mask = mask & (pos[None, :] <= pos[:, None])[None, None]
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)   # rows past a sequence's end: all masked
    o = torch.einsum("bhqk,bkhd->bqhd", probs, v).reshape(batch * max_seqlen, hidden)
    # each packed row from its (sequence, position) slot: a gather of fixed shape (no boolean indexing,
    # whose data-dependent size syncs with the host), so that the op can be captured in a CUDA graph;
    # rows past cu_seqlens[-1] keep what `out` held
    result = torch.empty(total, hidden, dtype=qkv.dtype, device=qkv.device) if out is None else out
    if batch == 0 or max_seqlen == 0 or total == 0:
        return result
    rows = torch.arange(total, device=qkv.device)
    seq = torch.searchsorted(cu_seqlens[1:].long(), rows, right=True).clamp(max=batch - 1)
    slot = seq * max_seqlen + (rows - starts[seq]).clamp(0, max_seqlen - 1)
    packed = o.index_select(0, slot).to(result.dtype)
    result.copy_(torch.where((rows < cu_seqlens[-1].long())[:, None], packed, result))
    return result


def decoder_self_attention(qkv: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                           cache_indir: torch.Tensor, step: int | torch.Tensor, num_heads: int,
                           qkv_bias: torch.Tensor | None = None, softmax_scale: float | None = None,
                           out: torch.Tensor | None = None, *, workspace: torch.Tensor | None = None,
                           state_ready: bool = False) -> torch.Tensor:
    """One decode step of causal self-attention over the K/V cache, through the cache indirection.

    qkv [rows, 3*hidden]: this step's fused projection (bias not added; qkv_bias [3*hidden] or None).
    k_cache, v_cache [rows, H, L, D]: this call writes the step's K, V (bias added) into [r, :, step, :].
    cache_indir int32 [rows, L]: for t < step, the row whose cache slot holds position t of row r's
    history; position `step` is r's own slot. step: int32 tensor [1] (or int), 0 <= step < L.
    state_ready: the kernel's scheduling promise (ops.decoder_self_attention); no effect here.
    Returns [rows, hidden]: softmax(q . K[0..step] * softmax_scale) V per head.
    """
    rows, width = qkv.shape
    hidden = width // 3
    head_dim = hidden // num_heads
    capacity = k_cache.shape[2]
    x = qkv.float()
    if qkv_bias is not None:
        x = x + qkv_bias.float()
    q, k, v = x.view(rows, 3, num_heads, head_dim).unbind(1)                # each [rows, H, D]
    own = torch.arange(rows, device=qkv.device)
    host = _host_step(step)
    if host is not None:
        k_cache[:, :, host, :] = k.to(k_cache.dtype)
        v_cache[:, :, host, :] = v.to(v_cache.dtype)
        n = host + 1
        t = torch.arange(n, device=qkv.device)
        src = cache_indir[:, :n].long().clone()
        src[:, host] = own
        valid = None
    else:
        step_l = step.reshape(1).long()
        k_cache.index_copy_(2, step_l, k.to(k_cache.dtype).unsqueeze(2))
        v_cache.index_copy_(2, step_l, v.to(v_cache.dtype).unsqueeze(2))
        t = torch.arange(capacity, device=qkv.device)
        # slots past `step` may hold anything (stale rows): clamp them into range, then mask them
        src = torch.where(t[None, :] == step_l, own[:, None], cache_indir.long().clamp(0, rows - 1))
        valid = t <= step_l                                                  # [L]
    # keys[r, t] = k_cache[src[r, t], :, t, :]  -> [rows, n, H, D]
    keys = k_cache[src, :, t[None, :].expand_as(src)].float()
    values = v_cache[src, :, t[None, :].expand_as(src)].float()
    scores = torch.einsum("rhd,rthd->rht", q, keys) * _scale(softmax_scale, head_dim)
    if valid is not None:
        scores = scores.masked_fill(~valid[None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return _write(out, torch.einsum("rht,rthd->rhd", probs, values).reshape(rows, hidden).to(qkv.dtype))


def beam_reorder_cache_indir(cache_indir: torch.Tensor, parents: torch.Tensor, step: int | torch.Tensor,
                             out: torch.Tensor) -> torch.Tensor:
    """out[r, t] = cache_indir[parents[r], t] for t < step; out[r, step] = parents[r].

    cache_indir, out: int32 [rows, L] (out must not alias cache_indir: ping-pong two buffers);
    parents: int32 [rows], the row each new hypothesis continues. Columns past `step` are copied too
    (their content is never read: every reader masks positions past its own step).
    """
    if out.data_ptr() == cache_indir.data_ptr():
        raise ValueError("beam_reorder_cache_indir: out must not alias cache_indir (ping-pong two buffers)")
    out.copy_(cache_indir.index_select(0, parents.long()))
    host = _host_step(step)
    if host is not None:
        out[:, host] = parents.to(out.dtype)
    else:
        out.index_copy_(1, step.reshape(1).long(), parents.to(out.dtype).view(-1, 1))
    return out


def cross_attention(q: torch.Tensor, kv_mem: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int,
                    num_beams: int, num_heads: int, q_bias: torch.Tensor | None = None,
                    softmax_scale: float | None = None, out: torch.Tensor | None = None, *,
                    workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Each hypothesis attends over its source's packed encoder rows.

    q [rows, hidden] (q_bias [hidden] or None); kv_mem [T, 2*hidden] (K block | V block, bias added);
    cu_seqlens int32 [batch+1]; hypothesis r reads rows cu_seqlens[s]..cu_seqlens[s+1]-1 with
    s = r // num_beams (the beams of one source share its rows: gathered once per source here, never
    per beam). Returns [rows, hidden].
    """
    rows, hidden = q.shape
    head_dim = hidden // num_heads
    batch = cu_seqlens.numel() - 1
    x = q.float()
    if q_bias is not None:
        x = x + q_bias.float()
    x = x.view(batch, num_beams, num_heads, head_dim)
    starts = cu_seqlens[:-1].long()
    lengths = cu_seqlens[1:].long() - starts
    pos = torch.arange(max_seqlen, device=q.device)
    valid = pos[None, :] < lengths[:, None]                                           # [batch, S]
    idx = (starts[:, None] + pos[None, :]).clamp(max=kv_mem.shape[0] - 1)
    kv = kv_mem[idx].float().view(batch, max_seqlen, 2, num_heads, head_dim)
    keys, values = kv.unbind(2)                                                       # [batch, S, H, D]
    scores = torch.einsum("bnhd,bshd->bnhs", x, keys) * _scale(softmax_scale, head_dim)
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    o = torch.einsum("bnhs,bshd->bnhd", probs, values).reshape(rows, hidden)
    return _write(out, o.to(q.dtype))


def _id_mask(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """bool [rows, V]: True where v is in ids[r] (int [rows, Q], -1 = unused)."""
    rows = ids.shape[0]
    cols = torch.where(ids < 0, torch.full_like(ids, vocab), ids).long()
    mask = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=ids.device)
    mask.scatter_(1, cols, True)
    return mask[:, :vocab]


def step_lists(banned_ids: torch.Tensor | None, forced_ids: torch.Tensor | None,
               step: torch.Tensor | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """This step's banned / forced lists: the tables' row at step (clamped to the tables) where step is given
    (banned_ids [steps, rows, Q], forced_ids [steps, rows]), else the lists as given."""
    if step is None:
        return banned_ids, forced_ids

    def row(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.index_select(0, step.long().clamp(0, t.shape[0] - 1))[0]
    return row(banned_ids), row(forced_ids)


def process_scores(logits: torch.Tensor, bias: torch.Tensor | None = None,
                   beam_scores: torch.Tensor | None = None, banned_ids: torch.Tensor | None = None,
                   penalty_ids: torch.Tensor | None = None, repetition_penalty: float = 1.0,
                   forced_ids: torch.Tensor | None = None, normalize: bool = True, *,
                   step: torch.Tensor | None = None) -> torch.Tensor:
    """The contract's per-row scores before the top-k: float32 [rows, V].

    x = logits + bias; s = log_softmax(x) (normalize=False: s = x); then in HF's processor order:
    repetition penalty on penalty_ids (each id once, as HF's gather/scatter does), -inf on banned_ids,
    forcing (all -inf but forced_ids[r], which gets 0) where forced_ids[r] >= 0; s += beam_scores.
    With step, banned_ids and forced_ids are tables over steps (step_lists).
    """
    banned_ids, forced_ids = step_lists(banned_ids, forced_ids, step)
    s = logits.float()
    if bias is not None:
        s = s + bias.float()
    if normalize:
        s = torch.log_softmax(s, dim=-1)
    vocab = s.shape[-1]
    if penalty_ids is not None and repetition_penalty != 1.0:
        hit = _id_mask(penalty_ids, vocab)
        penalised = torch.where(s < 0, s * repetition_penalty, s / repetition_penalty)
        s = torch.where(hit, penalised, s)
    if banned_ids is not None:
        s = s.masked_fill(_id_mask(banned_ids, vocab), float("-inf"))
    if forced_ids is not None:
        forced = forced_ids.long()
        is_forced = forced >= 0
        onehot = torch.nn.functional.one_hot(forced.clamp(min=0), vocab).bool()
        forced_row = torch.zeros_like(s).masked_fill(~onehot, float("-inf"))
        s = torch.where(is_forced[:, None], forced_row, s)
    if beam_scores is not None:
        s = s + beam_scores.float()[:, None]
    return s


def topk_smaller_id_first(s: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest entries of each row of float32 s [rows, V], descending, ties -> smaller id first.

    torch.topk leaves the order of equal values unspecified; the contract fixes it, so the key is
    exact: the float's bits mapped to an order-preserving int32, shifted up 32 bits, with (V-1-id)
    below them (one int64 topk, no sort of the whole row). Returns (scores fp32 [rows, k], ids int32).
    """
    vocab = s.shape[-1]
    s = s + 0.0                                           # -0.0 -> +0.0: equal floats, equal keys
    bits = s.view(torch.int32)
    ordered = torch.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).long()
    ids = torch.arange(vocab, device=s.device, dtype=torch.long)
    key = (ordered << 32) | (vocab - 1 - ids)[None, :]
    top = torch.topk(key, k, dim=-1).values
    top_ids = vocab - 1 - (top & 0xFFFFFFFF)
    return torch.gather(s, 1, top_ids), top_ids.to(torch.int32)


def log_softmax_topk(logits: torch.Tensor, k: int, bias: torch.Tensor | None = None,
                     beam_scores: torch.Tensor | None = None, banned_ids: torch.Tensor | None = None,
                     penalty_ids: torch.Tensor | None = None, repetition_penalty: float = 1.0,
                     forced_ids: torch.Tensor | None = None, out_scores: torch.Tensor | None = None,
                     out_ids: torch.Tensor | None = None, normalize: bool = True, *,
                     workspace: torch.Tensor | None = None,
                     step: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row: the k best continuations after log_softmax and the logits processors.

    logits [rows, V] (any of the dtypes); bias [V] or None (Marian/BART's final_logits_bias);
    beam_scores fp32 [rows] or None; banned_ids / penalty_ids int32 [rows, Q] (-1 = unused);
    forced_ids int32 [rows] (-1 = none); with step, both are tables over steps (step_lists). 1 <= k <= 64.
    Returns (scores fp32 [rows, k] descending, ids int32 [rows, k]); ties -> smaller id first.
    """
    if not 1 <= k <= MAX_TOPK:
        raise ValueError(f"log_softmax_topk: k must be in [1, {MAX_TOPK}], got {k}")
    s = process_scores(logits, bias, beam_scores, banned_ids, penalty_ids, repetition_penalty, forced_ids,
                       normalize, step=step)
    scores, ids = topk_smaller_id_first(s, k)
    return _write(out_scores, scores), _write(out_ids, ids)
