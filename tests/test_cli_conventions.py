"""CLI conventions: --version, python -m padfree, -q / -v on every subcommand, check's default
reference, padfree inspect."""
from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from padfree.cli import main


def test_version_and_python_m(capsys):
    import padfree

    with pytest.raises(SystemExit) as exit_:
        main(["--version"])
    assert exit_.value.code == 0 and capsys.readouterr().out.strip() == f"padfree {padfree.__version__}"
    run = subprocess.run([sys.executable, "-m", "padfree", "--version"], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == f"padfree {padfree.__version__}"


@pytest.mark.parametrize("flags, level", [(["-q"], logging.WARNING), (["-v"], logging.DEBUG), ([], logging.INFO)])
@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_and_verbose_act_on_every_subcommand(tiny_bert_export, capsys, flags, level, where):
    model = str(tiny_bert_export / "model.padfree.onnx")
    argv = [*flags, "inspect", model] if where == "before" else ["inspect", model, *flags]
    assert main(argv) == 0
    assert logging.getLogger("padfree").level == level
    capsys.readouterr()
    for name in ("export", "check", "run", "demo", "inspect"):
        with pytest.raises(SystemExit):
            main([name, "-q", "--help"])
        assert "-q, --quiet" in capsys.readouterr().out


def test_quiet_and_verbose_exclude_each_other(tiny_bert_export, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["-v", "inspect", str(tiny_bert_export / "model.onnx"), "-q"])
    assert exit_.value.code == 2 and "exclude each other" in capsys.readouterr().err


def test_check_defaults_its_reference_to_the_model_onnx_beside(tiny_bert_export, tmp_path, capsys):
    assert main(["check", str(tiny_bert_export / "model.padfree.onnx"), "--batch", "3", "--max-seqlen", "16"]) == 0
    out = capsys.readouterr().out
    assert f"vs {tiny_bert_export / 'model.onnx'}" in out and "PASS" in out
    lone = tmp_path / "model.padfree.onnx"
    lone.write_bytes((tiny_bert_export / "model.padfree.onnx").read_bytes())
    assert main(["check", str(lone)]) == 2
    assert "give it with --reference" in capsys.readouterr().err


def test_inspect_an_onnx_model(tiny_bert_export, capsys):
    assert main(["inspect", str(tiny_bert_export / "model.padfree.onnx")]) == 0
    text = capsys.readouterr().out
    assert "PadfreeAttention: 2" in text and "padfree.task: feature-extraction" in text
    assert "cu_seqlens: int32 ['batch_plus_1']" in text and "float_dtype: fp32" in text
    assert main(["inspect", str(tiny_bert_export / "model.onnx"), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["plugin_nodes"] == {} and [o["name"] for o in facts["outputs"]] == ["last_hidden_state",
                                                                                      "pooler_output"]


def test_inspect_an_export_folder(tiny_bert_export, tmp_path, capsys):
    assert main(["inspect", str(tiny_bert_export)]) == 0
    text = capsys.readouterr().out
    assert "(encoder export)" in text and "task: feature-extraction" in text and "PadfreeAttention: 2" in text
    assert main(["inspect", str(tiny_bert_export), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    report = json.loads((tiny_bert_export / "report.json").read_text())
    assert facts["kind"] == "encoder export" and facts["fused"] == report["fused"] and facts["complete"] is True
    assert main(["inspect", str(tmp_path)]) == 2
    assert "not a `padfree export` folder" in capsys.readouterr().err


def test_inspect_an_engine_sidecar(tmp_path, capsys):
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"plan")
    sidecar = {"format": "padfree-engine", "format_version": 1, "padfree_version": "0.1.0",
               "backend": {"name": "tensorrt", "version": "10.9"}, "precision": "fp16",
               "model": {"io": "packed", "padfree.task": "text-classification"}, "plugins": ["PadfreeAttention"],
               "profiles": [{"max_tokens": 4096}],
               "inputs": [{"name": "input_ids", "dtype": "int32", "shape": [-1]}],
               "outputs": [{"name": "logits", "dtype": "float16", "shape": [-1, 3]}]}
    (tmp_path / "model.engine.json").write_text(json.dumps(sidecar))
    assert main(["inspect", str(engine)]) == 0
    text = capsys.readouterr().out
    assert "precision: fp16" in text and "logits: float16 [-1, 3]" in text and "io: packed" in text
    (tmp_path / "other.bin").write_bytes(b"x")
    assert main(["inspect", str(tmp_path / "other.bin")]) == 2
    assert "neither an .onnx model nor an engine" in capsys.readouterr().err
