"""Which models the seq2seq export takes, how a directory is loaded, and what it refuses.

An encoder-decoder is recognised by config.is_encoder_decoder (a directory's config.json, or a model
object's config). The families and config checks are padfree.generation's (generation/models.py):
the export writes the same computation padfree.generation runs, so whatever that package refuses
(another class, an activation, a legacy flag, a projection without bias, ...) the export refuses with
the same message, as an ExportError. Export options that have no seq2seq form yet are refused by name.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import ExportError, first_line

__all__ = ["is_seq2seq_source", "is_seq2seq_export", "load", "check_supported", "check_options"]


def is_seq2seq_export(path) -> bool:
    """Whether `path` is a folder a seq2seq export wrote (its seq2seq.json)."""
    return Path(path).is_dir() and (Path(path) / "seq2seq.json").is_file()


def is_seq2seq_source(source) -> bool:
    """Whether `source` (a local HF directory or a model object) is an encoder-decoder."""
    if isinstance(source, (str, Path)):
        config = Path(source) / "config.json"
        if not config.is_file():
            return False
        try:
            return bool(json.loads(config.read_text()).get("is_encoder_decoder", False))
        except (OSError, ValueError):
            return False      # the encoder loader reports an unreadable config
    return bool(getattr(getattr(source, "config", None), "is_encoder_decoder", False))


def load(path: str | Path, attn_implementation: str | None = None):
    """(model, description): the task model (with its LM head) of a local HF encoder-decoder directory.

    Every weight the config declares must come from the checkpoint (transformers would draw a missing
    one at random and only log it), and the checkpoint must hold none that the model does not take."""
    import transformers

    path = Path(path)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        model, info = transformers.AutoModelForSeq2SeqLM.from_pretrained(path, output_loading_info=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - transformers raises many kinds; one clear message
        raise ExportError(f"cannot load a Hugging Face encoder-decoder from {path} ({type(e).__name__}: "
                          f"{first_line(e)}); check its config.json and weight files") from e
    for kind in ("missing_keys", "unexpected_keys", "mismatched_keys"):
        keys = sorted(map(str, info.get(kind) or ()))
        if keys:
            shown = ", ".join(keys[:6]) + (f" and {len(keys) - 6} more" if len(keys) > 6 else "")
            raise ExportError(f"{path}: {kind.replace('_', ' ')} in the checkpoint ({shown}); fix config.json "
                              f"(e.g. encoder_layers / decoder_layers) to match the weights")
    return model.float().eval(), f"{model.config.model_type} from {path}"


def check_supported(model):
    """The model's padfree.generation FamilySpec, or an ExportError naming what is not supported."""
    from padfree.generation.models import UnsupportedModelError, detect_family, validate_config

    try:
        spec = detect_family(model)
        validate_config(model.config, spec)
    except UnsupportedModelError as e:
        raise ExportError(f"seq2seq export: {e}") from e
    return spec


def check_options(io: str | None, dtype: str, allow_partial: bool) -> None:
    """Export options without a seq2seq form yet, refused by name before anything is loaded."""
    if io not in (None, "padded", "packed"):
        raise ExportError(f"--io {io}: give packed (encoder.padfree.onnx on packed tokens beside the padded "
                          f"encoder.onnx) or padded (the default)")
    from ..precision import DTYPES
    if dtype not in DTYPES:
        raise ExportError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if allow_partial:
        raise ExportError("--allow-partial: the seq2seq export writes its graphs whole (nothing is fused that "
                          "could be left out); omit it")
