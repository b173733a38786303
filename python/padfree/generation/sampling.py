"""One hypothesis per row: greedy search and multinomial sampling, as HF's GenerationMixin._sample.

The processors act on the raw logits (log_softmax_topk with normalize=False: HF's greedy and sampling
paths never take the log-softmax). Greedy is the top-1. Sampling applies HF's warpers in HF's order
(temperature, top_k, top_p) and draws from the softmax with a torch.Generator on the device, seeded
by the `seed` option or, without one, from torch's global RNG (so torch.manual_seed makes a run
repeatable). With 1 <= top_k <= 64 the kernel's top-k returns the k candidates and the warpers run on
those k values only; otherwise (top_k 0 or > 64) the full processed vocabulary row is warped in torch.
Draws match HF's token for token only on the full-vocabulary path on the CPU (same generator
stream, same probabilities to rounding); the top-k path draws from k entries instead of V.
Finished rows (eos emitted) continue with pad_token_id, as HF's; the host reads "all done?" every
`check_every` steps and the output is cut where HF's would stop.
"""
from __future__ import annotations

import torch

from .decoder import Decoder
from .options import GenerationOptions
from .processors import Processors, StepProcessors
from .reference_ops import MAX_TOPK

__all__ = ["single_search", "make_generator"]


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


def single_search(decoder: Decoder, options: GenerationOptions, bias: torch.Tensor | None,
                  generator: torch.Generator | None = None, check_every: int = 4) -> torch.Tensor:
    """Greedy search (do_sample False) or sampling; returns sequences int64 [rows, output_length]."""
    device = decoder.weights.device
    rows, max_length = decoder.rows, options.max_length
    eos = torch.tensor(options.eos_token_ids or [-1], dtype=torch.long, device=device)
    has_eos = bool(options.eos_token_ids)
    pad = options.pad_token_id if options.pad_token_id is not None else 0
    sequences = torch.full((rows, max_length), pad, dtype=torch.long, device=device)
    sequences[:, 0] = options.decoder_start_token_id
    unfinished = torch.ones(rows, dtype=torch.bool, device=device)
    generated = torch.full((rows,), max_length - 1, dtype=torch.long, device=device)  # new tokens per row
    processors_for = Processors(options, rows, device)
    cur_len = 1
    while cur_len < max_length:
        step = cur_len - 1
        logits = decoder.logits(sequences[:, step], step)
        processors = processors_for.step(sequences[:, :cur_len])
        if options.do_sample:
            tokens = _draw(decoder, logits, processors, options, bias, generator)
        else:
            tokens = decoder.ops.log_softmax_topk(logits, 1, bias=bias, normalize=False,
                                                  **processors.kwargs())[1][:, 0].long()
        if has_eos:
            tokens = torch.where(unfinished, tokens, pad)
            ended = unfinished & torch.isin(tokens, eos)
            generated = torch.where(ended, cur_len, generated)
            unfinished = unfinished & ~ended
        sequences[:, cur_len] = tokens
        cur_len += 1
        if has_eos and cur_len < max_length and (cur_len - 1) % check_every == 0 and not bool(unfinished.any()):
            break
    length = 1 + int(generated.max())
    return sequences[:, :length]
