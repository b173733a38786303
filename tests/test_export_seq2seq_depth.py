"""The seq2seq export at real depth (random weights, CPU): every family at 12 + 12 layers (the depth of
Marian-big, mBART and NLLB-600M) and the post-LayerNorm case at 24 + 24, d_model 128, through the CLI
as a user runs it: `padfree export` then `padfree check`, which generates on ONNX Runtime from both
decoder steps and must equal HF's generate (greedy token for token, beam 4 within the depth's
tolerance, at most a quarter of the hypotheses near-ties). The engine graphs' forms (fp16, a packed
encoder, the whole-generation graph) are checked at depth too: two-layer models hid an export failure from 4 layers up.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_graphsurgeon")

from padfree import cli  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import build  # noqa: E402

WIDE = dict(d_model=128, heads=4, ffn=256)
# name -> (family, layers, extra export arguments)
CASES = {
    "marian-12": ("marian", 12, ()),
    "m2m100-12": ("m2m100", 12, ()),
    "bart-12-packed": ("bart", 12, ("--io", "packed", "--generation-graph", "8")),  # + the whole-generation graph
    "marian-12-packed": ("marian", 12, ("--io", "packed", "--num-beams", "4", "--generation-graph", "8")),
    # ^ the embedding without a LayerNorm (post-LN); beam search inside the whole-generation graph
    "m2m100-12-packed": ("m2m100", 12, ("--io", "packed")),     # the same, pre-LN, positions from padding_idx + 1
    "mbart-12-fp16": ("mbart", 12, ("--dtype", "fp16")),
    "marian-24": ("marian", 24, ()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_export_and_check_at_depth(tmp_path, capsys, name):
    family, layers, extra = CASES[name]
    model = build(family, layers=(layers, layers), **WIDE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path / "hf")
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "out"), *extra]) == 0
    assert f"{layers} self-attention and {layers} cross-attention sites" in capsys.readouterr().out
    manifest = json.loads((tmp_path / "out" / "seq2seq.json").read_text())
    assert (manifest["encoder"]["layers"], manifest["decoder"]["layers"]) == (layers, layers)
    code = cli.main(["check", str(tmp_path / "out")])
    printed = capsys.readouterr().out
    assert code == 0, printed
    assert printed.rstrip().endswith("PASS")
    lines = [line for line in printed.splitlines() if "beam search" in line]
    assert len(lines) == 2 + ("--num-beams" in extra), printed      # both decoder steps (and a beam graph)
    tol = f"within {1e-4 * max(1, layers / 12):g}"
    assert all(tol in line for line in lines), printed
    if "--generation-graph" in extra:
        generation = printed.split("generation.padfree.onnx (one graph")
        beams = "--num-beams" in extra
        assert len(generation) == 2 and ("beam search (4 beams, 1 returned): 8 of 8" if beams else "greedy: 8 of 8") \
            in generation[1], printed
