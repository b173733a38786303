"""`padfree triton`: the Triton model repository writer (CPU; no engine is deserialized).

The writer reads only the sidecar and the engine's bytes (checked against the sidecar's size and
SHA-256), so a hand-written sidecar beside a dummy plan file exercises all of it; the config is
parsed with Triton's own ModelConfig protobuf (tritonclient[grpc]) where that is installed.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from padfree import cli, triton
from padfree.arguments import EXIT_ERROR
from padfree.engines import sidecar

HIDDEN = 32
try:
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb
except ImportError:  # pragma: no cover - depends on the install
    pb = None
needs_triton = pytest.mark.skipif(pb is None, reason="tritonclient[grpc] not installed (pip install padfree[triton])")


def _sidecar(blob: bytes, io="packed", token_types=True, pooler=True, profiles=None, built="tensorrt") -> dict:
    names = ["input_ids"] + (["token_type_ids"] if token_types else []) + ["cu_seqlens", "max_seqlen"]
    shapes = {"input_ids": ["T"], "token_type_ids": ["T"], "cu_seqlens": ["B+1"], "max_seqlen": ["S"]}
    outs = [{"name": "last_hidden_state", "dtype": "float16", "shape": ["T", HIDDEN]}]
    if pooler:
        outs.append({"name": "pooler_output", "dtype": "float16", "shape": ["B", HIDDEN]})
    return {"format": sidecar.FORMAT, "format_version": sidecar.FORMAT_VERSION, "padfree_version": "0.1.0",
            "backend": {"name": built, "version": "10.13.0" if built == "tensorrt" else "1.7.0"},
            "model": {"io": io, "vocab_size": 100, "type_vocab_size": 2 if token_types else 0, "max_positions": 512},
            "precision": "fp16",
            "profiles": profiles or [{"max_tokens": 256, "max_batch": 8, "max_seqlen": 64},
                                     {"max_tokens": 4096, "max_batch": 64, "max_seqlen": 512}],
            "inputs": [{"name": n, "dtype": "int32", "shape": shapes[n]} for n in names],
            "outputs": outs, "plugins": ["PadfreeAttention"],
            "engine": {"bytes": len(blob), "sha256": sidecar.digest(blob)}}


def _engine(tmp_path: Path, name="bert.engine", **kw) -> Path:
    engine = tmp_path / name
    engine.write_bytes(b"a plan's bytes, never deserialized here" * 7)
    sidecar.write(engine, _sidecar(engine.read_bytes(), **kw))
    return engine


def _listing(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@needs_triton
def test_config_has_exactly_the_ragged_batching_fields(tmp_path):
    engine = _engine(tmp_path)
    target = triton.write_repository(engine, tmp_path / "models", max_batch=8, max_queue_delay_us=250, instances=2)
    assert target == tmp_path / "models" / "bert"
    assert _listing(tmp_path / "models") == ["bert", "bert/1", "bert/1/model.plan", "bert/config.pbtxt"]
    assert (target / "1" / "model.plan").read_bytes() == engine.read_bytes()
    c = text_format.Parse((target / "config.pbtxt").read_text(), pb.ModelConfig())
    assert c.name == "bert" and c.platform == "tensorrt_plan" and c.max_batch_size == 8
    assert c.dynamic_batching.max_queue_delay_microseconds == 250
    assert [(g.count, g.kind, list(g.profile)) for g in c.instance_group] == [(2, pb.ModelInstanceGroup.KIND_GPU,
                                                                               ["1"])]  # the largest profile
    assert [(i.name, i.data_type, list(i.dims), i.allow_ragged_batch) for i in c.input] == [
        ("input_ids", pb.TYPE_INT32, [-1], True), ("token_type_ids", pb.TYPE_INT32, [-1], True)]
    assert [(b.kind, list(b.target_name), b.data_type, list(b.source_input)) for b in c.batch_input] == [
        (pb.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO, ["cu_seqlens"], pb.TYPE_INT32, ["input_ids"]),
        (pb.BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE, ["max_seqlen"], pb.TYPE_INT32, ["input_ids"])]
    # per token: [-1, H] after Triton's batch dim, the -1 set to each request's input_ids length by the scatter;
    # per request: [H] (Triton prepends the batch dim: [B, H] is one row per request)
    assert [(o.name, o.data_type, list(o.dims), o.HasField("reshape")) for o in c.output] == [
        ("last_hidden_state", pb.TYPE_FP16, [-1, HIDDEN], False), ("pooler_output", pb.TYPE_FP16, [HIDDEN], False)]
    assert [(list(b.target_name), b.kind, list(b.source_input)) for b in c.batch_output] == [
        (["last_hidden_state"], pb.BatchOutput.BATCH_SCATTER_WITH_INPUT_SHAPE, ["input_ids"])]
    assert not [n for n in os.listdir(tmp_path / "models") if n.startswith(".")]  # no stage left behind


@needs_triton
def test_distilbert_like_engine_has_no_token_types_or_pooler(tmp_path):
    engine = _engine(tmp_path, "distil.engine", token_types=False, pooler=False)
    target = triton.write_repository(engine, tmp_path / "models", name="distil")
    c = text_format.Parse((target / "config.pbtxt").read_text(), pb.ModelConfig())
    assert [i.name for i in c.input] == ["input_ids"] and [o.name for o in c.output] == ["last_hidden_state"]
    assert c.max_batch_size == 4096 // 512  # default: max_batch requests of max_seqlen tokens fit max_tokens


def test_limits_refused(tmp_path):
    engine = _engine(tmp_path)
    with pytest.raises(triton.TritonError, match="exceeds the engine profile's max batch 64"):
        triton.write_repository(engine, tmp_path / "models", max_batch=65)
    with pytest.raises(triton.TritonError, match="exceed the profile's max tokens 4096"):
        triton.write_repository(engine, tmp_path / "models", max_batch=9)
    assert not (tmp_path / "models" / "bert").exists()


@pytest.mark.parametrize("io, message", [("padded", "padded I/O form.*packed"), ("decoder_step", "encoder-decoder")])
def test_padded_and_seq2seq_engines_refused(tmp_path, io, message):
    engine = _engine(tmp_path, io=io)
    with pytest.raises(triton.TritonError, match=message):
        triton.write_repository(engine, tmp_path / "models")
    assert not (tmp_path / "models").exists() or _listing(tmp_path / "models") == []


def test_tensorrt_rtx_engine_refused(tmp_path, capsys):
    """Triton's TensorRT backend cannot load a TensorRT-RTX plan: refused by name, nothing written."""
    engine = _engine(tmp_path, built="tensorrt_rtx")
    with pytest.raises(triton.TritonError, match="built with tensorrt_rtx; Triton's TensorRT backend loads plans of"
                                                 " TensorRT only"):
        triton.write_repository(engine, tmp_path / "models")
    assert not (tmp_path / "models").exists() or _listing(tmp_path / "models") == []
    assert cli.main(["triton", str(engine), "--repository", str(tmp_path / "models")]) == EXIT_ERROR
    err = capsys.readouterr().err
    assert "tensorrt_rtx" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_corrupt_engine_leaves_no_half_written_model(tmp_path):
    engine = _engine(tmp_path)
    triton.write_repository(engine, tmp_path / "models", max_batch=4)
    before = {p: p.read_bytes() for p in (tmp_path / "models").rglob("*") if p.is_file()}
    engine.write_bytes(engine.read_bytes()[:-3])  # truncated: refused against the sidecar
    with pytest.raises(Exception, match="do not match the sidecar"):
        triton.write_repository(engine, tmp_path / "models", max_batch=8)
    assert {p: p.read_bytes() for p in (tmp_path / "models").rglob("*") if p.is_file()} == before


