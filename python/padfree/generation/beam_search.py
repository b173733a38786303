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

The state (running hypotheses, the pool, their scores) lives in tensors allocated once per decode
state and updated in place; the step reads the current length from the decoder's device step
counter, so it is capture-safe (one CUDA graph replays every step, runner.py). HF's stop condition
becomes a sticky device flag `done`, which the host reads every few steps without stalling the GPU.
Running past the stop is harmless: HF's stop condition only holds when no pool can change (every
new candidate gets -1e9 added, or no source can improve, or every pool is closed), and the runner
never runs more than max_length - 1 steps.

On CUDA with the kernel library, everything after the top-k (the merge, the running beams, the pool,
the early-stop heuristic, the stop flag, the cache-indirection reorder and the step counter) is one
kernel per step (padfree.ops.beam_search_step) instead of ~90 torch ops; the torch code below is its
reference and runs everywhere else. Both keep the same state tensors.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .decoder import Decoder
from .options import GenerationOptions
from .processors import Processors

__all__ = ["BeamSearchResult", "BeamSearch"]

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


class BeamSearch:
    """Beam search's device state for one decoder state, and its capture-safe step."""

    def __init__(self, decoder: Decoder, options: GenerationOptions, bias: torch.Tensor | None):
        self.decoder, self.options, self.bias = decoder, options, bias
        device = decoder.device
        batch, beams = decoder.batch, options.num_beams
        self.batch, self.beams = batch, beams
        self.keep = options.candidates_per_row * beams          # HF's beams_to_keep
        max_length = options.max_length
        self.eos = torch.tensor(options.eos_token_ids or [-1], dtype=torch.long, device=device)
        self.fill = _fill_value(options)
        self.running = torch.empty((batch, beams, max_length), dtype=torch.long, device=device)
        self.running_scores = torch.empty(batch, beams, device=device)
        self.pool = torch.empty_like(self.running)
        self.pool_scores = torch.empty(batch, beams, device=device)
        self.pool_lengths = torch.empty(batch, beams, dtype=torch.long, device=device)   # generated tokens
        self.pool_finished = torch.empty(batch, beams, dtype=torch.bool, device=device)
        self.improvable = torch.empty(batch, 1, dtype=torch.bool, device=device)
        self.done = torch.empty(1, dtype=torch.bool, device=device)
        self.top_beams = torch.arange(self.keep, device=device) < beams
        self.source_offset = torch.arange(batch, device=device)[:, None] * beams
        self.processors = Processors(options, batch * beams, device)
        self.workspace = decoder.ops.workspace("log_softmax_topk", batch * beams,
                                               decoder.vocab_size, self.keep)
        self.next_tokens = torch.empty(batch * beams, dtype=torch.long, device=device)
        # the one-kernel bookkeeping (padfree.ops.beam_search_step) where it runs, else None
        self.kernel = decoder.ops.search_kernel("beam_search_step", beams, self.keep) \
            if hasattr(decoder.ops, "search_kernel") else None
        if self.kernel is not None:
            # torch's Decoder: its indirection is reordered and its step advanced in the same kernel
            self.indir = decoder.indir if isinstance(decoder, Decoder) else None
            indir_len = 0 if self.indir is None else self.indir.shape[1]
            self.search_workspace, self.counters_at = decoder.ops.beam_search_workspace(batch, beams, max_length,
                                                                                        indir_len)
            self.eos_i32 = self.eos.to(torch.int32) if options.eos_token_ids else None
            self.parents = torch.empty(batch * beams, dtype=torch.int32, device=device)
            self.cand_scores = torch.empty(batch * beams, self.keep, dtype=torch.float32, device=device)
            self.cand_ids = torch.empty(batch * beams, self.keep, dtype=torch.int32, device=device)
        self.reset()

    def reset(self) -> None:
        """The state before the first step (the decoder's own state is reset by Decoder.load)."""
        self.running.fill_(self.fill)
        self.running[:, :, 0] = self.options.decoder_start_token_id
        self.running_scores.zero_()
        self.running_scores[:, 1:] = NEG          # only beam 0's continuations count at the first step
        self.pool.copy_(self.running)
        self.pool_scores.fill_(NEG)
        self.pool_lengths.zero_()
        self.pool_finished.zero_()
        self.improvable.fill_(True)
        self.done.zero_()
        self.next_tokens.fill_(self.options.decoder_start_token_id)
        if self.kernel is not None:   # the kernel keeps its counters zero; a step cut short may not have
            self.search_workspace[self.counters_at:self.counters_at + 16].zero_()

    def step(self) -> None:
        """One step: logits, processors, candidates, the running beams, the pool, the indirection, the
        stop flag, the step counter. Only device tensors change; no value reaches the host."""
        if self.kernel is not None:
            self._kernel_step()
            return
        decoder, options = self.decoder, self.options
        batch, beams, keep = self.batch, self.beams, self.keep
        max_length, lp, early = options.max_length, options.length_penalty, options.early_stopping
        step = decoder.step.long()
        cur_len = step + 1                            # tokens so far, the start token included
        tokens = self.running.index_select(2, step).reshape(-1)
        logits = decoder.logits(tokens)
        processors = self.processors.step(self.running.view(batch * beams, max_length), decoder.step)
        cand_scores, cand_ids = decoder.ops.log_softmax_topk(logits, keep, bias=self.bias,
                                                             beam_scores=self.running_scores.view(-1),
                                                             workspace=self.workspace, **processors.kwargs())
        # merge the beams' candidates: stable sort = flattened (beam, id) order among equal scores
        flat_scores = cand_scores.view(batch, beams * keep)
        order = torch.sort(flat_scores, dim=1, descending=True, stable=True).indices[:, :keep]
        top_scores = torch.gather(flat_scores, 1, order)
        top_parent = torch.div(order, keep, rounding_mode="floor")
        top_tokens = torch.gather(cand_ids.view(batch, beams * keep), 1, order).long()
        top_sequences = _gather(self.running, top_parent)
        top_sequences.index_copy_(2, cur_len, top_tokens.unsqueeze(2))
        hits = (top_tokens.unsqueeze(-1) == self.eos).any(dim=-1) | (cur_len + 1 >= max_length)

        # running beams for the next step: the best num_beams that did not finish
        running_candidates = top_scores + hits.float() * NEG
        next_beams = torch.topk(running_candidates, k=beams).indices     # HF's call, HF's order for ties
        parents = (torch.gather(top_parent, 1, next_beams) + self.source_offset).view(-1).to(torch.int32)

        # the pool: finished candidates among the top num_beams, length-penalised (HF: new tokens ** lp,
        # computed in float64 as HF's Python power is, then rounded to the scores' float32)
        finished_now = hits & self.top_beams[None, :]
        penalised = top_scores / step.add(1).double().pow(lp).float()
        pool_closed = torch.all(self.pool_finished, dim=-1, keepdim=True) & (early is True)
        penalised = penalised + pool_closed.float() * NEG
        penalised = penalised + (~self.improvable).float() * NEG
        penalised = penalised + (~finished_now) * NEG
        merged_scores = torch.cat((self.pool_scores, penalised), dim=1)
        best = torch.topk(merged_scores, k=beams).indices
        self.pool.copy_(_gather(torch.cat((self.pool, top_sequences), dim=1), best))
        self.pool_scores.copy_(torch.gather(merged_scores, 1, best))
        self.pool_lengths.copy_(torch.gather(torch.cat((self.pool_lengths, cur_len.expand_as(top_tokens)), dim=1),
                                             1, best))
        self.pool_finished.copy_(torch.gather(torch.cat((self.pool_finished, finished_now), dim=1), 1, best))
        self.running.copy_(_gather(top_sequences, next_beams))
        self.running_scores.copy_(torch.gather(running_candidates, 1, next_beams))

        decoder.reorder(parents)
        decoder.advance()

        # HF's early-stop heuristic (at the new length cur_len + 1) and stop condition, as a sticky flag
        if early == "never" and lp > 0.0:
            best_running = self.running_scores[:, :1] / ((max_length - 1) ** lp)
        else:
            best_running = self.running_scores[:, :1] / cur_len.double().pow(lp).float()
        worst_pool = torch.where(self.pool_finished, torch.min(self.pool_scores, dim=1, keepdim=True)[0], NEG)
        self.improvable &= torch.any(best_running > worst_pool, dim=-1, keepdim=True)
        open_pool = ~(torch.all(self.pool_finished) & (early is True))
        self.done |= ~(torch.any(self.improvable) & open_pool & ~torch.all(hits))

    def _kernel_step(self) -> None:
        """step() with the bookkeeping in one kernel (same state, same arithmetic as HF on CUDA)."""
        decoder, options = self.decoder, self.options
        logits = decoder.logits(self.next_tokens)
        kwargs = {}
        if self.processors.active:
            history = self.running.view(self.batch * self.beams, options.max_length)
            kwargs = self.processors.step(history, decoder.step).kwargs()
        cand_scores, cand_ids = decoder.ops.log_softmax_topk(logits, self.keep, bias=self.bias,
                                                             beam_scores=self.running_scores.view(-1),
                                                             workspace=self.workspace, out_scores=self.cand_scores,
                                                             out_ids=self.cand_ids, **kwargs)
        self.kernel(cand_scores, cand_ids, self.eos_i32, self.running, self.running_scores, self.pool,
                    self.pool_scores, self.pool_lengths, self.pool_finished, self.improvable.view(-1), self.done,
                    self.next_tokens, self.parents, decoder.step, length_penalty=options.length_penalty,
                    early_stopping=options.early_stopping, workspace=self.search_workspace, cache_indir=self.indir)
        if self.indir is None:     # another decoder backend: its own reorder and step
            decoder.reorder(self.parents)
            decoder.advance()

    def result(self) -> BeamSearchResult:
        """The pool's best num_return_sequences per source (reads the lengths: one host sync). Copies, since
        the state's tensors serve the next call, enqueued before the host waits for the length (the GPU would
        otherwise idle while the host launches them after the wait); after it the columns are cut (one copy:
        a contiguous result, as HF's)."""
        returned = self.options.num_return_sequences
        sequences = self.pool[:, :returned].clone(memory_format=torch.contiguous_format).view(self.batch * returned, -1)
        scores = self.pool_scores[:, :returned].reshape(-1).clone()
        length = 1 + int(self.pool_lengths[:, :returned].max())
        return BeamSearchResult(sequences[:, :length].contiguous(), scores)
