"""CTranslate2 as bench/generate.py's peer (CPU): bench/ctranslate2_peer.py converts a random-weight Marian /
M2M100 model with its stand-in vocabulary, and its translate options make CT2's greedy output equal
HF generate's in float32, token for token, at the benchmark's exact length (HF's forced eos on Marian)
and at free lengths (eos at mixed steps). An independent check of the vocabulary, the start token and
the length mapping that the GPU timing relies on. Tests that run CTranslate2 skip where it is not
installed (pip install ctranslate2: it has a CPU build)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import ctranslate2_peer as peer  # noqa: E402
from _seq2seq import build, config_for, hf_generate, random_sources  # noqa: E402

NO_CT2 = "ctranslate2 is not installed (pip install ctranslate2)"


def _ctranslate2():
    return pytest.importorskip("ctranslate2", reason=NO_CT2)


@pytest.fixture(params=["marian", "m2m100"])
def converted(request, tmp_path, seed):
    """A decisive tiny model of the family (fresh weights), saved without a tokenizer, converted, and
    loaded in CTranslate2 on the CPU in float32."""
    ctranslate2 = _ctranslate2()
    model = build(request.param, seed=seed)
    model.save_pretrained(tmp_path / "hf")
    ct2_dir = peer.convert(str(tmp_path / "hf"), str(tmp_path / "ct2"))
    return model, ctranslate2.Translator(ct2_dir, device="cpu", compute_type="float32")


def _without_padding(sequences, pad: int) -> list[list[int]]:
    """HF's rows with the padding after the end dropped (position 0 is the start token, pad on Marian)."""
    return [row[:1] + [t for t in row[1:] if t != pad] for row in sequences.tolist()]


@pytest.mark.parametrize("max_new, min_new", [(10, 10), (10, 0)], ids=["exact", "free"])
def test_greedy_equals_hf_float32(converted, seed, max_new, min_new):
    model, translator = converted
    sources = random_sources(model.config, 32, seed=seed)
    tokenizer = peer.StandInTokenizer(model.config)
    options, append_eos = peer.translate_options(model.generation_config, num_beams=1, max_new_tokens=max_new,
                                                 min_new_tokens=min_new)
    results = translator.translate_batch([tokenizer.convert_ids_to_tokens(s) for s in sources], **options)
    ours = peer.hf_sequences([r.hypotheses[0] for r in results], tokenizer, model.config.decoder_start_token_id,
                             max_new, append_eos)
    theirs = _without_padding(hf_generate(model, sources, num_beams=1, max_new_tokens=max_new,
                                          min_new_tokens=min_new), model.config.pad_token_id)
    assert ours == theirs
    if min_new == max_new:
        assert {len(row) for row in theirs} == {1 + max_new}
        if model.config.model_type == "marian":   # HF's forced eos, which CT2 leaves to the caller
            assert {row[-1] for row in theirs} == {model.config.eos_token_id}


def test_stand_in_vocabulary_names_the_special_ids():
    tokens = peer.stand_in_tokens(config_for("m2m100"))
    assert tokens[:5] == ["<s>", "<pad>", "</s>", "<unk>", "t4"] and len(tokens) == 97
    tokens = peer.stand_in_tokens(config_for("marian"))
    assert tokens[:3] == ["</s>", "<unk>", "t2"] and tokens[-1] == "<pad>" and len(set(tokens)) == 97


def test_what_ctranslate2_cannot_match_is_refused_by_name():
    with pytest.raises(peer.UnsupportedPeerModel, match="pad = decoder_start = the last id"):
        peer.stand_in_tokens(config_for("marian", pad_token_id=5, decoder_start_token_id=5))
    with pytest.raises(peer.UnsupportedPeerModel, match="model_type 'bart'"):
        peer.stand_in_tokens(config_for("bart"))
    import transformers
    generation_config = transformers.GenerationConfig(eos_token_id=2, forced_bos_token_id=7)
    with pytest.raises(peer.UnsupportedPeerModel, match="forced_bos_token_id=7"):
        peer.translate_options(generation_config, num_beams=4, max_new_tokens=8)


def test_bench_generate_quick_with_ctranslate2(tmp_path):
    """The benchmark's --ctranslate2 path end to end on the CPU: the column where CTranslate2 imports,
    the skip with its reason where it does not."""
    out = tmp_path / "gen.json"
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "bench", "generate.py"), "--quick", "--ctranslate2",
                           "--out", str(out)], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    try:
        import ctranslate2
    except ImportError:
        assert "CTranslate2 column skipped: ctranslate2 is not importable" in proc.stdout
        assert report["ctranslate2"] == "not importable" and report["ct2_skipped"]
        assert not any("ct2_ms" in row for row in report["rows"])
        return
    assert report["ctranslate2"] == ctranslate2.__version__ and "ct2_skipped" not in report
    assert report["ct2_options"]["tiny"]["max_decoding_length"] == 7    # 8 new tokens, the last HF's forced eos
    for row in report["rows"]:
        assert row["ct2_ms"] > 0 and row["padfree_vs_ct2"] == pytest.approx(row["ct2_ms"] / row["padfree_ms"])
        assert 0.0 <= row["sequences_equal_ct2_hf"] <= 1.0
    assert "CT2 ms" in proc.stdout