def test_failure_while_writing_keeps_the_previous_model(tmp_path, monkeypatch):
    engine = _engine(tmp_path)
    triton.write_repository(engine, tmp_path / "models", max_batch=4)
    before = _listing(tmp_path / "models")
    real = os.replace

    def fail_on_model(src, dst):
        if Path(dst) == tmp_path / "models" / "bert" and Path(src).name.startswith(".padfree-partial-"):
            # the new model's rename fails after the previous one was moved aside
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(os, "replace", fail_on_model)
    with pytest.raises(OSError, match="No space"):
        triton.write_repository(engine, tmp_path / "models", max_batch=8)
    monkeypatch.undo()
    assert _listing(tmp_path / "models") == before
    assert "max_batch_size: 4" in (tmp_path / "models" / "bert" / "config.pbtxt").read_text()


def test_cli(tmp_path, capsys):
    engine = _engine(tmp_path)
    assert cli.main(["triton", str(engine), "--repository", str(tmp_path / "models"), "--name", "enc"]) == 0
    assert (tmp_path / "models" / "enc" / "1" / "model.plan").is_file()
    assert cli.main(["triton", str(_engine(tmp_path, "p.engine", io="padded")), "--repository",
                     str(tmp_path / "models")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "padded I/O form" in err[0]


# ---- the Python-backend model (padfree.Runtime in model.py) ---------------------------------------

@needs_triton
def test_python_model_for_an_export_folder(tiny_bert_export, tmp_path):
    target = triton.write_python_model(tiny_bert_export, tmp_path / "models", name="bert", max_batch=16, instances=2,
                                       python_path=["/opt/site", "/opt/padfree"])
    files = {str(p.relative_to(target)) for p in target.rglob("*") if p.is_file()}
    import json

    text_files = json.loads((tiny_bert_export / "report.json").read_text())["text_files"]   # none for a built-in
    assert files == {"config.pbtxt", "1/model.py", "1/export/report.json", "1/export/model.padfree.onnx",
                     *(f"1/export/{f}" for f in text_files)}     # not the plain model.onnx
    copied = target / "1" / "export" / "model.padfree.onnx"
    assert copied.read_bytes() == (tiny_bert_export / "model.padfree.onnx").read_bytes()
    c = text_format.Parse((target / "config.pbtxt").read_text(), pb.ModelConfig())
    assert c.backend == "python" and c.max_batch_size == 16 and not c.batch_input and not c.batch_output
    assert [(i.name, i.data_type, list(i.dims), i.allow_ragged_batch, i.optional) for i in c.input] == [
        ("input_ids", pb.TYPE_INT32, [-1], True, False), ("token_type_ids", pb.TYPE_INT32, [-1], True, True)]
    assert [(o.name, o.data_type, list(o.dims)) for o in c.output] == [
        ("last_hidden_state", pb.TYPE_FP32, [-1, 128]), ("pooler_output", pb.TYPE_FP32, [128])]
    params = {k: v.string_value for k, v in c.parameters.items()}
    assert params["runtime"] == "onnxruntime" and params["source"] == "export"
    assert params["python_path"] == os.pathsep.join(["/opt/site", "/opt/padfree"])
    assert [(g.count, g.kind) for g in c.instance_group] == [(2, pb.ModelInstanceGroup.KIND_CPU)]


@needs_triton
@pytest.mark.parametrize("arch, pooler, types", [("tiny-bert", True, True), ("tiny-distilbert", False, False)])
def test_python_model_for_an_hf_directory(tmp_path, arch, pooler, types):
    pytest.importorskip("transformers")
    from padfree.export import models

    config_cls, model_cls, fields = models.BUILTIN[arch]
    models.build(config_cls, model_cls, seed=1, **fields).save_pretrained(tmp_path / "hf")
    target = triton.write_python_model(tmp_path / "hf", tmp_path / "models", dtype="bfloat16")
    assert target.name == "hf"
    copied = target / "1" / "hf" / "model.safetensors"
    assert copied.read_bytes() == (tmp_path / "hf" / "model.safetensors").read_bytes()
    c = text_format.Parse((target / "config.pbtxt").read_text(), pb.ModelConfig())
    assert [i.name for i in c.input] == ["input_ids"] + (["token_type_ids"] if types else [])
    # bfloat16 leaves the Runtime's numpy output as float32
    want = [("last_hidden_state", pb.TYPE_FP32, [-1, 128])]
    want += [("pooler_output", pb.TYPE_FP32, [128])] if pooler else []
    assert [(o.name, o.data_type, list(o.dims)) for o in c.output] == want
    params = {k: v.string_value for k, v in c.parameters.items()}
    assert (params["runtime"], params["source"], params["dtype"]) == ("torch", "hf", "bfloat16")
    assert {k: params[k] for k in triton.python_backend.TORCH_GRAPHS} == \
        {k: str(v) for k, v in triton.python_backend.TORCH_GRAPHS.items()}
    assert [g.kind for g in c.instance_group] == [pb.ModelInstanceGroup.KIND_GPU]
    # the graph options are the config's, changed where asked; only for an HF directory's model
    target = triton.write_python_model(tmp_path / "hf", tmp_path / "other", graphs={"capture_after": 3})
    params = {k: v.string_value for k, v in text_format.Parse((target / "config.pbtxt").read_text(),
                                                              pb.ModelConfig()).parameters.items()}
    kept = str(triton.python_backend.TORCH_GRAPHS["max_graphs"])
    assert (params["capture_after"], params["max_graphs"]) == ("3", kept)
    with pytest.raises(triton.TritonError, match="only an HF directory's model takes"):
        triton.write_python_model(tmp_path / "hf", tmp_path / "other2", graphs={"warmup": 1})


def test_python_model_refusals(tiny_bert_export, tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    with pytest.raises(triton.TritonError, match="not an engine file, a `padfree export` folder"):
        triton.write_python_model(tmp_path / "empty", tmp_path / "models")
    seq2seq = tmp_path / "s2s"
    seq2seq.mkdir()
    (seq2seq / "seq2seq.json").write_text("{}")
    with pytest.raises(triton.TritonError, match="encoder-decoder export"):
        triton.write_python_model(seq2seq, tmp_path / "models")
    assert cli.main(["triton", str(tiny_bert_export), "--repository", str(tmp_path / "models"),
                     "--dtype", "float16"]) == 2
    assert cli.main(["triton", str(_engine(tmp_path)), "--repository", str(tmp_path / "models"),
                     "--python-path", "/x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and "--dtype applies to an HF model directory" in err[0] and "--python-path apply" in err[1]
    assert not (tmp_path / "models").exists() or _listing(tmp_path / "models") == []


def test_cli_writes_the_python_model(tiny_bert_export, tmp_path):
    assert cli.main(["triton", str(tiny_bert_export), "--repository", str(tmp_path / "models"), "--name", "cpu"]) == 0
    assert (tmp_path / "models" / "cpu" / "1" / "model.py").read_bytes() == \
        (Path(triton.__file__).parent / "model.py").read_bytes()
