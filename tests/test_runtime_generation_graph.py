"""padfree.Runtime over a seq2seq export's generation graph (generation.padfree.onnx, ONNX Runtime on the
CPU): the whole generation in one run with the options the graph was written with, HF's outputs
(sequences as wide as HF's, sequences_scores with beam search), any other option refused by name,
bad sources refused before anything runs, and `padfree run GRAPH --generate`. On a GPU, the engine backend's
run (EngineGeneration) with the graph standing in for the TensorRT engine no GPU here can execute.
"""
from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_graphsurgeon")

from padfree import Runtime, cli  # noqa: E402
from padfree._lib import PadfreeError  # noqa: E402
from padfree.ops._tensors import InputError  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import build, hf_generate, random_sources  # noqa: E402

WIDE = dict(d_model=128, heads=2, ffn=256)   # head_dim 64: the packed encoder's attention plugin
NEW_TOKENS = 10
GRAPH = "generation.padfree.onnx"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """(family, beams, layers) -> (HF model, export folder with the generation graph), made once per module;
    with beams, the model's generation_config returns every hypothesis."""
    done = {}

    def get(family, beams=1, layers=(2, 2)):
        key = family, beams, layers
        if key not in done:
            root = tmp_path_factory.mktemp(f"rt_gen_{family}_{beams}_{layers[0]}")
            model = build(family, layers=layers, **WIDE)
            if beams > 1:
                model.generation_config.num_beams = beams
                model.generation_config.num_return_sequences = beams
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.save_pretrained(root / "hf")
            assert cli.main(["export", str(root / "hf"), "-o", str(root / "out"), "--io", "packed",
                             "--num-beams", str(beams), "--generation-graph", str(NEW_TOKENS)]) == 0
            done[key] = model, root / "out"
        return done[key]
    return get


@pytest.mark.parametrize("family", ["marian", "m2m100", "bart", "mbart"])
def test_greedy_equals_hf(exported, family):
    model, out = exported(family)
    sources = random_sources(model.config, 6, seed=3)
    runtime = Runtime(str(out / GRAPH))
    found = runtime.generate(sources)        # the graph's max_new_tokens and search are the defaults
    want = hf_generate(model, sources, max_new_tokens=NEW_TOKENS, num_beams=1, do_sample=False)
    assert found.dtype == torch.int64 and found.shape == want.shape, (found.shape, want.shape)
    assert torch.equal(found, want)
    # the same options spelled out, and HF's dict output
    again = runtime.generate(sources, max_new_tokens=NEW_TOKENS, num_beams=1, return_dict_in_generate=True)
    assert torch.equal(again.sequences, want)


@pytest.mark.parametrize("family", ["marian", "bart"])
def test_beam_search_equals_hf(exported, family):
    model, out = exported(family, beams=4)
    sources = random_sources(model.config, 5, seed=4)
    found = Runtime(str(out / GRAPH)).generate(sources, return_dict_in_generate=True, output_scores=True)
    want = hf_generate(model, sources, max_new_tokens=NEW_TOKENS, num_beams=4, num_return_sequences=4,
                       return_dict_in_generate=True, output_scores=True)
    assert found.sequences.shape == want.sequences.shape, (found.sequences.shape, want.sequences.shape)
    assert torch.equal(found.sequences, want.sequences)
    torch.testing.assert_close(found.sequences_scores, want.sequences_scores.float(), rtol=0, atol=1e-4)
    plain = Runtime(str(out / GRAPH)).generate(sources)
    assert torch.equal(plain, want.sequences)


def test_beam_search_at_real_depth_equals_hf(exported):
    model, out = exported("marian", beams=4, layers=(12, 12))
    sources = random_sources(model.config, 3, seed=5)
    found = Runtime(str(out / GRAPH)).generate(sources, return_dict_in_generate=True, output_scores=True)
    want = hf_generate(model, sources, max_new_tokens=NEW_TOKENS, num_beams=4, num_return_sequences=4,
                       return_dict_in_generate=True, output_scores=True)
    assert torch.equal(found.sequences, want.sequences)
    torch.testing.assert_close(found.sequences_scores, want.sequences_scores.float(), rtol=0, atol=1e-4)


