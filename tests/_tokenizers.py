"""A tiny WordPiece tokenizer written by the tests (no model hub): a vocab.txt, loaded by
transformers and saved beside it as an HF tokenizer folder (tokenizer.json, tokenizer_config.json)."""
from __future__ import annotations

from pathlib import Path

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = ("the a cat dog sat on mat ran fast slow red blue green house tree bird sings loud quiet ##s ##ed"
         " over under small big old new one two three").split()


def write_wordpiece(folder: Path, words=WORDS, lowercase: bool = True, model_max_length: int | None = None):
    """Save a WordPiece tokenizer over SPECIAL + words into `folder`; returns it. Checks that every
    word maps to its own id: transformers 5 ignores BertTokenizerFast(vocab_file=...) and would give
    a tokenizer of [UNK]s, under which any two texts of one length look alike."""
    import transformers

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vocab.txt").write_text("\n".join([*SPECIAL, *words]) + "\n")
    extra = {} if model_max_length is None else {"model_max_length": model_max_length}
    tokenizer = transformers.BertTokenizerFast.from_pretrained(str(folder), do_lower_case=lowercase, **extra)
    whole = [w for w in words if not w.startswith("##")]
    ids = tokenizer(" ".join(whole), add_special_tokens=False)["input_ids"]
    unknown = tokenizer.convert_tokens_to_ids("[UNK]")
    assert len(ids) == len(whole) and unknown not in ids, "the test tokenizer does not know its own words"
    tokenizer.save_pretrained(str(folder))
    return tokenizer
