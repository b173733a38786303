"""HF's logits processors as the id lists log_softmax_topk takes (computed in torch, on the device).

banned_ids: no_repeat_ngram_size, bad_words_ids and the min-length eos ban (all set a score to -inf);
penalty_ids: the tokens repetition_penalty applies to; forced_ids: forced BOS at the first step,
forced EOS at the last (HF applies ForcedEOS after ForcedBOS, so EOS wins where both apply).
`history` is each row's decoder sequence so far, start token included, as HF's processors see it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .options import GenerationOptions

__all__ = ["StepProcessors", "step_processors", "no_repeat_ngram_banned", "unique_ids"]


@dataclass
class StepProcessors:
    """The keyword arguments of one log_softmax_topk call besides logits, k, bias and beam_scores."""
    banned_ids: torch.Tensor | None     # int32 [rows, Q], -1 = unused
    penalty_ids: torch.Tensor | None    # int32 [rows, P], -1 = unused, each id at most once per row
    repetition_penalty: float
    forced_ids: torch.Tensor | None     # int32 [rows], -1 = none

    def kwargs(self) -> dict:
        return {"banned_ids": self.banned_ids, "penalty_ids": self.penalty_ids,
                "repetition_penalty": self.repetition_penalty, "forced_ids": self.forced_ids}


def no_repeat_ngram_banned(history: torch.Tensor, n: int) -> torch.Tensor | None:
    """int64 [rows, cur_len - n + 1]: tokens that would repeat an n-gram of the row's history (-1: none).

    HF's NoRepeatNGramLogitsProcessor: every n-gram whose first n-1 tokens equal the last n-1 tokens
    bans its last token.
    """
    cur_len = history.shape[1]
    if cur_len < n:
        return None
    prefix = history[:, cur_len + 1 - n:]
    windows = history.unfold(1, n, 1)                                  # [rows, cur_len - n + 1, n]
    matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(dim=-1)
    return torch.where(matches, windows[..., -1], torch.full_like(windows[..., -1], -1))


def _bad_words_banned(history: torch.Tensor, words: list[list[int]]) -> torch.Tensor | None:
    """int64 [rows, len(words)]: each multi-token bad word's last token where its prefix ends the history."""
    cur_len = history.shape[1]
    cols = []
    for word in words:
        prefix = word[:-1]
        if len(prefix) > cur_len:
            continue                        # HF: a prefix longer than the context matches nothing
        want = torch.tensor(prefix, dtype=history.dtype, device=history.device)
        match = (history[:, cur_len - len(prefix):] == want).all(dim=-1)
        cols.append(torch.where(match, word[-1], -1))
    return torch.stack(cols, dim=1) if cols else None


def unique_ids(history: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cur_len]: each row's distinct tokens, repeats replaced by -1 (the kernel may apply a
    listed id's penalty once per occurrence; HF applies it once per id)."""
    ordered = torch.sort(history, dim=1).values
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return ordered.masked_fill(repeat, -1).to(torch.int32)


def step_processors(history: torch.Tensor, options: GenerationOptions) -> StepProcessors:
    """The processors' id lists for the step that picks token number history.shape[1] (0-based)."""
    rows, cur_len = history.shape
    device = history.device
    banned = []
    if options.no_repeat_ngram_size > 0:
        ngram = no_repeat_ngram_banned(history, options.no_repeat_ngram_size)
        if ngram is not None:
            banned.append(ngram)
    if options.bad_words_single:
        banned.append(torch.tensor(options.bad_words_single, dtype=torch.long, device=device).expand(rows, -1))
    if options.bad_words_multi:
        multi = _bad_words_banned(history, options.bad_words_multi)
        if multi is not None:
            banned.append(multi)
    if options.eos_token_ids and cur_len < options.min_length:
        banned.append(torch.tensor(options.eos_token_ids, dtype=torch.long, device=device).expand(rows, -1))
    banned_ids = torch.cat(banned, dim=1).to(torch.int32).contiguous() if banned else None

    penalty_ids = unique_ids(history) if options.repetition_penalty != 1.0 else None

    forced = None
    if options.forced_eos_token_id is not None and cur_len == options.max_length - 1:
        forced = options.forced_eos_token_id
    elif options.forced_bos_token_id is not None and cur_len == 1:
        forced = options.forced_bos_token_id
    forced_ids = None if forced is None else torch.full((rows,), forced, dtype=torch.int32, device=device)
    return StepProcessors(banned_ids, penalty_ids, options.repetition_penalty, forced_ids)
