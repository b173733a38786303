"""Models to export: a local Hugging Face directory, or a built-in small random-weight encoder.

Built-ins are made from configs with a fixed seed (no hub access needed). Every parameter is drawn
at random, biases and LayerNorm scales included: HF's own init sets biases to 0 and scales to 1,
which would let a rewrite that drops or swaps a bias pass its check unnoticed.
"""
from __future__ import annotations

from pathlib import Path

from .errors import ExportError, first_line

# name -> (transformers config class, model class, config fields)
_SMALL = dict(vocab_size=512, max_position_embeddings=128)
BUILTIN: dict[str, tuple[str, str, dict]] = {
    # The demo's model: BERT at real depth (12 layers) and a small width (the shape of Google's
    # BERT-Small checkpoints, L-12 H-256 A-4), so the whole pipeline runs in seconds on a CPU.
    "small-bert": ("BertConfig", "BertModel",
                   dict(vocab_size=8192, max_position_embeddings=512, hidden_size=256, num_hidden_layers=12,
                        num_attention_heads=4, intermediate_size=1024)),
    "tiny-bert": ("BertConfig", "BertModel",
                  dict(_SMALL, hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)),
    "tiny-bert-hd128": ("BertConfig", "BertModel",
                        dict(_SMALL, hidden_size=256, num_hidden_layers=2, num_attention_heads=2,
                             intermediate_size=512)),
    "tiny-roberta": ("RobertaConfig", "RobertaModel",
                     dict(vocab_size=512, max_position_embeddings=130, type_vocab_size=1, pad_token_id=1,
                          hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=256)),
    "tiny-distilbert": ("DistilBertConfig", "DistilBertModel",
                        dict(_SMALL, dim=128, n_layers=2, n_heads=2, hidden_dim=256)),
}
SEED = 0


