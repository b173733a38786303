"""generation.padfree.onnx (`padfree export --io packed --generation-graph N`): a whole generation in one
graph (the packed encoder, cross_kv and an ONNX Loop of N decoder steps with their plugin nodes), greedy
or, with --num-beams K, beam search with HF's bookkeeping inside the loop; proven by `padfree check` on
ONNX Runtime against HF's generate (greedy token for token; beam search every returned hypothesis with
its sequences_scores), refused where the export cannot honour the model's options, and built into one
engine by TensorRT-RTX.
"""
from __future__ import annotations

import json
import os
import sys
import warnings

import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_graphsurgeon")

from padfree import cli  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import build, engine_prerequisites, random_sources  # noqa: E402

WIDE = dict(d_model=128, heads=2, ffn=256)   # head_dim 64: the packed encoder's attention plugin
NEW_TOKENS = 12


def _save(model, folder):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(folder)


@pytest.fixture(scope="module")
def generation_export(tmp_path_factory):
    """(family, num_beams) -> export folder with the generation graph (2+2 layers), made once per module;
    with beams, the model's generation_config returns every hypothesis (num_return_sequences = beams)."""
    done = {}

    def get(family, beams=1):
        if (family, beams) not in done:
            root = tmp_path_factory.mktemp(f"gen_{family}_{beams}")
            model = build(family, layers=(2, 2), **WIDE)
            if beams > 1:
                model.generation_config.num_beams = beams
                model.generation_config.num_return_sequences = beams
            _save(model, root / "hf")
            assert cli.main(["export", str(root / "hf"), "-o", str(root / "out"), "--io", "packed",
                             "--num-beams", str(beams), "--generation-graph", str(NEW_TOKENS)]) == 0
            done[family, beams] = root / "out"
        return done[family, beams]
    return get


