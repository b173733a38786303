"""The files that make a model's text side: its Hugging Face tokenizer, config.json and, for a
sentence-transformers model, its module configs. One list for both ends: `padfree export` copies
them beside the ONNX (padfree.export.text_files), the Runtime looks for a tokenizer among them
(padfree.runtime._text). Names as transformers and sentence-transformers save them.
"""
from __future__ import annotations

import os
from pathlib import Path

# The tokenizer proper: each tokenizer class's `vocab_files_names` for the families padfree exports
# (BERT / DistilBERT / ELECTRA / MPNet vocab.txt; RoBERTa / BART vocab.json + merges.txt; ALBERT / T5
# spiece.model; XLM-R / mBART / NLLB / M2M100 sentencepiece.bpe.model; DeBERTa-v2 spm.model; Marian
# source.spm / target.spm / target_vocab.json), the fast tokenizer's tokenizer.json, and the files
# every tokenizer reads beside them.
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
             "vocab.txt", "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "spm.model",
             "source.spm", "target.spm", "target_vocab.json")
_SETTINGS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
CONFIG = "config.json"
# sentence-transformers: the module list, the Transformer module's max_seq_length / do_lower_case, the
# model's own settings (prompts, similarity), and the Pooling module's config (exported as 1_Pooling).
MODULES = "modules.json"
SENTENCE = (MODULES, "sentence_bert_config.json", "config_sentence_transformers.json")
POOLING_CONFIG = "1_Pooling/config.json"
SENTENCE_BERT_CONFIG = "sentence_bert_config.json"


def tokenizer_names(folder: str | os.PathLike) -> list[str]:
    """The tokenizer files `folder` holds (empty: no tokenizer there)."""
    folder = Path(folder)
    return [name for name in TOKENIZER if (folder / name).is_file()]


def has_tokenizer(folder: str | os.PathLike) -> bool:
    """Whether `folder` holds a vocabulary (tokenizer_config.json alone is no tokenizer)."""
    return Path(folder).is_dir() and any(name not in _SETTINGS for name in tokenizer_names(folder))