def randomize(model, seed: int = SEED):
    """Draw every parameter: matrices ~ N(0, 1/fan_in) (unit-scale activations, peaked attention),
    embeddings ~ N(0, 1), biases ~ N(0, 0.1), LayerNorm scales ~ 1 + N(0, 0.1)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=p.dtype)
            if "LayerNorm" in name or "layer_norm" in name or name.endswith("norm.weight"):
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.1 * noise)
            elif p.dim() == 1:
                p.copy_(0.1 * noise)
            elif "embeddings" in name:
                p.copy_(noise)
            else:
                p.copy_(noise / p.shape[-1] ** 0.5)
    return model


def build(config_cls: str, model_cls: str, seed: int = SEED, attn_implementation: str | None = None, **fields):
    """A random-weight HF encoder from a config class name and its fields, in eval mode."""
    import torch
    import transformers

    config = getattr(transformers, config_cls)(**fields)
    if attn_implementation:
        config._attn_implementation = attn_implementation
    torch.manual_seed(seed)
    model = getattr(transformers, model_cls)(config)
    return randomize(model, seed).eval()


def load(source: str, attn_implementation: str | None = None, task: str | None = None,
         allow_unused_weights: bool = False):
    """(model, description) for a built-in name or a local HF model directory, with the head of
    `task` (export.tasks; None: config.json's architectures say, a built-in is feature-extraction).

    Every weight the model declares must come from the checkpoint: transformers only logs the
    parameters it had to initialise at random (a config.json that says more layers than the
    checkpoint holds, a task head the checkpoint lacks) and the ones it ignored (fewer layers, a
    head the task does not use), and either would export a model that runs and answers wrongly.
    Those are ExportErrors naming the keys (weights the task leaves unused: unless
    allow_unused_weights, then a warning); so are an unreadable folder and weights of the wrong
    shape. One exception: a feature-extraction checkpoint without pooler weights (saved from a
    masked-LM head, as roberta-base is) is exported without the pooler, rather than with a random one."""
    from . import tasks

    tasks.check(task)
    if source in BUILTIN:
        config_cls, model_cls, fields = BUILTIN[source]
        if task not in (None, tasks.FEATURE_EXTRACTION):
            model_cls = model_cls.removesuffix("Model") + tasks.HEAD_SUFFIX[task]
            fields = {**fields, "num_labels": 2 if task == tasks.QUESTION_ANSWERING else 3}
        return build(config_cls, model_cls, attn_implementation=attn_implementation, **fields), f"built-in {source}"
    path = Path(source)
    if not (path / "config.json").is_file():
        raise ExportError(f"{source!r} is neither a built-in model ({', '.join(BUILTIN)}) "
                          "nor a local Hugging Face model directory with a config.json")
    import transformers

    from . import sentence

    if sentence.is_sentence_dir(path) and task in (None, tasks.SENTENCE_SIMILARITY):
        return _load_sentence(path, attn_implementation)
    if task == tasks.SENTENCE_SIMILARITY:
        raise ExportError(f"{path} has no {sentence.MODULES}: sentence-similarity needs a sentence-transformers"
                          " directory (modules.json, 1_Pooling/config.json)")
    own_task = tasks.from_architectures(_architectures(path))
    if task is None:
        task = own_task
    elif own_task != tasks.FEATURE_EXTRACTION and task != own_task \
            and not (task == tasks.FEATURE_EXTRACTION and allow_unused_weights):
        # heads share module names (BERT's classifier is `classifier` for both classification tasks):
        # transformers would read one task's head weights as another's
        raise ExportError(f"{path} is a {own_task} checkpoint (config.json's architectures"
                          f" {_architectures(path)}): its head cannot be exported as {task}"
                          + (" (pass --allow-unused-weights to export its encoder alone)"
                             if task == tasks.FEATURE_EXTRACTION and not allow_unused_weights else ""))
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        auto = getattr(transformers, tasks.AUTO_CLASS[task])
        model, info = auto.from_pretrained(path, output_loading_info=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - transformers raises OSError, ValueError, RuntimeError, KeyError...
        raise ExportError(f"cannot load a Hugging Face model from {path} ({type(e).__name__}: {first_line(e)});"
                          " check its config.json and weight files, or save it again with save_pretrained") from e
    _check_loaded(model, info, path, task, allow_unused_weights)
    return model.eval(), f"{model.config.model_type} from {path} ({task})"


def _load_sentence(path: Path, attn_implementation: str | None):
    """A sentence-transformers directory: its encoder (every weight from the checkpoint, the pooler
    aside: sentence-transformers never uses it) under its pooling and normalization."""
    import logging

    import transformers

    from . import sentence

    config = sentence.read(path)
    kwargs = {"attn_implementation": attn_implementation} if attn_implementation else {}
    try:
        encoder, info = transformers.AutoModel.from_pretrained(config.encoder_path, output_loading_info=True, **kwargs)
    except Exception as e:  # noqa: BLE001 - as in load
        raise ExportError(f"cannot load the encoder of {path} ({type(e).__name__}: {first_line(e)})") from e
    _check_loaded(encoder, info, config.encoder_path)
    if getattr(encoder, "pooler", None) is not None:
        logging.getLogger(__name__).info("%s: the encoder's pooler is not part of the sentence model: not exported",
                                         path)
        encoder.pooler = None
    model = sentence.sentence_model(encoder.eval(), config)
    norm = ", normalized" if config.normalize else ""
    return model, f"{encoder.config.model_type} from {path} (sentence-similarity, {config.pooling} pooling{norm})"


def _architectures(path: Path) -> list[str]:
    import json

    try:
        return list(json.loads((path / "config.json").read_text()).get("architectures") or ())
    except (OSError, ValueError, AttributeError):
        return []  # transformers' own load reports an unreadable config.json


def _keys(keys, limit: int = 6) -> str:
    keys = sorted(map(str, keys))
    return ", ".join(keys[:limit]) + (f" and {len(keys) - limit} more" if len(keys) > limit else "")


def _check_loaded(model, info: dict, path: Path, task: str = "feature-extraction",
                  allow_unused_weights: bool = False) -> None:
    """Refuse a model whose checkpoint does not give every weight, or holds some it leaves unused (see load)."""
    import logging

    log = logging.getLogger(__name__)
    missing = set(info.get("missing_keys") or ())
    pooler = {k for k in missing if k.startswith("pooler.")}
    if pooler and pooler == missing and getattr(model, "pooler", None) is not None:
        log.warning("%s has no pooler weights (%s): exporting without the pooler, so there is no pooler_output",
                    path, _keys(pooler))
        model.pooler = None
        missing = set()
    if missing:
        prefix = getattr(model, "base_model_prefix", "")
        head = {k for k in missing if not k.startswith(prefix + ".")}
        if task != "feature-extraction" and head == missing:
            raise ExportError(f"{path}: the checkpoint has no weights for the {task} head ({_keys(missing)});"
                              " leave --task out to export the checkpoint's own task (config.json's"
                              " architectures), or give a checkpoint trained for this one")
        raise ExportError(f"{path}: the checkpoint lacks {len(missing)} weights that config.json declares"
                          f" ({_keys(missing)}); transformers would initialise them at random. Fix config.json"
                          " (e.g. num_hidden_layers) to match the weights, or give the complete checkpoint.")
    # Keys under the model's own modules that it did not take: the config declares fewer layers or
    # heads than the checkpoint holds. Other keys belong to a head this task does not use.
    own = {name for name, _ in model.named_children()}
    unexpected = set(info.get("unexpected_keys") or ())
    ignored = {k for k in unexpected if k.split(".", 1)[0] in own and "pooler." not in k}
    if ignored:
        raise ExportError(f"{path}: the checkpoint holds {len(ignored)} encoder weights that config.json does not"
                          f" declare ({_keys(ignored)}); they would be dropped. Fix config.json (e.g."
                          " num_hidden_layers) to match the weights.")
    unused = unexpected - ignored
    if unused:
        message = (f"{path}: the checkpoint holds {len(unused)} weights that the {task} export leaves unused"
                   f" ({_keys(unused)})")
        if not allow_unused_weights:
            raise ExportError(message + "; choose the task that uses them with --task (text-classification,"
                              " token-classification, question-answering), or pass --allow-unused-weights to"
                              " export without them")
        log.warning("%s: exporting without them (--allow-unused-weights)", message)
    if info.get("mismatched_keys") or info.get("error_msgs"):
        raise ExportError(f"{path}: weights of the wrong shape or unreadable: "
                          f"{_keys(info.get('mismatched_keys') or ()) or '; '.join(info['error_msgs'])}")