@pytest.mark.parametrize("family", ["marian", "m2m100", "bart", "mbart"])
def test_the_generation_graph_equals_hf_greedy(generation_export, capsys, family):
    out = generation_export(family)
    manifest = json.loads((out / "seq2seq.json").read_text())
    assert manifest["files"]["generation"] == "generation.padfree.onnx"
    assert manifest["generation"] == {"search": "greedy", "max_new_tokens": NEW_TOKENS,
                                      "inputs": ["input_ids", "cu_seqlens", "max_seqlen"],
                                      "outputs": ["sequences", "lengths"]}
    model = onnx.load(str(out / "generation.padfree.onnx"))
    (loop,) = [n for n in model.graph.node if n.op_type == "Loop"]
    body = loop.attribute[0].g
    inside = [n for n in body.node if n.domain == "padfree"]
    assert {n.op_type for n in inside} == {"PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention",
                                           "PadfreeLogitsTopK", "PadfreeGreedyStep"}
    assert all(a.i == 1 for n in inside for a in n.attribute if a.name == "own_workspace")
    # the search's options are the nodes' fields: the pad token, and the top-1 of the raw logits
    (search,) = [n for n in inside if n.op_type == "PadfreeGreedyStep"]
    fields = {a.name: onnx.helper.get_attribute_value(a) for a in search.attribute}
    config = json.loads((out / "generation_config.json").read_text())
    assert fields["pad_token_id"] == config["pad_token_id"] and fields["has_eos"] == 1
    (topk,) = [n for n in inside if n.op_type == "PadfreeLogitsTopK"]
    fields = {a.name: onnx.helper.get_attribute_value(a) for a in topk.attribute}
    assert (fields["k"], fields["normalize"], fields["has_beam_scores"]) == (1, 0, 0)
    assert not body.initializer  # the step's weights are read from the outer scope
    capsys.readouterr()
    assert cli.main(["inspect", str(out), "--json"]) == 0
    facts = json.loads(capsys.readouterr().out)
    assert facts["generation"] == {"search": "greedy", "max_new_tokens": NEW_TOKENS}
    assert cli.main(["check", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("generation.padfree.onnx"))
    assert "greedy: 8 of 8 sequences equal HF's" in line, printed
    assert printed.rstrip().endswith("PASS")


@pytest.mark.parametrize("family", ["marian", "m2m100", "bart", "mbart"])
def test_the_beam_search_graph_equals_hf(generation_export, capsys, family):
    out = generation_export(family, beams=4)
    manifest = json.loads((out / "seq2seq.json").read_text())
    assert manifest["generation"]["search"] == "beam" and manifest["generation"]["num_beams"] == 4
    assert manifest["generation"]["outputs"] == ["sequences", "lengths", "scores"]
    model = onnx.load(str(out / "generation.padfree.onnx"))
    (loop,) = [n for n in model.graph.node if n.op_type == "Loop"]
    inside = {n.op_type for n in loop.attribute[0].g.node if n.domain == "padfree"}
    assert inside == {"PadfreeDecoderSelfAttention", "PadfreeDecoderCrossAttention", "PadfreeLogitsTopK",
                      "PadfreeBeamSearchStep", "PadfreeBeamReorder"}
    # the search's options are the bookkeeping node's fields, as the graph's metadata states them
    (search,) = [n for n in loop.attribute[0].g.node if n.op_type == "PadfreeBeamSearchStep"]
    fields = {a.name: onnx.helper.get_attribute_value(a) for a in search.attribute}
    facts = json.loads({p.key: p.value for p in model.metadata_props}["padfree.generation"])
    assert fields["num_beams"] == facts["num_beams"] == 4
    assert fields["length_penalty"] == pytest.approx(facts["length_penalty"])
    assert fields["early_stopping"] == {False: 0, True: 1, "never": 2}[facts["early_stopping"]]
    assert fields["has_eos"] == 1 and fields["own_workspace"] == 1
    capsys.readouterr()
    assert cli.main(["check", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("generation.padfree.onnx"))
    assert "beam search (4 beams, 4 returned): 32 of 32 hypotheses equal HF's" in line, printed
    assert printed.rstrip().endswith("PASS")


def test_a_wrong_weight_in_the_generation_graph_is_caught(generation_export, tmp_path, capsys):
    import shutil

    out = tmp_path / "out"
    shutil.copytree(generation_export("bart"), out)
    model = onnx.load(str(out / "generation.padfree.onnx"))
    target = next(t for t in model.graph.initializer if t.name == "step/decoder.layers.1.encoder_attn.out_proj.weight")
    weight = numpy_helper.to_array(target)
    target.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(1.5 * weight), target.name))
    onnx.save(model, str(out / "generation.padfree.onnx"))
    capsys.readouterr()
    assert cli.main(["check", str(out)]) == 1
    printed = capsys.readouterr().out
    assert "generation.padfree.onnx" in printed and printed.rstrip().endswith("FAIL: generation differs from HF's")


def test_refusals_name_the_option(tmp_path, capsys):
    model = build("bart", layers=(1, 1), **WIDE)
    _save(model, tmp_path / "hf")
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "a"), "--generation-graph", "8"]) == 2
    assert "add --io packed" in capsys.readouterr().err
    model.generation_config.no_repeat_ngram_size = 3
    _save(model, tmp_path / "ngram")
    assert cli.main(["export", str(tmp_path / "ngram"), "-o", str(tmp_path / "b"), "--io", "packed",
                     "--generation-graph", "8"]) == 2
    err = capsys.readouterr().err
    assert "no_repeat_ngram_size" in err and "padfree run --generate" in err
    assert not (tmp_path / "b").exists() or not any((tmp_path / "b").iterdir())  # refused before writing
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "d"), "--io", "packed",
                     "--generation-graph", "65"]) == 2     # max_position_embeddings 64: 64 new tokens at most
    assert "position table serves 64" in capsys.readouterr().err
    assert not (tmp_path / "d").exists() or not any((tmp_path / "d").iterdir())
    assert cli.main(["export", "tiny-bert", "-o", str(tmp_path / "c"), "--generation-graph", "8"]) == 2
    assert "encoder-decoder" in capsys.readouterr().err


