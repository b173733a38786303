"""Seq2seq export (padfree export on Marian / M2M100 / BART directories) and its CPU proof.

Tiny random models from configs (tests/_seq2seq.py: decisive weights, eos at mixed lengths), one of
them 6+6 layers, saved as HF directories and exported; then generation on ONNX Runtime from the
export's graphs, driven by padfree.generation's searches, must equal HF's generate in float32: greedy
token for token, beam 4 token for token with sequences_scores within 1e-4 (near-ties counted, bounded;
padfree.export.seq2seq.check). A perturbed weight in decoder_step.onnx must fail that check, and
unsupported models and options are refused by name.
"""
from __future__ import annotations

import json
import os
import shutil
import sys
import warnings

import onnx
import pytest
import torch
from onnx import numpy_helper

import padfree
from padfree import cli
from padfree.export import export
from padfree.export.errors import ExportError
from padfree.export.seq2seq import check as seq2seq_check
from padfree.export.seq2seq.ops import CROSS_ATTENTION, SELF_ATTENTION, site_problems, sites_of

sys.path.insert(0, os.path.dirname(__file__))
from _seq2seq import build, hf_generate, random_sources  # noqa: E402

FILES = ("encoder.onnx", "cross_kv.onnx", "decoder_step.onnx", "decoder_step.padfree.onnx", "config.json",
         "generation_config.json", "seq2seq.json")
CASES = {"marian": ("marian", (2, 2)), "m2m100-6x6": ("m2m100", (6, 6)), "bart": ("bart", (2, 2))}


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """name -> (model, HF directory, export folder), exported once per module."""
    done = {}

    def get(name):
        if name not in done:
            family, layers = CASES[name]
            model = build(family, layers=layers)
            root = tmp_path_factory.mktemp(name)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                model.save_pretrained(root / "hf")
            export(root / "hf", root / "out")
            done[name] = (model, root / "hf", root / "out")
        return done[name]
    return get


@pytest.mark.parametrize("name", list(CASES))
def test_export_writes_the_files(exported, name):
    model, _, out = exported(name)
    for f in FILES:
        assert (out / f).is_file(), f
    manifest = json.loads((out / "seq2seq.json").read_text())
    layers = CASES[name][1][1]
    assert manifest["family"] == CASES[name][0]
    assert manifest["decoder"]["layers"] == layers
    assert manifest["sites"] == {SELF_ATTENTION: layers, CROSS_ATTENTION: layers}
    step = onnx.load(out / "decoder_step.onnx")
    onnx.checker.check_model(step, full_check=True)
    onnx.checker.check_model(onnx.load(out / "cross_kv.onnx"), full_check=True)
    assert [i.name for i in step.graph.input] == manifest["decoder"]["inputs"]
    assert [o.name for o in step.graph.output] == manifest["decoder"]["outputs"]
    logits = step.graph.output[0].type.tensor_type.shape.dim
    assert logits[1].dim_value == model.config.vocab_size
    types = {i.name: i.type.tensor_type.elem_type for i in step.graph.input}
    for name_ in ("input_ids", "step", "cache_indir", "cu_seqlens"):
        assert types[name_] == onnx.TensorProto.INT32, name_


@pytest.mark.parametrize("name", list(CASES))
def test_sites_are_closed_for_a_mechanical_swap(exported, name):
    _, _, out = exported(name)
    step = onnx.load(out / "decoder_step.onnx")
    sites = sites_of(step)
    assert len(sites) == 2 * CASES[name][1][1]
    for site in sites:
        assert site_problems(step, site) == [], site.scope
        assert site.fields["softmax_scale"] == 1.0       # the scale is folded into the Q weights
    self_attn = [s for s in sites if s.op == SELF_ATTENTION]
    assert set(self_attn[0].inputs) == {"qkv", "qkv_bias", "k_cache", "v_cache", "cache_indir", "step"}
    # each layer's written caches are the step's present_* outputs
    feeds = {n.output[0]: n.input[0] for n in step.graph.node if n.op_type == "Identity"}
    for i, site in enumerate(self_attn):
        assert feeds[f"present_key.{i}"] == site.outputs["k_cache_out"]
        assert feeds[f"present_value.{i}"] == site.outputs["v_cache_out"]


