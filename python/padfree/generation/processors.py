"""HF's logits processors as the id lists log_softmax_topk takes (computed in torch, on the device).

banned_ids: no_repeat_ngram_size, bad_words_ids and the min-length eos ban (all set a score to -inf);
penalty_ids: the tokens repetition_penalty applies to; forced_ids: forced BOS at the first step,
forced EOS at the last (HF applies ForcedEOS after ForcedBOS, so EOS wins where both apply).
`history` is each row's decoder sequence (start token included, as HF's processors see it) over the
state's whole capacity, with the current length a device tensor: fixed shapes, no host value per step.
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
    # the device step where banned_ids / forced_ids are tables over steps ([steps, rows, Q], [steps, rows])
    # that the op reads at the step itself, else None
    step: torch.Tensor | None = None

    def kwargs(self) -> dict:
        kwargs = {"banned_ids": self.banned_ids, "penalty_ids": self.penalty_ids,
                  "repetition_penalty": self.repetition_penalty, "forced_ids": self.forced_ids}
        if self.step is not None:
            kwargs["step"] = self.step
        return kwargs


def _columns(history: torch.Tensor, first: torch.Tensor, count: int) -> torch.Tensor:
    """history[:, first + j] for j < count (int64 [rows, count]); first: int64 [1] on the device, columns
    before 0 read column 0 (callers mask those matches)."""
    index = (first + torch.arange(count, device=history.device)).clamp(min=0)
    return history.index_select(1, index)


def no_repeat_ngram_banned(history: torch.Tensor, cur_len: torch.Tensor, n: int) -> torch.Tensor:
    """int64 [rows, L - n + 1]: tokens that would repeat an n-gram of the row's first cur_len tokens (-1: none).

    HF's NoRepeatNGramLogitsProcessor: every n-gram whose first n-1 tokens equal the last n-1 tokens
    bans its last token. history: [rows, L] (columns from cur_len on are ignored); cur_len: int64 [1]
    on the device, so the shape never depends on the step.
    """
    prefix = _columns(history, cur_len - (n - 1), n - 1)                 # the last n-1 tokens
    windows = history.unfold(1, n, 1)                                  # [rows, L - n + 1, n]
    inside = torch.arange(windows.shape[1], device=history.device) <= cur_len - n   # the n-gram ends before cur_len
    matches = (windows[..., :-1] == prefix.unsqueeze(1)).all(dim=-1) & inside
    return torch.where(matches, windows[..., -1], -1)


def unique_ids(history: torch.Tensor, cur_len: torch.Tensor | None = None) -> torch.Tensor:
    """int32 [rows, L]: each row's distinct tokens among its first cur_len (all where None), repeats and
    the ignored columns replaced by -1 (the kernel may apply a listed id's penalty once per occurrence;
    HF applies it once per id)."""
    if cur_len is not None:
        inside = torch.arange(history.shape[1], device=history.device) < cur_len
        history = torch.where(inside, history, -1)
    ordered = torch.sort(history, dim=1).values
    repeat = torch.zeros_like(ordered, dtype=torch.bool)
    repeat[:, 1:] = ordered[:, 1:] == ordered[:, :-1]
    return ordered.masked_fill(repeat, -1).to(torch.int32)


class Processors:
    """The options' processors for one decode state: constant id tensors moved to the device once (a
    host-to-device copy per step would wait for the GPU), then step() per decode step.

    step() reads the step from the device (cur_len, an int64 [1] tensor) and returns id lists of a
    fixed shape (the whole history's width), so that it can be captured in a CUDA graph: conditions
    such as "cur_len < min_length" become torch.where over constant id tensors, never a host branch.
    Only the options (constant per state) decide which lists exist.
    """

    def __init__(self, options: GenerationOptions, rows: int, device: torch.device):
        self.options, self.rows = options, rows

        def ids(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device).expand(rows, -1)

        self.bad_single = ids(options.bad_words_single) if options.bad_words_single else None
        self.bad_multi = [(torch.tensor(w[:-1], dtype=torch.long, device=device), w[-1])
                          for w in options.bad_words_multi]
        self.eos = ids(options.eos_token_ids) if options.eos_token_ids else None
        self.bad_single_i32 = self.bad_single.to(torch.int32) if self.bad_single is not None else None
        self.eos_i32 = self.eos.to(torch.int32) if self.eos is not None else None
        bos, eos = options.forced_bos_token_id, options.forced_eos_token_id
        self.forced_bos = None if bos is None else torch.full((rows,), bos, dtype=torch.int32, device=device)
        self.forced_eos = None if eos is None else torch.full((rows,), eos, dtype=torch.int32, device=device)
        # The lists that depend on the step alone, one row per step (step s picks token number s + 1):
        # a step gathers its row (one kernel) instead of computing it from the step (a cast, an add, a
        # comparison and a select per list: kernels of a few microseconds each on a step's critical path).
        steps = torch.arange(options.max_length, device=device)
        self.min_length_ban = None      # int32 [max_length, rows, eos ids]: eos while cur_len < min_length
        if self.eos_i32 is not None and options.min_length > 1:     # cur_len >= 1: no ban without min_length > 1
            ban = (steps + 1 < options.min_length)[:, None, None]
            self.min_length_ban = torch.where(ban, self.eos_i32.unsqueeze(0), -1).contiguous()
        self.forced_by_step = None      # int32 [max_length, rows], -1 = none
        if self.forced_bos is not None or self.forced_eos is not None:
            forced = torch.full((options.max_length, rows), -1, dtype=torch.int32, device=device)
            if self.forced_bos is not None:
                forced[0] = self.forced_bos                         # cur_len == 1
            if self.forced_eos is not None and options.max_length >= 2:
                forced[options.max_length - 2] = self.forced_eos    # cur_len == max_length - 1, after BOS: EOS wins
            self.forced_by_step = forced

    @property
    def active(self) -> bool:
        """Whether any processor applies (else step() returns no lists, and callers may skip it)."""
        o = self.options
        return bool(o.no_repeat_ngram_size > 0 or self.bad_single_i32 is not None or self.bad_multi
                    or (self.eos_i32 is not None and o.min_length > 1) or o.repetition_penalty != 1.0
                    or self.forced_bos is not None or self.forced_eos is not None)

    def _bad_words(self, history: torch.Tensor, cur_len: torch.Tensor) -> torch.Tensor:
        """int64 [rows, words]: each multi-token bad word's last token where its prefix ends the history."""
        cols = []
        for prefix, last in self.bad_multi:
            size = prefix.shape[0]
            tail = _columns(history, cur_len - size, size)
            # HF: a prefix longer than the context matches nothing
            match = (tail == prefix).all(dim=-1) & (cur_len >= size)
            cols.append(torch.where(match, last, -1))
        return torch.stack(cols, dim=1)

    def step(self, history: torch.Tensor, step: torch.Tensor) -> StepProcessors:
        """The processors' id lists for the step that picks token number step + 1 (0-based).

        history: int64 [rows, L], each row's decoder sequence (start token first; columns from step + 1
        on are ignored); step: int32 or int64 [1] on the device, 0 <= step < max_length."""
        options = self.options
        cur_len = step.long() + 1 if self._reads_history else None
        banned = []
        if options.no_repeat_ngram_size > 0:
            banned.append(no_repeat_ngram_banned(history, cur_len, options.no_repeat_ngram_size).to(torch.int32))
        if self.bad_single_i32 is not None:
            banned.append(self.bad_single_i32)
        if self.bad_multi:
            banned.append(self._bad_words(history, cur_len).to(torch.int32))
        penalty_ids = unique_ids(history, cur_len) if options.repetition_penalty != 1.0 else None
        # The per-step tables (min-length eos ban, forced BOS / EOS) go to the op whole with the step, which
        # reads the step's row itself: no gather kernel on a captured step's path. A ban joined with this
        # step's other lists is gathered here instead.
        if not banned and step.dtype == torch.int32:
            return StepProcessors(self.min_length_ban, penalty_ids, options.repetition_penalty, self.forced_by_step,
                                  step if self.min_length_ban is not None or self.forced_by_step is not None else None)
        if self.min_length_ban is not None:
            banned.append(self.min_length_ban.index_select(0, step)[0])
        banned_ids = (banned[0] if len(banned) == 1 else torch.cat(banned, dim=1)).contiguous() if banned else None
        forced_ids = None if self.forced_by_step is None else self.forced_by_step.index_select(0, step)[0]
        return StepProcessors(banned_ids, penalty_ids, options.repetition_penalty, forced_ids)

    @property
    def _reads_history(self) -> bool:
        """Whether a processor reads the history (and so needs the current length)."""
        o = self.options
        return o.no_repeat_ngram_size > 0 or bool(self.bad_multi) or o.repetition_penalty != 1.0