def _build_engine(out, tmp_path) -> dict:
    """The export's generation graph built with TensorRT-RTX on the CPU (skipped where it cannot be):
    its sidecar metadata."""
    from padfree.engines.build import BuildOptions, build as build_engine

    _, library = engine_prerequisites()
    return build_engine(BuildOptions(onnx=str(out / "generation.padfree.onnx"), output=str(tmp_path / "g.engine"),
                                     max_tokens=64, max_batch=4, max_seqlen=16, plugin_library=str(library),
                                     backend="tensorrt_rtx", progress=False))


@pytest.mark.parametrize("beams", [1, 4])
def test_the_generation_graph_builds_into_one_engine(generation_export, tmp_path, beams):
    """TensorRT-RTX on the CPU: the encoder's plugins, cross_kv's MatMuls and the Loop with the decoder
    plugins (aliased caches, their own scratch; for beam search the top-k and the indirection reorder
    too) in one engine, profiled as a packed encoder."""
    metadata = _build_engine(generation_export("marian", beams), tmp_path)
    assert (tmp_path / "g.engine").stat().st_size > 0
    assert metadata["model"]["io"] == "generation"
    facts = metadata["model"]["generation"]   # what the engine generates, from the graph's metadata
    assert (facts["search"], facts["max_new_tokens"]) == ("beam" if beams > 1 else "greedy", NEW_TOKENS)
    assert facts.get("num_beams", 1) == beams
    assert metadata["preview_features"] == ["ALIASED_PLUGIN_IO_10_03"]
    assert metadata["profiles"][0]["shapes"]["cu_seqlens"] == {"min": [2], "opt": [3], "max": [5]}
    plugins = [layer["plugin"] for layer in metadata["plugin_layers"]]
    assert plugins.count("PadfreeDecoderSelfAttention") == 2 and plugins.count("PadfreeDecoderCrossAttention") == 2
    assert "PadfreeEmbLayerNorm" in plugins
    if beams > 1:
        assert plugins.count("PadfreeLogitsTopK") == 1 and plugins.count("PadfreeBeamReorder") == 1
        (search,) = [layer for layer in metadata["plugin_layers"] if layer["plugin"] == "PadfreeBeamSearchStep"]
        # the search's state as TensorRT types it: int64 sequences and lengths, int32 flags
        assert [o["dtype"] for o in search["outputs"]] == ["INT64", "FLOAT", "INT64", "FLOAT", "INT64", "INT32",
                                                            "INT32", "INT64", "INT32"]
    else:
        assert plugins.count("PadfreeLogitsTopK") == 1
        (search,) = [layer for layer in metadata["plugin_layers"] if layer["plugin"] == "PadfreeGreedyStep"]
        assert [o["dtype"] for o in search["outputs"]] == ["INT64", "INT64", "INT32", "INT64"]