@pytest.mark.parametrize("options,named", [
    (dict(num_beams=5), "num_beams=5"),
    (dict(max_new_tokens=NEW_TOKENS - 1), f"max_new_tokens={NEW_TOKENS - 1}"),
    (dict(max_length=NEW_TOKENS), f"max_new_tokens={NEW_TOKENS - 1}"),
    (dict(length_penalty=0.5), "length_penalty=0.5"),
    (dict(early_stopping="never"), "early_stopping='never'"),
    (dict(num_return_sequences=2), "num_return_sequences=2"),
    (dict(repetition_penalty=1.3), "repetition_penalty=1.3"),
    (dict(no_repeat_ngram_size=2), "no_repeat_ngram_size=2"),
    (dict(min_new_tokens=3), "min_length=4"),
])
def test_options_the_graph_was_not_written_with_are_refused(exported, options, named):
    model, out = exported("marian", beams=4)
    runtime = Runtime(str(out / GRAPH))
    with pytest.raises(ValueError, match=f"{named}: {GRAPH} was written for") as caught:
        runtime.generate(random_sources(model.config, 2), **options)
    assert "export it again" in str(caught.value)


def test_sampling_is_refused_by_a_greedy_graph(exported):
    model, out = exported("marian")
    with pytest.raises(ValueError, match="do_sample=True"):
        Runtime(str(out / GRAPH)).generate(random_sources(model.config, 2), do_sample=True)


def test_bad_sources_are_refused_before_running(exported):
    model, out = exported("m2m100")
    runtime = Runtime(str(out / GRAPH))
    good = random_sources(model.config, 2)
    with pytest.raises(InputError, match="empty"):
        runtime.generate([good[0], []])
    with pytest.raises(InputError, match="vocab"):
        runtime.generate([good[0], [model.config.vocab_size + 3]])
    pad = model.config.pad_token_id
    with pytest.raises(InputError, match=f"padding id {pad}"):
        runtime.generate([good[0] + [pad]])
    too_long = [good[0][0]] * (model.config.max_position_embeddings + 10)
    with pytest.raises(InputError):
        runtime.generate([too_long])


def test_other_onnx_files_are_refused(exported, tmp_path):
    _, out = exported("marian")
    with pytest.raises(PadfreeError, match="not the generation graph of a seq2seq export"):
        Runtime(str(out / "decoder_step.padfree.onnx"))
    (tmp_path / "model.onnx").write_bytes(b"")
    with pytest.raises(PadfreeError, match="padfree export MODEL --io packed --generation-graph"):
        Runtime(str(tmp_path / "model.onnx"))


def test_padfree_run_generates_with_the_graph(exported, tmp_path, capsys):
    model, out = exported("marian", beams=4)
    sources = random_sources(model.config, 3, seed=6)
    (tmp_path / "ids.json").write_text(json.dumps(sources))
    capsys.readouterr()
    assert cli.main(["run", str(out / GRAPH), "--generate", "--input", str(tmp_path / "ids.json"),
                     "-o", str(tmp_path / "g.npz"), "-q"]) == 0
    printed = capsys.readouterr().out
    want = hf_generate(model, sources, max_new_tokens=NEW_TOKENS, num_beams=4, num_return_sequences=4,
                       return_dict_in_generate=True, output_scores=True)
    assert printed.count("(score ") == len(sources) * 4
    saved = np.load(tmp_path / "g.npz")
    np.testing.assert_array_equal(saved["sequences"], want.sequences.numpy())
    np.testing.assert_allclose(saved["sequences_scores"], want.sequences_scores.float().numpy(), rtol=0, atol=1e-4)
    assert cli.main(["run", str(out / GRAPH), "--generate", "--input", str(tmp_path / "ids.json"),
                     "--num-beams", "5"]) != 0
    assert "num_beams=5" in capsys.readouterr().err


