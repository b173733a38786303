"""CTranslate2, the generation peer of bench/generate.py: conversion of a random-weight HF Marian / M2M100
model and the translate_batch call that produces HF generate's output.

Vocabulary. CTranslate2's TransformersConverter reads the vocabulary and the special tokens from the
model's tokenizer (AutoTokenizer.from_pretrained; its Bart/Marian/M2M100 loaders read get_vocab(),
eos/bos/unk_token, convert_ids_to_tokens(decoder_start_token_id), unk_token_id, special_tokens_map).
A random-weight model has none, so `RandomWeightConverter.load_tokenizer` returns a stand-in that names
every id "t<id>", with the family's special tokens at the config's ids (eos "</s>", pad "<pad>", bos
"<s>", "<unk>" at the first other id, as in the released vocabularies). Sources go to CT2 as those
names and its output comes back through the same table, so ids are HF's ids.

Start token (CTranslate2 4.x, converters/transformers.py and src/layers/transformer.cc):
- Marian: CT2 starts the decoder from a zero embedding (`start_from_zero_embedding`, no embedding
  scale at step 0); HF starts from decoder_start_token_id = pad, whose embedding row is zero: the same
  input. CT2 drops the "<pad>" row (the last id) from the vocabulary and the output projection, so
  the config's pad must be the last id (CT2 never generates it; HF's pad logit is 0, from the zero
  row of the tied head, never the winner on these models).
- M2M100 / NLLB: CT2 starts from the token named by decoder_start_token_id (</s>, id 2), as HF. The
  benchmark's configs have no forced_bos_token_id (no target-language token), so neither side gets
  a target prefix; a config with one is refused rather than half matched.
Lengths (src/decoding.cc): max_decoding_length counts generated tokens without the start token, and
CT2 never forces an end token (its last step is a free pick; min_decoding_length bans the end token
for the steps before it). HF's forced_eos_token_id (Marian) makes HF's last new token eos whatever
the logits say, so CT2 runs max_new_tokens - 1 steps and the eos is appended, which is what HF's
last step produces: the same output, CT2 running one decoder step fewer (in its favour, <= 1/64 of
the decode at 64 tokens). return_end_token=True keeps an eos CT2 generates, as HF's sequences do,
and makes its length-penalty length count it, as HF's does.
Where the two still differ, beam search only: HF bans eos below the minimum length on log-probabilities
(log_softmax over the whole vocabulary, then -inf), CT2 before its log_softmax, and Marian's pad sits
in HF's softmax only; so a beam's step score differs by log(1 - p(eos) - p(pad)), which varies from
beam to beam. On the benchmark's HF-initialised weights p is ~1/vocab, far under fp16's rounding; on
tests/_seq2seq.py's decisive tiny models (eos made likely) it reorders some beams, so the CPU test
compares greedy search (an argmax, which renormalising cannot change).

CT2 converts and runs in processes of its own (`main`: `convert`, then `time`, started by generate.py)
for the reason bench/README.md gives for bert.py: once a third CUDA stream has run work in a process,
every CUDA graph in it replays slower, and CT2 runs on streams of its own.
"""
from __future__ import annotations

import functools
import json
import os
import statistics
import sys
import time

# generation_config attributes that change HF's output and have no CT2 counterpart here: a model with
# any of them set is refused, never compared half matched.
_UNMAPPED = {"forced_bos_token_id": None, "no_repeat_ngram_size": 0, "encoder_no_repeat_ngram_size": 0,
             "repetition_penalty": 1.0, "bad_words_ids": None, "suppress_tokens": None,
             "begin_suppress_tokens": None, "do_sample": False}


class UnsupportedPeerModel(ValueError):
    """The model or its generation options have no exact CTranslate2 counterpart."""


def _family(config) -> str:
    families = {"marian": "marian", "m2m_100": "m2m100"}
    if config.model_type not in families:
        raise UnsupportedPeerModel(f"CTranslate2 column: model_type {config.model_type!r} is not handled "
                                   f"(marian, m2m_100); run without --ctranslate2")
    return families[config.model_type]