def test_an_fp16_generation_graph_is_proven_rounded_and_builds(tmp_path, capsys):
    """--dtype fp16: the graph joins the fp16 engine graphs (the top-k reads the fp16 logits, the scores
    and the search stay float32); the check runs it cast back to float32 against the float32 graphs
    rounded to fp16 (the engine graphs' rule); TensorRT-RTX builds it."""
    model = build("marian", layers=(2, 2), **WIDE)
    _save(model, tmp_path / "hf")
    out = tmp_path / "out"
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(out), "--io", "packed", "--dtype", "fp16",
                     "--num-beams", "4", "--generation-graph", "8"]) == 0
    graph = onnx.load(str(out / "generation.padfree.onnx"))
    assert {t.data_type for t in graph.graph.initializer if t.name.startswith("step/decoder.layers.")} == \
        {onnx.TensorProto.FLOAT16}
    capsys.readouterr()
    assert cli.main(["check", str(out)]) == 0
    printed = capsys.readouterr().out
    line = next(x for x in printed.splitlines() if x.startswith("generation.padfree.onnx"))
    assert "fp16 cast back to float32): beam search (4 beams, 1 returned): 8 of 8 hypotheses equal the float32" \
        " graphs' rounded to fp16" in line, printed
    # Runtime over the fp16 graph runs it the same way: equal to the rounded float32 step graphs' generate
    from padfree import Runtime
    from padfree.runtime.backends.onnxrt_seq2seq import OnnxrtSeq2SeqGenerator
    sources = random_sources(model.config, 4, seed=2)
    found = Runtime(str(out / "generation.padfree.onnx")).generate(sources, return_dict_in_generate=True,
                                                                   output_scores=True)
    want = OnnxrtSeq2SeqGenerator(out, step="plain", rounded=True).generate(
        sources, num_beams=4, max_new_tokens=8, return_dict_in_generate=True, output_scores=True)
    assert torch.equal(found.sequences, want.sequences)
    torch.testing.assert_close(found.sequences_scores, want.sequences_scores.float(), rtol=0, atol=1e-4)
    metadata = _build_engine(out, tmp_path)
    assert metadata["precision"] == "fp16" and metadata["model"]["io"] == "generation"


def test_runtime_over_the_generation_engine_refuses_before_the_gpu(generation_export, tmp_path, capsys):
    """padfree.Runtime over a whole-generation engine (TensorRT-RTX builds it on the CPU): the export it came
    from is found beside it or given as export_dir; an option it was not built for, a batch outside its
    profiles and a bad source are refused by name before any GPU is looked for; a good call then needs one
    (TensorRT-RTX's runtime refuses the H100 / H200: the run itself is not tested here)."""
    import shutil

    from transformers import AutoConfig

    from padfree import Runtime
    from padfree.engines.errors import EngineError
    from padfree.ops._tensors import InputError

    out = generation_export("marian", 4)
    _build_engine(out, tmp_path)                  # tmp_path/g.engine: profiles up to 4 sources of 16 tokens
    engine = tmp_path / "g.engine"
    with pytest.raises(EngineError, match="holds no seq2seq export .* pass export_dir="):
        Runtime(str(engine))
    gen = Runtime(str(engine), export_dir=str(out))
    assert "EngineGeneration" in repr(gen.backend) and "beam search, 4 beams" in repr(gen.backend)
    config = AutoConfig.from_pretrained(out)
    sources = random_sources(config, 2, seed=3)
    with pytest.raises(ValueError, match="num_beams=8: g.engine was written for num_beams=4"):
        gen.generate(sources, num_beams=8)
    with pytest.raises(ValueError, match="max_new_tokens=5: g.engine was written for max_new_tokens="):
        gen.generate(sources, max_new_tokens=5)
    with pytest.raises(EngineError, match="a batch of 5 sequences.* exceeds every profile"):
        gen.generate(random_sources(config, 5, seed=3))
    with pytest.raises(EngineError, match="longest 17 exceeds every profile"):
        gen.generate([(sources[0] * 6)[:17]])
    with pytest.raises(InputError, match=r"input_ids\[1\]: the source is empty"):
        gen.generate([sources[0], []])
    if not torch.cuda.is_available():
        with pytest.raises(EngineError, match="needs a CUDA device"):
            gen.generate(sources)
    # the CLI finds the engine's export beside it (an engine built into the export's folder)
    beside = tmp_path / "export"
    shutil.copytree(out, beside)
    for name in ("g.engine", "g.engine.json"):
        shutil.copy(tmp_path / name, beside / name)
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(sources))
    capsys.readouterr()
    code = cli.main(["run", str(beside / "g.engine"), "--generate", "--input", str(ids), "--num-beams", "8"])
    assert code == 2 and "num_beams=8: g.engine was written for num_beams=4" in capsys.readouterr().err
