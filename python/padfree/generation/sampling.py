"""One hypothesis per row: greedy search and multinomial sampling, as HF's GenerationMixin._sample.

The processors act on the raw logits (log_softmax_topk with normalize=False: HF's greedy and sampling
paths never take the log-softmax). Greedy is the top-1. Sampling applies HF's warpers in HF's order
(temperature, top_k, top_p) and draws from the softmax with a torch.Generator on the device, seeded
by the `seed` option or, without one, from torch's global RNG (so torch.manual_seed makes a run
repeatable). With 1 <= top_k <= 64 the kernel's top-k returns the k candidates and the warpers run on
those k values only; otherwise (top_k 0 or > 64) the full processed vocabulary row is warped in torch.
Draws match HF's token for token only on the full-vocabulary path on the CPU (same generator
stream, same probabilities to rounding); the top-k path draws from k entries instead of V.
Finished rows (eos emitted) continue with pad_token_id, as HF's; the host reads the device flag
"all done?" every few steps (runner.py) and the output is cut where HF's would stop. The state lives
in tensors allocated once per decode state and the step reads the length from the decoder's device
step counter, so greedy search is captured as one CUDA graph; sampling runs the same step eagerly
(its torch.Generator is not registered with the graph).
"""
from __future__ import annotations

import torch

from .decoder import Decoder
from .options import GenerationOptions
from .processors import Processors, StepProcessors
from .reference_ops import MAX_TOPK

__all__ = ["SingleSearch", "make_generator"]


def make_generator(device: torch.device, seed: int | None) -> torch.Generator:
    """A torch.Generator on `device`, seeded by `seed` or by a draw from torch's global CPU RNG."""
    if seed is None:
        seed = int(torch.randint(0, 2**62, (1,)))
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator


def _top_p(scores: torch.Tensor, top_p: float) -> torch.Tensor:
    """HF's TopPLogitsWarper (min_tokens_to_keep=1) on fp32 scores [rows, n]."""
    ordered, index = torch.sort(scores, descending=False)
    cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
    remove = cumulative <= (1 - top_p)
    remove[..., -1:] = False
    return scores.masked_fill(remove.scatter(1, index, remove), float("-inf"))


def _draw(decoder: Decoder, logits: torch.Tensor, processors: StepProcessors, options: GenerationOptions,
          bias: torch.Tensor | None, generator: torch.Generator) -> torch.Tensor:
    """The sampled token per row: int64 [rows]."""
    ops = decoder.ops
    ids = None
    if 1 <= options.top_k <= MAX_TOPK:
        scores, ids = ops.log_softmax_topk(logits, options.top_k, bias=bias, normalize=False, **processors.kwargs())
    else:
        scores = ops.process_scores(logits, bias, normalize=False, **processors.kwargs())
    if options.temperature != 1.0:
        scores = scores / options.temperature
    if ids is None and options.top_k > 0:
        kth = torch.topk(scores, min(options.top_k, scores.shape[-1]))[0][..., -1, None]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if options.top_p < 1.0:
        scores = _top_p(scores, options.top_p)
    choice = torch.multinomial(torch.softmax(scores, dim=-1), num_samples=1, generator=generator)
    return (choice if ids is None else torch.gather(ids.long(), 1, choice)).squeeze(1)