def stand_in_tokens(config) -> list[str]:
    """Token names in id order: "t<id>", with "</s>", "<pad>", "<s>" at the config's eos / pad / bos ids
    and "<unk>" at the first id that is none of them."""
    family = _family(config)
    vocab = config.vocab_size
    if family == "marian":
        if getattr(config, "decoder_vocab_size", None) not in (None, vocab):
            raise UnsupportedPeerModel(f"CTranslate2 column: a separate decoder vocabulary "
                                       f"({config.decoder_vocab_size} vs {vocab}) is not converted")
        if config.pad_token_id != vocab - 1 or config.decoder_start_token_id != config.pad_token_id:
            raise UnsupportedPeerModel(
                f"CTranslate2 column: Marian needs pad = decoder_start = the last id ({vocab - 1}; CT2 drops "
                f"that row and starts from a zero embedding), got pad {config.pad_token_id}, "
                f"decoder_start {config.decoder_start_token_id}")
    names = {config.eos_token_id: "</s>", config.pad_token_id: "<pad>"}
    if getattr(config, "bos_token_id", None) is not None:
        names.setdefault(config.bos_token_id, "<s>")
    names[min(i for i in range(vocab) if i not in names)] = "<unk>"
    return [names.get(i, f"t{i}") for i in range(vocab)]


class StandInTokenizer:
    """What CTranslate2's Marian and M2M100 loaders read from a tokenizer, for a model without one."""

    def __init__(self, config):
        self.tokens = stand_in_tokens(config)
        self._ids = {t: i for i, t in enumerate(self.tokens)}
        self.eos_token, self.pad_token, self.unk_token = "</s>", "<pad>", "<unk>"
        self.bos_token = "<s>" if "<s>" in self._ids else None
        self.unk_token_id = self._ids["<unk>"]
        self.special_tokens_map: dict = {}
        self.num_madeup_words = 0

    def get_vocab(self) -> dict[str, int]:
        return dict(self._ids)

    def convert_ids_to_tokens(self, ids):
        return self.tokens[ids] if isinstance(ids, int) else [self.tokens[i] for i in ids]


@functools.cache
def _converter_class():
    import ctranslate2
    import transformers

    class RandomWeightConverter(ctranslate2.converters.TransformersConverter):
        """TransformersConverter for a saved model directory without tokenizer files."""

        def load_tokenizer(self, tokenizer_class, model_name_or_path, **kwargs):
            return StandInTokenizer(transformers.AutoConfig.from_pretrained(model_name_or_path))

        def load_model(self, model_class, model_name_or_path, **kwargs):
            model = super().load_model(model_class, model_name_or_path, **kwargs)
            if model.config.model_type == "marian":
                start = model.get_input_embeddings().weight[model.config.decoder_start_token_id]
                if start.abs().max() != 0:
                    raise UnsupportedPeerModel("CTranslate2 column: Marian's decoder start row is not zero, "
                                               "but CT2 starts every Marian decoder from a zero embedding")
            return model

    return RandomWeightConverter


def convert(hf_dir: str, output_dir: str, quantization: str | None = None) -> str:
    """Converts the HF model saved in hf_dir (save_pretrained, no tokenizer) to a CT2 model in output_dir.
    quantization: CT2's weight type ("float16" for the GPU; None keeps the saved dtype)."""
    return _converter_class()(hf_dir).convert(output_dir, quantization=quantization, force=True)


def translate_options(generation_config, *, num_beams: int, max_new_tokens: int,
                      min_new_tokens: int = 0) -> tuple[dict, int | None]:
    """translate_batch keywords that reproduce HF generate(num_beams, max/min_new_tokens) on this model's
    generation_config, and the eos id to append to a hypothesis CT2 leaves at its max length (HF's
    forced eos; None without one). Exact for greedy search and for beam search at min = max length
    (HF's early-stopping rules for beams that finish early are not CT2's patience)."""
    for name, neutral in _UNMAPPED.items():
        value = getattr(generation_config, name, neutral)
        if value not in (neutral, None):
            raise UnsupportedPeerModel(f"CTranslate2 column: generation option {name}={value!r} is not mapped; "
                                       f"run without --ctranslate2")
    eos = generation_config.eos_token_id
    eos = [eos] if isinstance(eos, int) else list(eos)
    forced = generation_config.forced_eos_token_id
    if isinstance(forced, (list, tuple)):
        if len(forced) != 1:
            raise UnsupportedPeerModel(f"CTranslate2 column: forced_eos_token_id {forced} (several) is not mapped")
        forced = forced[0]
    steps = max_new_tokens - (forced is not None)
    if steps < 1:
        raise UnsupportedPeerModel(f"CTranslate2 column: max_new_tokens {max_new_tokens} leaves CT2 no step")
    length_penalty = generation_config.length_penalty
    options = dict(beam_size=num_beams, num_hypotheses=1, patience=1,
                   length_penalty=1.0 if length_penalty is None else float(length_penalty),   # HF's default: 1.0
                   max_decoding_length=steps, min_decoding_length=min(min_new_tokens, steps),
                   end_token=eos, return_end_token=True, max_input_length=0)
    return options, forced


