"""The export folder keeps the model's text side: the tokenizer files, config.json and, for a
sentence-transformers model, modules.json, sentence_bert_config.json and the pooling config, copied
from the source directory beside the ONNX (names: padfree.tokenizer_files). So `padfree run OUT --text`,
`Runtime(OUT).encode(texts)` and an engine built into OUT find the model's own tokenizer.

Rules:
- Copied as found, each set written whole (padfree.outputs), before report.json (which marks a complete
  export). One exception: modules.json is rewritten to the export folder's layout (the Transformer module
  at "" where the tokenizer now is, the pooling config under 1_Pooling/), so that it describes the folder.
- The previous export's text files are removed with its other files: a tokenizer left from another model
  would tokenize the new one's text wrongly, and without a word.
- A folder that holds model weights (an HF model directory, the source itself included) is left alone:
  its tokenizer and config.json are its own, and an export must not delete or replace them.
- Nothing is executed: tokenizer_config.json may name custom tokenizer code, and padfree never loads
  a tokenizer with trust_remote_code.
"""
from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

from padfree import outputs
from padfree.tokenizer_files import CONFIG, MODULES, POOLING_CONFIG, SENTENCE, TOKENIZER

log = logging.getLogger(__name__)

_WEIGHTS = ("*.safetensors", "pytorch_model*.bin", "tf_model.h5", "flax_model.msgpack", "*.safetensors.index.json")
# modules.json paths in the export folder, by module position (Transformer, Pooling, Normalize)
_LAYOUT = ("", str(Path(POOLING_CONFIG).parent), "2_Normalize")


def written_names() -> list[str]:
    """Every file (relative to the export folder) that copy() may write."""
    return [*TOKENIZER, CONFIG, *SENTENCE, POOLING_CONFIG]


def sources_of(source, sentence_encoder_path: Path | None = None) -> list[Path]:
    """The folders to copy from, in order of preference: a sentence model's Transformer module folder
    (where sentence-transformers saves the tokenizer), then the directory itself; none for a built-in
    name or a model object."""
    if not isinstance(source, (str, Path)) or not (Path(source) / CONFIG).is_file():
        return []
    root = Path(source)
    if sentence_encoder_path is not None and not _same(sentence_encoder_path, root):
        return [sentence_encoder_path, root]
    return [root]


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def left_alone(out: Path, sources: list[Path]) -> str | None:
    """Why the export leaves `out`'s text files as they are (None: it manages them)."""
    if any(_same(out, s) for s in sources):
        return f"{out} is the source directory: its tokenizer and config.json stay as they are"
    if any(any(out.glob(pattern)) for pattern in _WEIGHTS):
        return (f"{out} holds model weights (an HF model directory): its tokenizer and config.json are left as"
                " they are; export into a folder of its own to keep the model's tokenizer beside the ONNX")
    return None


def remove_previous(out: Path, sources: list[Path]) -> None:
    """Remove the text files a previous export left in `out` (see the rules above)."""
    if left_alone(out, sources) is None:
        outputs.remove([out / name for name in written_names()])


def copy(out: Path, sources: list[Path], sentence: bool = False, config: bool = True) -> list[str]:
    """Copy the text files the sources hold into `out`; returns their names (relative to `out`).

    sentence: also the sentence-transformers files (the model exported is its pooled sentence model).
    config: also config.json (a seq2seq export writes its own)."""
    if not sources:
        return []
    reason = left_alone(out, sources)
    if reason is not None:
        log.info("%s", reason)
        return []
    names = [*TOKENIZER, *([CONFIG] if config else []), *(n for n in SENTENCE if sentence and n != MODULES)]
    found = {}
    for name in names:
        path = next((s / name for s in sources if (s / name).is_file()), None)
        if path is not None:
            found[name] = path
    if not any(name in found for name in TOKENIZER):
        log.warning("no tokenizer files in %s: text input (padfree run --text, Runtime.encode) will need one"
                    " given (--tokenizer DIR, Runtime(..., tokenizer=DIR))", ", ".join(map(str, sources)))
    root = sources[-1]
    if sentence:
        # export.sentence.read checked modules.json and read the pooling config when the model loaded
        modules = json.loads((root / MODULES).read_text())
        pooling = out / POOLING_CONFIG
        outputs.writable_folder(pooling.parent, "pooling config folder")
        outputs.write_bytes(pooling, (root / modules[1].get("path", "") / "config.json").read_bytes())
    with outputs.staged(out) as stage:
        for name, path in found.items():
            shutil.copyfile(path, stage.path(name))
        if sentence:
            here = [{**m, "path": path} for m, path in zip(modules, _LAYOUT)]
            stage.path(MODULES).write_text(json.dumps(here, indent=2) + "\n")
    written = [*found, *([MODULES, POOLING_CONFIG] if sentence else [])]
    if written:
        log.info("copied %s beside the model", ", ".join(written))
    return written
