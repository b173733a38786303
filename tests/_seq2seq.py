"""Tiny random-weight encoder-decoders of the four families, built from configs (no hub), made decisive.

Random weights at HF's init give flat, source-independent distributions: every token nearly ties and
the output repeats the start. So: weights drawn with std 0.3 at d_model 32 (attention and FFN matter,
outputs depend on the source; init_std_for scales it with width and, for post-LayerNorm families,
with depth), the LM head scaled (clear margins between candidates), and eos given a bias
through one hidden feature forced to 1 (the decoder's last LayerNorm: weight 0, bias 1 at feature 0)
that only the eos row of the LM head reads, calibrated so eos is the best first token for about a
fifth of the sources: hypotheses end at mixed lengths, which the beam bookkeeping needs.
"""
from __future__ import annotations

import warnings

import torch

from padfree.generation.inputs import padded_batch

FAMILIES = ("marian", "m2m100", "bart", "mbart")


POST_LAYERNORM = ("marian", "bart")


def init_std_for(family: str, layers: tuple[int, int], d_model: int) -> float:
    """0.3 at d_model 32, scaled as 1 / sqrt(d_model) (each linear's gain independent of width); for a
    post-LayerNorm family also by sqrt(2 / layers). Why: a post-LN block renormalizes x + branch(x),
    so a branch whose output outweighs its input erases the token and the position from the stream;
    over 12 such layers the decoder's output depends on neither, every step gives the same
    distribution, and hypotheses that place one token at different steps tie exactly (15-18 of 32
    hypotheses at 12 + 12 layers and the 2-layer std). Shrinking the branches with depth keeps them
    (at most 2 of 32 at 12 + 12 and 24 + 24, d_model 128)."""
    std = 0.3 * (32 / d_model) ** 0.5
    if family in POST_LAYERNORM:
        std *= (2 / max(2, *layers)) ** 0.5
    return std


def config_for(family: str, layers: tuple[int, int] = (2, 2), d_model: int = 32, heads: int = 4, ffn: int = 64,
               vocab: int = 97, max_positions: int = 64, **overrides):
    import transformers
    common = dict(vocab_size=vocab, d_model=d_model, encoder_layers=layers[0], decoder_layers=layers[1],
                  encoder_attention_heads=heads, decoder_attention_heads=heads, encoder_ffn_dim=ffn,
                  decoder_ffn_dim=ffn, max_position_embeddings=max_positions,
                  init_std=init_std_for(family, layers, d_model), dropout=0.0,
                  attention_dropout=0.0, activation_dropout=0.0, encoder_layerdrop=0.0, decoder_layerdrop=0.0)
    if family == "marian":
        common.update(decoder_vocab_size=vocab, pad_token_id=vocab - 1, eos_token_id=0,
                      decoder_start_token_id=vocab - 1, forced_eos_token_id=0, activation_function="swish",
                      scale_embedding=True)
        cls = transformers.MarianConfig
    elif family == "m2m100":
        common.update(pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=2,
                      activation_function="relu", scale_embedding=True)
        cls = transformers.M2M100Config
    elif family == "bart":
        common.update(pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=2,
                      forced_eos_token_id=2, activation_function="gelu", scale_embedding=False)
        cls = transformers.BartConfig
    elif family == "mbart":
        common.update(pad_token_id=1, eos_token_id=2, bos_token_id=0, decoder_start_token_id=None,
                      forced_eos_token_id=2, activation_function="gelu", scale_embedding=True)
        cls = transformers.MBartConfig
    else:
        raise ValueError(family)
    common.update(overrides)
    return cls(**common)


def model_class(family: str):
    import transformers
    return {"marian": transformers.MarianMTModel, "m2m100": transformers.M2M100ForConditionalGeneration,
            "bart": transformers.BartForConditionalGeneration,
            "mbart": transformers.MBartForConditionalGeneration}[family]


def special_ids(config) -> set[int]:
    return {i for i in (config.pad_token_id, config.eos_token_id, getattr(config, "bos_token_id", None),
                        config.decoder_start_token_id) if i is not None}


def _decoder_last_norm(model, family: str):
    decoder = model.model.decoder
    return decoder.layer_norm if family in ("m2m100", "mbart") else decoder.layers[-1].final_layer_norm


def build(family: str, seed: int = 0, lm_scale: float = 2.0, eos_share: float = 0.2, **config_kw):
    """A decisive tiny model of `family` in eval mode (float32)."""
    torch.manual_seed(seed)
    config = config_for(family, **config_kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_class(family)(config).eval()
    eos = config.eos_token_id
    with torch.no_grad():
        model.lm_head.weight.mul_(lm_scale)
        norm = _decoder_last_norm(model, family)
        norm.weight[0] = 0.0
        norm.bias[0] = 1.0
        model.lm_head.weight[:, 0] = 0.0
        # calibrate eos's bias on the first step's logits of random sources
        ids, mask = padded_batch(random_sources(config, 24, seed=seed + 1), config.pad_token_id)
        start = model.generation_config.decoder_start_token_id
        if start is None:
            start = config.bos_token_id
        logits = model(input_ids=ids, attention_mask=mask,
                       decoder_input_ids=torch.full((ids.shape[0], 1), start)).logits[:, -1]
        gap = logits.max(dim=-1).values - logits[:, eos]
        model.lm_head.weight[eos, 0] = float(torch.quantile(gap, eos_share)) + 1e-3
    return model


def random_sources(config, count: int, seed: int = 0, min_len: int = 3, max_len: int = 12) -> list[list[int]]:
    """Sources of mixed lengths from the non-special ids."""
    gen = torch.Generator().manual_seed(seed)
    allowed = torch.tensor([i for i in range(config.vocab_size) if i not in special_ids(config)])
    sources = []
    for _ in range(count):
        n = int(torch.randint(min_len, max_len + 1, (1,), generator=gen))
        sources.append(allowed[torch.randint(len(allowed), (n,), generator=gen)].tolist())
    return sources


def hf_generate(model, sources: list[list[int]], **options):
    ids, mask = padded_batch(sources, model.config.pad_token_id, next(model.parameters()).device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return model.generate(ids, attention_mask=mask, **options)


def engine_prerequisites():
    """(TensorRT-RTX's Api, libpadfree_trt.so) for the engine builds of the seq2seq graphs on the CPU;
    skips the test where either is missing."""
    import pytest

    from padfree.engines import plugin_library, trt_api
    try:
        api = trt_api.load("tensorrt_rtx")
    except Exception as e:  # noqa: BLE001
        pytest.skip(f"no TensorRT-RTX Python bindings: {e}")
    library = plugin_library.find(required=False)
    if library is None:
        pytest.skip("libpadfree_trt.so was not built (needs TensorRT headers: cmake -DTensorRT_ROOT=...)")
    return api, library
