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

__all__ = ["StepProcessors", "Processors", "no_repeat_ngram_banned", "unique_ids"]


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


def unique_ids(history: torch.Tensor) -> torch.Tensor:
    """int32 [rows, cur_len]: each row's distinct tokens, repeats replaced by -1 (the kernel may apply a
    listed id's penalty once per occurrence; HF applies it once per id)."""
    ordered = torch.sort(history, dim=1).values
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return ordered.masked_fill(repeat, -1).to(torch.int32)


class Processors:
    """The options' processors for one generate() call: constant id tensors moved to the device once
    (a host-to-device copy per step would wait for the GPU), then step() per decode step."""

    def __init__(self, options: GenerationOptions, rows: int, device: torch.device):
        self.options, self.rows = options, rows

        def ids(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device).expand(rows, -1)

        self.bad_single = ids(options.bad_words_single) if options.bad_words_single else None
        self.bad_multi = [(torch.tensor(w[:-1], dtype=torch.long, device=device), w[-1])
                          for w in options.bad_words_multi]
        self.eos = ids(options.eos_token_ids) if options.eos_token_ids else None
        self.forced = {value: torch.full((rows,), value, dtype=torch.int32, device=device)
                       for value in (options.forced_bos_token_id, options.forced_eos_token_id) if value is not None}

    def _bad_words(self, history: torch.Tensor) -> torch.Tensor | None:
        """int64 [rows, words]: each multi-token bad word's last token where its prefix ends the history."""
        cur_len = history.shape[1]
        cols = []
        for prefix, last in self.bad_multi:
            if prefix.shape[0] > cur_len:
                continue                    # HF: a prefix longer than the context matches nothing
            match = (history[:, cur_len - prefix.shape[0]:] == prefix).all(dim=-1)
            cols.append(torch.where(match, last, -1))
        return torch.stack(cols, dim=1) if cols else None

    def step(self, history: torch.Tensor) -> StepProcessors:
        """The processors' id lists for the step that picks token number history.shape[1] (0-based)."""
        options = self.options
        cur_len = history.shape[1]
        banned = []
        if options.no_repeat_ngram_size > 0:
            ngram = no_repeat_ngram_banned(history, options.no_repeat_ngram_size)
            if ngram is not None:
                banned.append(ngram)
        if self.bad_single is not None:
            banned.append(self.bad_single)
        if self.bad_multi:
            multi = self._bad_words(history)
            if multi is not None:
                banned.append(multi)
        if self.eos is not None and cur_len < options.min_length:
            banned.append(self.eos)
        banned_ids = torch.cat(banned, dim=1).to(torch.int32).contiguous() if banned else None
        penalty_ids = unique_ids(history) if options.repetition_penalty != 1.0 else None
        forced = None
        if options.forced_eos_token_id is not None and cur_len == options.max_length - 1:
            forced = options.forced_eos_token_id
        elif options.forced_bos_token_id is not None and cur_len == 1:
            forced = options.forced_bos_token_id
        forced_ids = None if forced is None else self.forced[forced]
        return StepProcessors(banned_ids, penalty_ids, options.repetition_penalty, forced_ids)
