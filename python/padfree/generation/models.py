"""The encoder-decoder families padfree.generation runs, and the config checks that admit a model.

A family is recognised by its Hugging Face class (isinstance, so subclasses load too); everything the
kernels and the torch path compute differently per family is in its FamilySpec. Every config flag
the computation relies on is checked here, and a value this package does not implement raises
UnsupportedModelError naming the flag, the value found and what is supported.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..torch.weights import UnsupportedModelError

__all__ = ["FamilySpec", "FAMILIES", "ACTIVATIONS", "detect_family", "validate_config", "UnsupportedModelError"]

# HF activation_function -> the torch function name the FFN applies (decoder.py / encoder.py)
ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",                   # erf GELU
    "gelu_python": "gelu",
    "gelu_new": "gelu_tanh", "gelu_fast": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
    "silu": "silu", "swish": "silu",
}


@dataclass(frozen=True)
class FamilySpec:
    """How one family's encoder-decoder computes (the same for its encoder and decoder).

    pre_ln: LayerNorm before each sublayer (residual added after) instead of after the residual add.
    final_layer_norms: a LayerNorm after the last encoder layer and after the last decoder layer.
    layernorm_embedding: a LayerNorm on embeddings + positions (BART, mBART).
    positions: "marian" (sinusoidal table, sin | cos halves, position p at row p),
      "fairseq" (M2M100's sinusoidal table: position p at row padding_idx + 1 + p, a pad token at row
      padding_idx, which is zero), "learned" (BART: row p + 2).
    logits_bias: the model adds final_logits_bias to the logits.
    legacy_flags: old config keys some checkpoints still carry, with the value this family's HF class
      implements; a checkpoint that says otherwise asks for an architecture HF does not run either.
    """
    name: str
    hf_class: str
    pre_ln: bool
    final_layer_norms: bool
    layernorm_embedding: bool
    positions: str
    logits_bias: bool
    legacy_flags: tuple[tuple[str, bool], ...]


FAMILIES = {
    "marian": FamilySpec("marian", "MarianMTModel", pre_ln=False, final_layer_norms=False,
                         layernorm_embedding=False, positions="marian", logits_bias=True,
                         legacy_flags=(("normalize_before", False), ("add_final_layer_norm", False),
                                       ("normalize_embedding", False), ("static_position_embeddings", True),
                                       ("add_bias_logits", False))),
    "m2m100": FamilySpec("m2m100", "M2M100ForConditionalGeneration", pre_ln=True, final_layer_norms=True,
                         layernorm_embedding=False, positions="fairseq", logits_bias=False,
                         legacy_flags=(("normalize_before", True), ("add_final_layer_norm", True),
                                       ("normalize_embedding", False), ("add_bias_logits", False))),
    "bart": FamilySpec("bart", "BartForConditionalGeneration", pre_ln=False, final_layer_norms=False,
                       layernorm_embedding=True, positions="learned", logits_bias=True,
                       legacy_flags=(("normalize_before", False), ("add_final_layer_norm", False),
                                     ("normalize_embedding", True), ("static_position_embeddings", False),
                                     ("add_bias_logits", False))),
    "mbart": FamilySpec("mbart", "MBartForConditionalGeneration", pre_ln=True, final_layer_norms=True,
                        layernorm_embedding=True, positions="learned", logits_bias=True,
                        legacy_flags=(("normalize_before", True), ("add_final_layer_norm", True),
                                      ("normalize_embedding", True), ("static_position_embeddings", False),
                                      ("add_bias_logits", False))),
}


def _hf_classes() -> dict[str, type]:
    import transformers
    return {name: getattr(transformers, spec.hf_class) for name, spec in FAMILIES.items()}


def is_seq2seq(model) -> bool:
    """Whether `model` is an encoder-decoder that padfree.torch.from_hf hands to padfree.generation."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "is_encoder_decoder", False))


def detect_family(model: torch.nn.Module) -> FamilySpec:
    """The FamilySpec of `model`, or UnsupportedModelError naming its class and the supported ones.

    mBART is tested before BART: neither derives from the other in transformers 5, but the order keeps
    the more specific match first should that change.
    """
    classes = _hf_classes()
    for name in ("mbart", "marian", "m2m100", "bart"):
        if isinstance(model, classes[name]):
            return FAMILIES[name]
    supported = ", ".join(spec.hf_class for spec in FAMILIES.values())
    raise UnsupportedModelError(
        f"{type(model).__name__}: padfree.generation runs {supported} (the task model with its LM head); "
        f"got a model of class {type(model).__name__}. Load one of those classes, or use Hugging Face's "
        f"generate for this architecture.")


def _flag(config, name: str):
    return getattr(config, name, None)


def validate_config(config, spec: FamilySpec) -> None:
    """Raise UnsupportedModelError for a config value padfree.generation does not implement.

    Checked: is_encoder_decoder, activation_function, head counts dividing d_model (encoder and
    decoder), scale_embedding being a bool, and the family's legacy flags (normalize_before,
    add_final_layer_norm, normalize_embedding, static_position_embeddings, add_bias_logits) where a
    config carries them.
    """
    where = f"{spec.hf_class} config"
    if not getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(f"{where}: is_encoder_decoder must be True (a decoder-only "
                                    f"configuration of this class is not an encoder-decoder to generate with)")
    act = _flag(config, "activation_function")
    if act not in ACTIVATIONS:
        raise UnsupportedModelError(
            f"{where}: activation_function={act!r} is not supported; supported: {', '.join(sorted(ACTIVATIONS))}")
    d_model = config.d_model
    for side in ("encoder", "decoder"):
        heads = getattr(config, f"{side}_attention_heads")
        if heads <= 0 or d_model % heads:
            raise UnsupportedModelError(
                f"{where}: {side}_attention_heads={heads} does not divide d_model={d_model}")
    if not isinstance(_flag(config, "scale_embedding"), bool):
        raise UnsupportedModelError(f"{where}: scale_embedding must be True or False, got "
                                    f"{_flag(config, 'scale_embedding')!r}")
    for name, expected in spec.legacy_flags:
        value = _flag(config, name)
        if value is not None and bool(value) != expected:
            raise UnsupportedModelError(
                f"{where}: {name}={value!r}, but {spec.hf_class} computes as {name}={expected} (Hugging Face's "
                f"class ignores the flag); a checkpoint asking for {name}={value!r} is a different "
                f"architecture, which padfree.generation does not run")