def test_a_graph_with_its_weights_in_a_data_file_runs_from_a_read_only_folder(tmp_path, monkeypatch):
    """Past protobuf's 2 GB (NLLB-600M in float32) the export keeps the graph's weights in
    generation.padfree.onnx.data: the session reads them from there, writing nothing into the export's
    folder (here made read-only). The limit is lowered for the generation graph's save, so that a tiny
    model's graph takes that layout."""
    import padfree.export.onnx_files as onnx_files
    import padfree.export.seq2seq.pipeline as pipeline

    def save_model(model, path):
        if Path(path).name != GRAPH:
            return onnx_files.save_model(model, path)
        with monkeypatch.context() as patch:
            patch.setattr(onnx_files, "_PROTO_LIMIT", 10_000)
            return onnx_files.save_model(model, path)
    monkeypatch.setattr(pipeline, "save_model", save_model)
    model = build("marian", layers=(2, 2), **WIDE)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path / "hf")
    out = tmp_path / "out"
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(out), "--io", "packed", "--generation-graph",
                     str(NEW_TOKENS)]) == 0
    assert (out / f"{GRAPH}.data").is_file()
    before = sorted(p.name for p in out.iterdir())
    import onnx
    saved, save = [], onnx.save_model    # what is written, where (a root user ignores the folder's mode)
    monkeypatch.setattr(onnx, "save_model", lambda m, f, *a, **k: (saved.append(str(f)), save(m, f, *a, **k))[1])
    out.chmod(0o555)
    try:
        sources = random_sources(model.config, 4, seed=7)
        found = Runtime(str(out / GRAPH)).generate(sources)
    finally:
        out.chmod(0o755)
    assert sorted(p.name for p in out.iterdir()) == before
    assert not [f for f in saved if Path(f).resolve().is_relative_to(out.resolve())], saved
    assert torch.equal(found, hf_generate(model, sources, max_new_tokens=NEW_TOKENS, num_beams=1, do_sample=False))


@pytest.mark.gpu
def test_engine_generation_on_the_gpu_with_the_graph_standing_in_for_tensorrt(exported):
    """EngineGeneration's run on a GPU: its feeds as device tensors of the engine's input dtypes, the profile
    it picks, the outputs read back, HF's outputs built from them, with the engine's execution (which no
    TensorRT on these machines can do) replaced by the generation graph on ONNX Runtime behind the same
    interface. Equal to HF's generate (beam 4, every hypothesis)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device (EngineGeneration's run)")
    from padfree.engines.profiles import Profile
    from padfree.runtime.backends.engine_generation import EngineGeneration
    from padfree.runtime.backends.onnxrt_generation import OnnxrtGenerationGraph

    model, out = exported("marian", beams=4)
    graph = OnnxrtGenerationGraph(out / GRAPH)

    class GraphAsEngine:
        """EngineFile's interface over the graph's ONNX Runtime session."""
        device = torch.device("cuda", torch.cuda.current_device())
        profiles = [Profile(16, 2, 8), Profile(128, 8, 32)]
        runs: list = []

        def open_on_device(self):
            pass

        def profile_for(self, tokens, batch, seqlen, packed=True):
            return next(i for i, p in enumerate(self.profiles) if p.fits(tokens, batch, seqlen))

        def typed(self, name, tensor):
            return tensor.to(torch.int32)

        def run(self, index, feeds, stream):
            assert all(t.is_cuda and t.dtype == torch.int32 for t in feeds.values())
            self.runs.append(index)
            names = [o.name for o in graph.session.get_outputs()]
            found = graph.session.run(names, {name: t.cpu().numpy() for name, t in feeds.items()})
            return {name: torch.from_numpy(value).to(self.device) for name, value in zip(names, found)}

    gen = EngineGeneration.__new__(EngineGeneration)
    gen.engine, gen.path = GraphAsEngine(), out / "g.engine"
    super(EngineGeneration, gen).__init__(out, graph.facts, "g.engine")
    gen.device = gen.engine.device
    sources = random_sources(model.config, 5, seed=11)
    found = gen.generate(sources, return_dict_in_generate=True, output_scores=True)
    want = hf_generate(model, sources, num_beams=4, num_return_sequences=4, max_new_tokens=NEW_TOKENS,
                       return_dict_in_generate=True, output_scores=True)
    assert gen.engine.runs == [1]        # 5 sources: the second profile
    assert torch.equal(found.sequences, want.sequences.cpu())
    torch.testing.assert_close(found.sequences_scores, want.sequences_scores.cpu().float(), rtol=0, atol=1e-4)