@pytest.mark.parametrize("name", list(CASES))
def test_onnxruntime_generation_equals_hf(exported, name):
    model, _, out = exported(name)
    result = seq2seq_check.check(out, model, batch=8, max_seqlen=12, max_new_tokens=12, num_beams=4, seed=3)
    print("\n".join(result.lines))
    assert result.ok, "\n".join(result.lines)
    assert result.lengths[:2] == [12, 1] and len(set(result.lengths)) > 3


def test_runtime_generate_over_the_export_and_the_pytorch_path(exported):
    import padfree.torch as pt

    model, _, out = exported("marian")
    sources = random_sources(model.config, 5, seed=11)
    options = dict(num_beams=4, max_new_tokens=10, return_dict_in_generate=True, output_scores=True)
    ref = hf_generate(model, sources, **options)
    onnx_out = padfree.Runtime(str(out)).generate(sources, **options)
    torch_out = padfree.Runtime(pt.from_hf(model, dtype=torch.float32, device="cpu")).generate(sources, **options)
    for got in (onnx_out, torch_out):
        assert torch.equal(got.sequences, ref.sequences)
        assert torch.allclose(got.sequences_scores, ref.sequences_scores, atol=1e-4, rtol=0)
    greedy = padfree.Runtime(str(out)).generate(sources, max_new_tokens=10)
    assert torch.equal(greedy, hf_generate(model, sources, max_new_tokens=10))
    with pytest.raises(TypeError, match="generate"):
        padfree.Runtime(str(out)).run(sources)
    from padfree.generation import UnsupportedOptionError
    with pytest.raises(UnsupportedOptionError, match="typical_p"):
        padfree.Runtime(str(out)).generate(sources, do_sample=True, typical_p=0.5)


def test_a_wrong_weight_is_caught(exported, tmp_path):
    model, _, out = exported("marian")
    bad = tmp_path / "bad"
    shutil.copytree(out, bad)
    step = onnx.load(bad / "decoder_step.onnx")
    target = next(t for t in step.graph.initializer if t.name == "decoder.layers.1.encoder_attn.out_proj.weight")
    value = numpy_helper.to_array(target).copy()
    value[3] *= 1.5        # one output feature's row of one projection
    target.CopyFrom(numpy_helper.from_array(value, target.name))
    onnx.save(step, bad / "decoder_step.onnx")
    result = seq2seq_check.check(bad, model, batch=8, max_seqlen=12, max_new_tokens=12, num_beams=4, seed=3)
    print("\n".join(result.lines))
    assert not result.ok


def test_cli_export_and_check(tmp_path, capsys):
    model = build("bart", layers=(2, 2), seed=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model.save_pretrained(tmp_path / "hf")
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "out")]) == 0
    assert "2 self-attention and 2 cross-attention sites" in capsys.readouterr().out
    assert cli.main(["check", str(tmp_path / "out"), "--batch", "6", "--max-new-tokens", "10"]) == 0
    printed = capsys.readouterr().out
    assert "PASS" in printed and "greedy: 6 of 6" in printed
    # an export over an old one leaves only the new files; report.json of an encoder export goes too
    (tmp_path / "out" / "report.json").write_text("{}")
    assert cli.main(["export", str(tmp_path / "hf"), "-o", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == sorted(FILES)


def test_refusals_name_the_model_or_option(tmp_path):
    import transformers

    model = build("marian", layers=(1, 1))
    with pytest.raises(ExportError, match="dtype must be one of fp32, fp16, bf16, got 'int8'"):
        export(model, tmp_path / "a", dtype="int8")
    with pytest.raises(ExportError, match="--io ragged"):
        export(model, tmp_path / "b", io="ragged")
    with pytest.raises(ExportError, match="--allow-partial"):
        export(model, tmp_path / "c", allow_partial=True)
    tanh = build("marian", layers=(1, 1), activation_function="tanh")
    with pytest.raises(ExportError, match="activation_function='tanh'"):
        export(tanh, tmp_path / "d")
    t5 = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=64, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4, decoder_start_token_id=0))
    with pytest.raises(ExportError, match="T5ForConditionalGeneration"):
        export(t5, tmp_path / "e")
    assert not any((tmp_path / d).exists() and any((tmp_path / d).iterdir()) for d in "abcde")
