"""`padfree run SOURCE --generate` on the CPU: a seq2seq export folder (ONNX Runtime) and an HF encoder-decoder
directory (padfree.generation's torch references), checked against Runtime.generate on the same batch."""
from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import pytest

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import build  # noqa: E402
from _tokenizers import SPECIAL, WORDS, write_wordpiece  # noqa: E402

from padfree import cli  # noqa: E402
from padfree.export import export  # noqa: E402
from padfree.runtime import Runtime  # noqa: E402

SOURCES = [[5, 9, 12, 7, 30], [20, 3], [14, 14, 6]]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """(HF directory with a WordPiece tokenizer over the model's vocabulary, its seq2seq export)."""
    root = tmp_path_factory.mktemp("generate_cli")
    model = build("bart", layers=(1, 1), vocab=len(SPECIAL) + len(WORDS))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(root / "hf")
    write_wordpiece(root / "hf")
    export(root / "hf", root / "out", num_beams=4)
    (root / "ids.json").write_text(json.dumps(SOURCES))
    return root / "hf", root / "out", root / "ids.json"


def _printed_rows(text: str) -> list[list[int]]:
    return [json.loads(line.split(": ", 1)[1].split(" (score")[0]) for line in text.splitlines()
            if line.startswith("source ")]


def test_beam_search_from_an_export_folder(folders, tmp_path, capsys):
    _, out, ids = folders
    assert cli.main(["run", str(out), "--generate", "--input", str(ids), "--num-beams", "4", "--max-new-tokens", "6",
                     "--option", "num_return_sequences=2", "-o", str(tmp_path / "g.npz"), "-q"]) == 0
    printed = capsys.readouterr().out
    want = Runtime(str(out)).generate(SOURCES, num_beams=4, max_new_tokens=6, num_return_sequences=2,
                                      return_dict_in_generate=True, output_scores=True)
    sequences = want.sequences.numpy()
    assert _printed_rows(printed) == sequences.tolist()
    assert "source 2 #1:" in printed and printed.count("(score ") == len(SOURCES) * 2
    saved = np.load(tmp_path / "g.npz")
    np.testing.assert_array_equal(saved["sequences"], sequences)
    np.testing.assert_allclose(saved["sequences_scores"], want.sequences_scores.numpy(), rtol=0, atol=0)


def test_texts_are_tokenized_and_the_hypotheses_decoded(folders, capsys):
    hf, out, _ = folders
    texts = ["the cat sat on the mat", "a red bird sings"]
    assert cli.main(["run", str(out), "--generate", "--text", texts[0], "--text", texts[1], "--max-new-tokens", "5",
                     "-q"]) == 0
    printed = capsys.readouterr().out
    runtime = Runtime(str(out))
    ids = runtime.tokenize(texts)
    sequences = runtime.generate(ids, max_new_tokens=5).numpy()
    assert _printed_rows(printed) == sequences.tolist()
    decoded = runtime.text_tokenizer.tokenizer.batch_decode(sequences.tolist(), skip_special_tokens=True)
    assert [line.strip() for line in printed.splitlines() if line.startswith("  ")] == [repr(t) for t in decoded]


def test_a_padded_batch_file_generates_as_its_lists(folders, tmp_path, capsys):
    _, out, ids = folders
    width = max(map(len, SOURCES))
    padded = {"input_ids": [s + [1] * (width - len(s)) for s in SOURCES],
              "attention_mask": [[1] * len(s) + [0] * (width - len(s)) for s in SOURCES]}
    (tmp_path / "padded.json").write_text(json.dumps(padded))
    common = ["--generate", "--max-new-tokens", "5", "--num-beams", "2", "-q"]
    assert cli.main(["run", str(out), "--input", str(tmp_path / "padded.json"), *common]) == 0
    from_padded = _printed_rows(capsys.readouterr().out)
    assert cli.main(["run", str(out), "--input", str(ids), *common]) == 0
    assert from_padded == _printed_rows(capsys.readouterr().out)


def test_token_ids_in_decoded_out_with_a_tokenizer(folders, capsys):
    hf, out, ids = folders
    assert cli.main(["run", str(out), "--generate", "--input", str(ids), "--max-new-tokens", "4", "--tokenizer",
                     str(hf), "-q"]) == 0
    printed = capsys.readouterr().out
    sequences = _printed_rows(printed)
    decoded = Runtime(str(out), tokenizer=str(hf)).text_tokenizer.tokenizer.batch_decode(sequences,
                                                                                          skip_special_tokens=True)
    assert [line.strip() for line in printed.splitlines() if line.startswith("  ")] == [repr(t) for t in decoded]


def test_an_hf_directory_on_the_cpu_generates_as_its_export(folders, capsys):
    hf, out, ids = folders
    common = ["--generate", "--input", str(ids), "--max-new-tokens", "6", "-q"]
    assert cli.main(["run", str(hf), *common, "--device", "cpu", "--dtype", "fp32"]) == 0
    torch_rows = _printed_rows(capsys.readouterr().out)
    assert cli.main(["run", str(out), *common]) == 0
    assert torch_rows == _printed_rows(capsys.readouterr().out)


@pytest.mark.parametrize("argv, message", [
    (["{out}", "--input", "{ids}"], "is an encoder-decoder: pass --generate"),
    (["{out}", "--input", "{ids}", "--num-beams", "2"], "--num-beams: generation options; pass --generate"),
    (["{out}", "--generate", "--input", "{ids}", "--option", "beams"], "expected KEY=VALUE"),
    (["{out}", "--generate", "--input", "{ids}", "--option", "output_attentions=true"], "output_attentions"),
    (["{out}", "--generate", "--input", "{ids}", "--padded"], "--padded shapes encoder outputs"),
    (["{out}", "--generate", "--input", "{ids}", "--num-beams", "2", "--option", "num_beams=3"], "give one"),
    (["{hf}", "--generate", "--input", "{ids}", "--device", "cpu"], "--device cpu generates in float32"),
    (["tiny-bert", "--generate", "--random", "2,4"], "is not an encoder-decoder"),
])
def test_refusals_say_what_to_do(folders, capsys, argv, message):
    hf, out, ids = folders
    argv = [a.format(out=out, hf=hf, ids=ids) for a in argv]
    assert cli.main(["run", *argv, "-q"]) != 0
    assert message in capsys.readouterr().err
