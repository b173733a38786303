"""Generation options: the model's generation_config merged with generate()'s keywords as Hugging Face
merges them (transformers 5: GenerationMixin._prepare_generation_config and _prepare_generated_length),
validated, and every option padfree.generation does not implement refused by name.

Refusal is default-deny: a GenerationConfig attribute that is neither implemented (SUPPORTED) nor
known to leave the output unchanged (NO_EFFECT) raises UnsupportedOptionError as soon as it holds
anything but its neutral value, so an option added by a later transformers is refused, not ignored.
Sampling-only options (temperature, top_k, top_p, ...) are read only when do_sample is on, because
HF's greedy and beam search ignore them too.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from dataclasses import dataclass

from ..ops._tensors import InputError
from .models import UnsupportedModelError
from .reference_ops import MAX_TOPK

__all__ = ["GenerationOptions", "UnsupportedOptionError", "resolve_options", "MAX_BEAMS"]

MAX_BEAMS = 16
# options that do not change the decode step (read after the loop, or per call): not in step_key
PER_CALL = ("seed", "return_dict_in_generate", "output_scores")

# implemented (read by resolve_options)
SUPPORTED = {
    "max_length", "max_new_tokens", "min_length", "min_new_tokens", "early_stopping", "do_sample", "num_beams",
    "temperature", "top_k", "top_p", "repetition_penalty", "length_penalty", "no_repeat_ngram_size",
    "bad_words_ids", "forced_bos_token_id", "forced_eos_token_id", "num_return_sequences", "output_scores",
    "return_dict_in_generate", "pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
}
# change nothing in the output of an encoder-decoder generate without an assistant model: HF's cache
# and compilation choices, bookkeeping keys, the assistant's knobs (assistant_model itself is refused)
NO_EFFECT = {
    "use_cache", "cache_implementation", "cache_config", "max_cache_len", "compile_config", "disable_compile",
    "transformers_version", "_from_model_config", "is_assistant", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "assistant_confidence_threshold", "assistant_lookbehind",
    "target_lookbehind", "assistant_ensemble_weight", "speculation_type", "continuous_batching_config",
}
# outputs HF adds to the returned dict where asked; padfree returns none of them
EXTRA_OUTPUTS = ("output_attentions", "output_hidden_states", "output_logits")
# neutral values of options that are not None by default in HF's global defaults
NEUTRAL = {
    "typical_p": 1.0, "epsilon_cutoff": 0.0, "eta_cutoff": 0.0, "encoder_repetition_penalty": 1.0,
    "encoder_no_repeat_ngram_size": 0, "remove_invalid_values": False, "renormalize_logits": False,
    "token_healing": False, "guidance_scale": 1.0, "num_beam_groups": 1, "diversity_penalty": 0.0,
    "low_memory": False, "use_mtp": False, "output_attentions": False, "output_hidden_states": False,
    "output_logits": False,
}
SAMPLING_ONLY = {"min_p", "top_h", "typical_p", "epsilon_cutoff", "eta_cutoff"}
# generate()'s own parameters besides the config keywords; supported only at these values
GENERATE_ARGUMENTS = {
    "logits_processor": None, "stopping_criteria": None, "prefix_allowed_tokens_fn": None, "synced_gpus": None,
    "assistant_model": None, "streamer": None, "negative_prompt_ids": None, "negative_prompt_attention_mask": None,
    "custom_generate": None, "tokenizer": None, "assistant_tokenizer": None,
}


class UnsupportedOptionError(UnsupportedModelError):
    """A generate() option padfree.generation does not implement (an UnsupportedModelError, as at load)."""


@dataclass(frozen=True)
class GenerationOptions:
    """The resolved options of one generate() call (lengths count the decoder start token, as HF's do)."""
    num_beams: int
    do_sample: bool
    max_length: int                  # total decoder length: 1 (start token) + new tokens at most
    min_length: int                  # eos banned while the decoder sequence is shorter than this
    length_penalty: float
    early_stopping: bool | str       # True, False or "never"
    num_return_sequences: int
    no_repeat_ngram_size: int
    repetition_penalty: float
    bad_words_single: list[int]      # banned always
    bad_words_multi: list[list[int]]  # last token banned after its prefix
    forced_bos_token_id: int | None
    forced_eos_token_id: int | None
    eos_token_ids: list[int]         # empty: no eos stopping
    pad_token_id: int | None
    decoder_start_token_id: int
    temperature: float
    top_k: int                       # 0: no top-k filter
    top_p: float
    seed: int | None
    return_dict_in_generate: bool
    output_scores: bool

    @functools.cached_property
    def step_key(self) -> tuple:
        """The options that shape the decode step (all but PER_CALL), hashable: part of a decode state's key.
        Kept on the object: generate() resolves a repeated call's keywords to the same options."""
        def hashable(value):
            return tuple(hashable(v) for v in value) if isinstance(value, list) else value
        return tuple((f.name, hashable(getattr(self, f.name))) for f in dataclasses.fields(self)
                     if f.name not in PER_CALL)

    @property
    def rows_per_source(self) -> int:
        """Hypotheses kept per source: the beams, or the samples drawn (num_return_sequences)."""
        return max(self.num_beams, self.num_return_sequences)

    @property
    def candidates_per_row(self) -> int:
        """HF's beams_to_keep / num_beams: top candidates kept per hypothesis and per source."""
        return max(2, 1 + len(self.eos_token_ids))


def _ids(value, name: str) -> list[int]:
    if value is None:
        return []
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, int):
        return [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, int) for v in value):
        return list(value)
    raise InputError(f"{name}: expected an int or a list of ints, got {value!r}")


