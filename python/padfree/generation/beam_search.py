"""Beam search with Hugging Face's bookkeeping (transformers 5, GenerationMixin._beam_search), tensorised.

Per step and source, HF keeps the top K = max(2, 1 + n_eos) * num_beams continuations over
num_beams * vocab. The top K over a source's beams are among the union of each beam's own top K, so
each row asks log_softmax_topk for its K best (the kernel's top-k) and a stable sort over the
source's num_beams * K merges them; the stable order reproduces a topk over the flattened
beam * vocab index for equal scores (lower beam, then lower id).
Then, as HF: candidates that end in eos or reach max_length are "finished"; the best num_beams
unfinished ones run on; finished ones among the top num_beams enter the per-source pool of
num_beams hypotheses with score / (generated length ** length_penalty) (the length counts the new
tokens including eos, not the start token), unless the pool is closed (early_stopping=True and full)
or the early-stop heuristic says no improvement is possible (its best-case length depends on
early_stopping: "never" with length_penalty > 0 assumes max_length). The pool is the output:
sequences padded with pad_token_id (HF's `pad or eos[0]`), sequences_scores its scores.

Everything stays on the device; the host reads one bool ("all done?") every `check_every` steps.
Running past the stop is harmless: HF's stop condition only holds when no pool can change (every
new candidate gets -1e9 added), and steps never exceed max_length.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoder import Decoder
from .options import GenerationOptions
from .processors import Processors

__all__ = ["BeamSearchResult", "beam_search"]

NEG = -1.0e9   # HF's "very large negative" added to scores that must lose


@dataclass
class BeamSearchResult:
    sequences: torch.Tensor   # int64 [batch * num_return_sequences, output_length]
    scores: torch.Tensor      # fp32 [batch * num_return_sequences] (length-penalised, as HF's sequences_scores)


def _gather(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """t [B, N, ...] gathered along dim 1 by index [B, M] (HF's _gather_beams)."""
    while index.dim() < t.dim():
        index = index.unsqueeze(-1)
    return torch.take_along_dim(t, index, dim=1)


def _fill_value(options: GenerationOptions) -> int:
    """HF's `pad_token_id or eos_token_id[0] if eos_token_id is not None else -1` (a pad id of 0 is falsy)."""
    if not options.eos_token_ids:
        return -1
    return options.pad_token_id if options.pad_token_id else options.eos_token_ids[0]


def beam_search(decoder: Decoder, options: GenerationOptions, bias: torch.Tensor | None,
                check_every: int = 4) -> BeamSearchResult:
    """Run beam search on `decoder` (rows = batch * num_beams) to HF's stop condition."""
    ops = decoder.ops
    device = decoder.weights.device
    batch, beams = decoder.sources.batch, options.num_beams
    per_row = options.candidates_per_row
    keep = per_row * beams                     # HF's beams_to_keep
    max_length = options.max_length
    lp, early = options.length_penalty, options.early_stopping
    eos = torch.tensor(options.eos_token_ids or [-1], dtype=torch.long, device=device)
    fill = _fill_value(options)

    running = torch.full((batch, beams, max_length), fill, dtype=torch.long, device=device)
    running[:, :, 0] = options.decoder_start_token_id
    running_scores = torch.zeros(batch, beams, device=device)
    running_scores[:, 1:] = NEG                # only beam 0's continuations count at the first step
    pool = running.clone()
    pool_scores = torch.full((batch, beams), NEG, device=device)
    pool_lengths = torch.zeros(batch, beams, dtype=torch.long, device=device)   # generated tokens
    pool_finished = torch.zeros(batch, beams, dtype=torch.bool, device=device)
    improvable = torch.ones(batch, 1, dtype=torch.bool, device=device)
    top_beams = torch.arange(keep, device=device) < beams
    source_offset = torch.arange(batch, device=device)[:, None] * beams

    processors_for = Processors(options, batch * beams, device)
    cur_len = 1
    while cur_len < max_length:
        step = cur_len - 1
        tokens = running[:, :, step].reshape(-1)
        logits = decoder.logits(tokens, step)
        processors = processors_for.step(running[:, :, :cur_len].reshape(batch * beams, cur_len))
        cand_scores, cand_ids = ops.log_softmax_topk(logits, keep, bias=bias, beam_scores=running_scores.reshape(-1),
                                                     **processors.kwargs())
        # merge the beams' candidates: stable sort = flattened (beam, id) order among equal scores
        flat_scores = cand_scores.view(batch, beams * keep)
        order = torch.sort(flat_scores, dim=1, descending=True, stable=True).indices[:, :keep]
        top_scores = torch.gather(flat_scores, 1, order)
        top_parent = torch.div(order, keep, rounding_mode="floor")
        top_tokens = torch.gather(cand_ids.view(batch, beams * keep).long(), 1, order)
        top_sequences = _gather(running, top_parent)
        top_sequences[:, :, cur_len] = top_tokens
        hits = torch.isin(top_tokens, eos) | (cur_len + 1 >= max_length)

        # running beams for the next step: the best num_beams that did not finish
        running_candidates = top_scores + hits.float() * NEG
        next_beams = torch.topk(running_candidates, k=beams).indices     # HF's call, HF's order for ties
        running = _gather(top_sequences, next_beams)
        running_scores = torch.gather(running_candidates, 1, next_beams)
        parents = (torch.gather(top_parent, 1, next_beams) + source_offset).reshape(-1).to(torch.int32)

        # the pool: finished candidates among the top num_beams, length-penalised
        finished_now = hits & top_beams[None, :]
        penalised = top_scores / ((cur_len + 1 - 1) ** lp)
        pool_closed = torch.all(pool_finished, dim=-1, keepdim=True) & (early is True)
        penalised = penalised + pool_closed.float() * NEG
        penalised = penalised + (~improvable).float() * NEG
        penalised = penalised + (~finished_now) * NEG
        merged_scores = torch.cat((pool_scores, penalised), dim=1)
        best = torch.topk(merged_scores, k=beams).indices
        pool = _gather(torch.cat((pool, top_sequences), dim=1), best)
        pool_scores = torch.gather(merged_scores, 1, best)
        pool_lengths = torch.gather(torch.cat((pool_lengths, torch.full_like(top_tokens, cur_len)), dim=1), 1, best)
        pool_finished = torch.gather(torch.cat((pool_finished, finished_now), dim=1), 1, best)

        decoder.reorder(parents, step)
        cur_len += 1

        # HF's early-stop heuristic and stop condition
        if early == "never" and lp > 0.0:
            best_length = max_length - 1
        else:
            best_length = cur_len - 1
        best_running = running_scores[:, :1] / (best_length ** lp)
        worst_pool = torch.where(pool_finished, torch.min(pool_scores, dim=1, keepdim=True)[0], NEG)
        improvable = improvable & torch.any(best_running > worst_pool, dim=-1, keepdim=True)
        if cur_len < max_length and (cur_len - 1) % check_every == 0:
            open_pool = ~(torch.all(pool_finished) & (early is True))
            if not bool(torch.any(improvable) & open_pool & ~torch.all(hits)):
                break

    returned = options.num_return_sequences
    sequences = pool[:, :returned].reshape(batch * returned, max_length)
    scores = pool_scores[:, :returned].reshape(-1)
    length = 1 + int(pool_lengths[:, :returned].max())
    return BeamSearchResult(sequences[:, :length], scores)