def hf_sequences(hypotheses: list[list[str]], tokenizer: StandInTokenizer, start: int, max_new_tokens: int,
                 append_eos: int | None) -> list[list[int]]:
    """CT2's token lists as HF lays its sequences out: the start token first, HF's forced eos after a
    hypothesis CT2 stopped at max_new_tokens - 1 tokens without an end token."""
    ids = tokenizer.get_vocab()
    out = []
    for tokens in hypotheses:
        row = [start] + [ids[t] for t in tokens]
        if append_eos is not None and len(tokens) == max_new_tokens - 1 and tokens[-1] != "</s>":
            row.append(append_eos)
        out.append(row)
    return out


def median_ms(call, reps: int, warmup: int) -> float:
    """Median wall ms of call() after warm-up calls. translate_batch blocks until its results are on the
    host, so the wall time of a call is its time: what CUDA events around it would record."""
    for _ in range(warmup):
        call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def time_translate(request: dict) -> dict:
    """Loads request["model_dir"] and, per shape, times translate_batch(shape["source"], **shape["options"])
    and returns its best hypotheses as token lists. Imports ctranslate2 only (no torch: see main)."""
    import ctranslate2

    device = request["device"]
    if device == "cuda" and ctranslate2.get_cuda_device_count() == 0:
        raise RuntimeError("CTranslate2 sees no CUDA device (a CPU-only build, or libcublas.so.12 not found: "
                           "source scripts/ctranslate2_env.sh)")
    translator = ctranslate2.Translator(request["model_dir"], device=device, compute_type=request["compute_type"])
    rows = []
    for shape in request["shapes"]:
        source = shape["source"]
        call = functools.partial(translator.translate_batch, source, max_batch_size=len(source), **shape["options"])
        results = call()
        rows.append({"ct2_ms": median_ms(call, request["reps"], request["warmup"]),
                     "hypotheses": [r.hypotheses[0] for r in results]})
    return {"ctranslate2": ctranslate2.__version__, "rows": rows}


USAGE = """usage (bench/generate.py --ctranslate2 runs both):
  python bench/ctranslate2_peer.py convert HF_DIR CT2_DIR [float16]
  python bench/ctranslate2_peer.py time REQUEST.json RESULT.json"""


def main(argv: list[str] | None = None) -> int:
    """Two steps in two processes: `convert` needs torch and transformers; `time` imports ctranslate2 alone,
    so that the only cuBLAS in its process is the one CTranslate2 opens (torch's own cuBLAS 13 beside
    the image's, linked as libcublas.so.12, could pair one's libcublas with the other's libcublasLt)."""
    argv = sys.argv[1:] if argv is None else argv
    try:
        if len(argv) in (3, 4) and argv[0] == "convert":
            from transformers.utils import logging as hf_logging
            hf_logging.disable_progress_bar()
            started = time.perf_counter()
            convert(argv[1], argv[2], argv[3] if len(argv) == 4 else None)
            print(f"# ctranslate2: converted in {time.perf_counter() - started:.1f} s", flush=True)
            return 0
        if len(argv) == 3 and argv[0] == "time":
            with open(argv[1]) as f:
                result = time_translate(json.load(f))
            with open(argv[2] + ".tmp", "w") as f:
                json.dump(result, f)
            os.replace(argv[2] + ".tmp", argv[2])
            return 0
    except UnsupportedPeerModel as e:
        print(e, file=sys.stderr)
        return 3
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