class SingleSearch:
    """Greedy search (do_sample False) or sampling: one hypothesis per row, its device state and step."""

    def __init__(self, decoder: Decoder, options: GenerationOptions, bias: torch.Tensor | None):
        self.decoder, self.options, self.bias = decoder, options, bias
        device = decoder.device
        rows, max_length = decoder.rows, options.max_length
        self.eos = torch.tensor(options.eos_token_ids or [-1], dtype=torch.long, device=device)
        self.has_eos = bool(options.eos_token_ids)
        self.pad = options.pad_token_id if options.pad_token_id is not None else 0
        self.sequences = torch.empty((rows, max_length), dtype=torch.long, device=device)
        self.unfinished = torch.empty(rows, dtype=torch.bool, device=device)
        self.generated = torch.empty(rows, dtype=torch.long, device=device)   # new tokens per row
        self.done = torch.empty(1, dtype=torch.bool, device=device)
        self.processors = Processors(options, rows, device)
        self.workspace = None if options.do_sample else decoder.ops.workspace(
            "log_softmax_topk", rows, decoder.vocab_size, 1)
        self.generator: torch.Generator | None = None     # set per call for sampling
        self.next_tokens = torch.empty(rows, dtype=torch.long, device=device)
        # greedy's bookkeeping in one kernel (padfree.ops.greedy_step) where it runs, else the torch ops below
        self.kernel = None
        if not options.do_sample and hasattr(decoder.ops, "search_kernel"):
            self.kernel = decoder.ops.search_kernel("greedy_step")
        if self.kernel is not None:
            self.eos_i32 = self.eos.to(torch.int32) if self.has_eos else None
            self.cand_ids = torch.empty(rows, 1, dtype=torch.int32, device=device)
            self.cand_scores = torch.empty(rows, 1, dtype=torch.float32, device=device)
        self.reset()

    def reset(self) -> None:
        self.sequences.fill_(self.pad)
        self.sequences[:, 0] = self.options.decoder_start_token_id
        self.unfinished.fill_(True)
        self.generated.fill_(self.options.max_length - 1)
        self.done.zero_()
        self.next_tokens.fill_(self.options.decoder_start_token_id)

    def step(self) -> None:
        if self.kernel is not None:
            self._kernel_step()
            return
        decoder, options = self.decoder, self.options
        step = decoder.step.long()
        cur_len = step + 1
        logits = decoder.logits(self.sequences.index_select(1, step).view(-1))
        processors = self.processors.step(self.sequences, decoder.step)
        if options.do_sample:
            tokens = _draw(decoder, logits, processors, options, self.bias, self.generator)
        else:
            tokens = decoder.ops.log_softmax_topk(logits, 1, bias=self.bias, normalize=False, workspace=self.workspace,
                                                  **processors.kwargs())[1].long()
            tokens = tokens.view(-1)
        if self.has_eos:
            tokens = torch.where(self.unfinished, tokens, self.pad)
            ended = self.unfinished & (tokens.unsqueeze(-1) == self.eos).any(dim=-1)
            self.generated.copy_(torch.where(ended, cur_len, self.generated))
            self.unfinished &= ~ended
            self.done.copy_(~self.unfinished.any())
        self.sequences.index_copy_(1, cur_len, tokens.unsqueeze(1))
        decoder.advance()

    def _kernel_step(self) -> None:
        """Greedy step() with the bookkeeping in one kernel (same state and results)."""
        decoder = self.decoder
        logits = decoder.logits(self.next_tokens)
        kwargs = {}
        if self.processors.active:
            kwargs = self.processors.step(self.sequences, decoder.step).kwargs()
        ids = decoder.ops.log_softmax_topk(logits, 1, bias=self.bias, normalize=False, workspace=self.workspace,
                                           out_scores=self.cand_scores, out_ids=self.cand_ids, **kwargs)[1]
        own_step = isinstance(decoder, Decoder)     # torch's Decoder: the kernel advances its step too
        self.kernel(ids, self.eos_i32, self.sequences, self.next_tokens, self.generated, self.unfinished, self.done,
                    decoder.step, pad_token_id=self.pad, advance=own_step)
        if not own_step:
            decoder.advance()

    def result(self) -> torch.Tensor:
        """sequences int64 [rows, output_length] (reads the lengths: one host sync), copied out of the state
        before the host waits (BeamSearch.result says why), the columns cut after it."""
        sequences = self.sequences.clone()
        length = 1 + int(self.generated.max())
        return sequences[:, :length].contiguous()