def _refuse(name: str, value, why: str = "") -> UnsupportedOptionError:
    return UnsupportedOptionError(
        f"generate option {name}={value!r} is not implemented by padfree.generation{': ' + why if why else ''}; "
        f"remove it, or use Hugging Face's generate for this call")


def _is_neutral(name: str, value) -> bool:
    if value is None:
        return True
    if name in NEUTRAL:
        return value == NEUTRAL[name]
    return False


def resolve_options(model_generation_config, model_config, vocab_size: int, generation_config=None,
                    **kwargs) -> GenerationOptions:
    """HF's option resolution, then padfree's checks.

    model_generation_config: the model's GenerationConfig; generation_config: one passed to
    generate() (or None); kwargs: generate()'s other keywords (HF's names). padfree extension:
    seed (int) for sampling. Raises UnsupportedOptionError naming an option it does not implement,
    ValueError (HF's own validation) or InputError for a bad value.
    """
    from transformers import GenerationConfig

    seed = kwargs.pop("seed", None)
    for name, neutral in GENERATE_ARGUMENTS.items():
        if name in kwargs:
            value = kwargs.pop(name)
            if value is not neutral and not (name == "synced_gpus" and value is False):
                raise _refuse(name, value, "generate() arguments other than the generation config's are not")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise InputError(f"seed: expected an int, got {seed!r}")

    # transformers 5's merge: an explicit config, else an empty one; then the model's values where
    # unset, then the global defaults where still unset, then the keywords
    has_default_max_length = (kwargs.get("max_length") is None
                              and (generation_config is None or generation_config.max_length is None)
                              and model_generation_config.max_length is None)
    config = copy.deepcopy(generation_config) if generation_config is not None else GenerationConfig()
    global_defaults = model_generation_config._get_default_generation_params()
    config.update(**model_generation_config.to_dict(), defaults_only=True, allow_custom_entries=True)
    config.update(**global_defaults, defaults_only=True)
    unused = config.update(**kwargs)
    if unused:
        name = sorted(unused)[0]
        raise _refuse(name, unused[name], "not a generation option padfree knows (HF would pass it to the "
                                          "model's forward: decoder prompts, encoder outputs, ... are not supported)")
    config.validate()   # HF's errors: num_return_sequences > num_beams, greedy with several sequences, ...

    do_sample = bool(config.do_sample)
    for name, value in config.to_dict().items():
        if name in SUPPORTED or name in NO_EFFECT:
            continue
        if name in EXTRA_OUTPUTS:
            if value and config.return_dict_in_generate:
                raise _refuse(name, value, "padfree returns sequences and sequences_scores only")
            continue
        if name in SAMPLING_ONLY and not do_sample:
            continue        # HF ignores it without do_sample
        if not _is_neutral(name, value):
            raise _refuse(name, value)

    num_beams = int(config.num_beams)
    if not 1 <= num_beams <= MAX_BEAMS:
        raise InputError(f"num_beams: expected 1 to {MAX_BEAMS}, got {num_beams}")
    if do_sample and num_beams > 1:
        raise _refuse("do_sample", True, f"beam sampling (do_sample with num_beams={num_beams} > 1) is not")
    if config.output_scores and config.return_dict_in_generate and num_beams == 1:
        raise _refuse("output_scores", True, "per-step scores are not returned (with num_beams > 1, output_scores "
                                             "returns sequences_scores)")

    eos = _ids(config.eos_token_id, "eos_token_id")
    pad = config.pad_token_id
    if pad is None and eos:
        pad = eos[0]                        # HF: pad defaults to the first eos
    start = config.decoder_start_token_id
    if start is None:
        start = config.bos_token_id
    if start is None:
        raise ValueError("`decoder_start_token_id` or `bos_token_id` has to be defined for encoder-decoder generation.")
    if isinstance(start, (list, tuple)):
        raise _refuse("decoder_start_token_id", start, "one start token per batch is supported, not a list")
    if max(2, 1 + len(eos)) * num_beams > MAX_TOPK:
        raise _refuse("eos_token_id", eos, f"(1 + {len(eos)} eos ids) * num_beams={num_beams} candidates per "
                                           f"hypothesis exceed the top-k kernel's {MAX_TOPK}")

    forced_eos = config.forced_eos_token_id
    if isinstance(forced_eos, (list, tuple)):
        if len(forced_eos) != 1:
            raise _refuse("forced_eos_token_id", forced_eos, "one forced eos id is supported, not several")
        forced_eos = forced_eos[0]

    # lengths (HF's _prepare_generated_length with a one-token decoder prompt)
    prompt = 1
    if config.max_new_tokens is not None:
        max_length = config.max_new_tokens + prompt
    elif has_default_max_length:
        max_length = config.max_length + prompt
        positions = getattr(model_config, "max_position_embeddings", None)
        if positions is not None:
            max_length = min(max_length, positions)
    else:
        max_length = config.max_length
    if prompt >= max_length:
        raise ValueError(f"Input length of decoder_input_ids is {prompt}, but `max_length` is set to {max_length}. "
                         f"This can lead to unexpected behavior. You should consider increasing `max_length` or, "
                         f"better yet, setting `max_new_tokens`.")
    min_length = config.min_new_tokens + prompt if config.min_new_tokens is not None else int(config.min_length or 0)

    bad_single, bad_multi = [], []
    if config.bad_words_ids is not None:
        words = config.bad_words_ids
        if not isinstance(words, list) or not words or any(not isinstance(w, list) or not w for w in words):
            raise ValueError(f"`bad_words_ids` has to be a non-empty list of non-empty lists, but is {words}.")
        for word in words:
            if word in [[e] for e in eos]:
                continue                    # HF's NoBadWordsLogitsProcessor drops [eos] words
            (bad_single.append(word[0]) if len(word) == 1 else bad_multi.append(list(word)))

    for name, ids in (("bad_words_ids", bad_single + [t for w in bad_multi for t in w]), ("eos_token_id", eos),
                      ("forced_bos_token_id", _ids(config.forced_bos_token_id, "forced_bos_token_id")),
                      ("forced_eos_token_id", _ids(forced_eos, "forced_eos_token_id")),
                      ("decoder_start_token_id", [start])):
        bad = [i for i in ids if not 0 <= i < vocab_size]
        if bad:
            raise InputError(f"{name}: ids {bad} are outside the model's vocabulary [0, {vocab_size})")

    top_k = int(config.top_k or 0) if do_sample else 0
    if do_sample and top_k < 0:
        raise InputError(f"top_k: expected >= 0, got {top_k}")
    temperature = float(config.temperature) if do_sample else 1.0
    if do_sample and not temperature > 0:
        raise InputError(f"temperature: expected > 0 (for greedy decoding set do_sample=False), got {temperature}")
    top_p = float(config.top_p) if do_sample else 1.0
    if do_sample and not 0 <= top_p <= 1:
        raise InputError(f"top_p: expected in [0, 1], got {top_p}")
    repetition_penalty = float(config.repetition_penalty)
    if not repetition_penalty > 0:
        raise InputError(f"repetition_penalty: expected > 0, got {repetition_penalty}")
    early_stopping = config.early_stopping
    if early_stopping not in (True, False, "never"):
        raise ValueError(f"`early_stopping` must be a boolean or 'never', but is {early_stopping}.")

    return GenerationOptions(
        num_beams=num_beams, do_sample=do_sample, max_length=int(max_length), min_length=int(min_length),
        length_penalty=float(config.length_penalty), early_stopping=early_stopping,
        num_return_sequences=int(config.num_return_sequences),
        no_repeat_ngram_size=int(config.no_repeat_ngram_size or 0), repetition_penalty=repetition_penalty,
        bad_words_single=bad_single, bad_words_multi=bad_multi, forced_bos_token_id=config.forced_bos_token_id,
        forced_eos_token_id=forced_eos, eos_token_ids=eos, pad_token_id=pad, decoder_start_token_id=int(start),
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed,
        return_dict_in_generate=bool(config.return_dict_in_generate), output_scores=bool(config.output_scores))
