"""`padfree bench MODEL` (padfree.bench.model): the argument handling and the file checks, each bad input
one line with exit status 2, and whole runs on the CPU over export folders (ONNX Runtime) with a file
of lengths and a file of texts: the sequences timed are the file's (token counts against the file and
against HF's tokenizer). The timings themselves are not a test's; GPU (-m gpu): the PyTorch path
against HF."""
from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from padfree.bench import model as bench_model  # noqa: E402
from padfree.cli import main  # noqa: E402
from padfree.commands import bench as bench_cli  # noqa: E402
from padfree.runtime import Limits  # noqa: E402


def bench(argv, capsys) -> tuple[int, str, str]:
    code = main(["bench", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code: int, err: str, *fragments: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("padfree bench: error:")]
    assert code == 2 and len(lines) == 1, err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    assert "Traceback" not in err


# ---- arguments -------------------------------------------------------------------------------------

def _parsed(*argv):
    import argparse
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return parser.parse_args(list(argv))


def test_each_mode_gets_its_own_defaults():
    bert = bench_cli.resolve(_parsed())
    assert (bert.reps, bert.warmup, bert.gemm_search, bert.layers) == (50, 10, "exhaustive", 12)
    assert bert.shapes == "1x128,16x256,64x512,128x128"
    mine = bench_cli.resolve(_parsed("m", "--lengths", "f"))
    assert (mine.reps, mine.warmup, mine.gemm_search, mine.batch_size, mine.dtype) == (5, 1, "heuristic", 128, "fp16")
    given = bench_cli.resolve(_parsed("m", "--texts", "f", "--reps", "3", "--gemm-search", "exhaustive"))
    assert (given.reps, given.gemm_search) == (3, "exhaustive")


@pytest.mark.parametrize("argv, fragments", [
    (["--lengths", "f.txt"], ("--lengths", "give MODEL first")),
    (["--batch-size", "4", "--dtype", "fp32"], ("--batch-size, --dtype", "give MODEL first")),
    (["m", "--lengths", "f.txt", "--shapes", "1x128", "--profile"], ("--shapes, --profile", "leave them out")),
    (["m"], ("--lengths FILE", "--texts FILE")),
])
def test_options_of_the_other_mode_are_refused_in_one_line(argv, fragments, capsys):
    one_line_error(*bench(argv, capsys)[::2], *fragments)


def test_lengths_and_texts_exclude_each_other(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "m", "--lengths", "a", "--texts", "b"])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("content, fragments", [
    ("", ("holds no lengths",)),
    ("12\n7\nabc\n", ("line 3", "expected one integer", "'abc'")),
    ("12\n\n7\n", ("line 2", "expected one integer")),
    ("3\n0\n", ("line 2", "at least 1 token")),
    ("-4\n", ("line 1", "at least 1 token")),
    ("2.5\n", ("line 1", "'2.5'")),
])
def test_a_malformed_lengths_file_fails_before_the_model_loads(tmp_path, content, fragments, capsys):
    (tmp_path / "lengths.txt").write_text(content)
    # the model does not exist: the file is read first
    code, _, err = bench([str(tmp_path / "no-model"), "--lengths", str(tmp_path / "lengths.txt")], capsys)
    one_line_error(code, err, str(tmp_path / "lengths.txt"), *fragments)


def test_a_missing_lengths_file_is_one_line(tmp_path, capsys):
    code, _, err = bench(["m", "--lengths", str(tmp_path / "absent.txt")], capsys)
    one_line_error(code, err, "cannot read lengths")


def test_an_unknown_model_is_one_line(tmp_path, capsys):
    (tmp_path / "lengths.txt").write_text("5\n")
    code, _, err = bench([str(tmp_path / "nothing-here"), "--lengths", str(tmp_path / "lengths.txt")], capsys)
    one_line_error(code, err, "neither an engine file nor a `padfree export` folder")


def test_random_sequences_keep_the_lengths_and_avoid_a_padding_id(seed):
    lengths = np.random.default_rng(seed).integers(1, 50, 40).tolist()
    limits = Limits(max_tokens=4096, max_batch=64, max_seqlen=64, vocab_size=30, position_pad_id=1)
    seqs = bench_model.random_sequences(lengths, limits, seed)
    assert [len(s) for s in seqs] == lengths
    ids = np.concatenate(seqs)
    assert ids.min() >= 2 and ids.max() < 30 and len(set(ids.tolist())) == 28   # every allowed id, no other


def test_the_encoder_keeps_a_graph_for_every_bucket_the_batches_use():
    """Buckets worked out by hand (tokens up to a multiple of 64, batch and max_seqlen up to powers of
    two, max_seqlen at least 16), chunks of at most max_batch 4 sequences."""
    import types
    encoder = types.SimpleNamespace(use_graphs=True, max_graphs=2, weights=types.SimpleNamespace(max_seqlen=128))
    runtime = types.SimpleNamespace(backend=types.SimpleNamespace(encoder=encoder),
                                    limits=Limits(max_tokens=1000, max_batch=4, max_seqlen=128))
    batches = [[[1] * 10] * 3,            # 30 tokens -> (64, 4, 16)
               [[1] * 12] * 3,            # the same bucket
               [[1] * 10] * 5,            # chunks of 4 -> (64, 4, 16) and 1 -> (64, 1, 16)
               [[1] * 100]]               # (128, 1, 128)
    assert bench_model.keep_every_graph(runtime, batches) == 3 and encoder.max_graphs == 3
    encoder.max_graphs = 8
    assert bench_model.keep_every_graph(runtime, batches) == 3 and encoder.max_graphs == 8   # never lowered
    encoder.use_graphs = False
    assert bench_model.keep_every_graph(runtime, batches) is None


def test_max_graphs_is_settable_on_the_encoder():
    from _encoder_models import cpu_encoder, make_model

    from padfree.ops import InputError
    encoder = cpu_encoder(make_model("bert", hidden=64, heads=2))
    assert encoder.max_graphs == 8
    encoder.max_graphs = 20
    assert encoder.max_graphs == 20
    for bad in (0, -1, 2.5, True):
        with pytest.raises(InputError, match="max_graphs"):
            encoder.max_graphs = bad


# ---- whole runs on the CPU (export folders on ONNX Runtime) ----------------------------------------

def test_lengths_over_the_model_limit_are_named(tiny_bert_export, tmp_path, capsys):
    (tmp_path / "lengths.txt").write_text("5\n128\n129\n")
    code, _, err = bench([str(tiny_bert_export), "--lengths", str(tmp_path / "lengths.txt")], capsys)
    one_line_error(code, err, "line 3", "length 129 exceeds this model's limit of 128", "max_seqlen")


def test_pytorch_path_without_a_gpu_is_one_line(tmp_path, capsys):
    import torch
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: the PyTorch path runs")
    (tmp_path / "lengths.txt").write_text("5\n")
    code, _, err = bench(["tiny-bert", "--lengths", str(tmp_path / "lengths.txt")], capsys)
    one_line_error(code, err, "no CUDA device", "export")


def test_a_run_on_lengths_times_the_files_sequences(tiny_bert_export, tmp_path, capsys, seed):
    lengths = np.random.default_rng(seed).integers(1, 129, 21).tolist()
    lengths[0], lengths[-1] = 1, 128
    (tmp_path / "lengths.txt").write_text("".join(f"{n}\n" for n in lengths))
    out = tmp_path / "result.json"
    code, printed, err = bench([str(tiny_bert_export), "--lengths", str(tmp_path / "lengths.txt"), "--batch-size", "8",
                                "--reps", "2", "--warmup", "0", "--out", str(out)], capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    s = result["sequences"]
    assert (s["count"], s["total_tokens"], s["batches"], s["shortest"], s["longest"]) == \
        (21, sum(lengths), 3, 1, 128)
    assert list(result["systems"]) == ["padfree"] and result["device"] == "cpu"   # no HF beside an export
    padfree = result["systems"]["padfree"]
    lat = padfree["latency_ms"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["max"]
    assert padfree["tokens_per_s"] == pytest.approx(padfree["sequences_per_s"] * sum(lengths) / 21)
    assert f"{len(lengths)} sequences, {sum(lengths)} tokens" in printed


def test_a_run_on_texts_tokenizes_them_with_the_models_tokenizer(tmp_path, capsys, seed):
    pytest.importorskip("onnx_graphsurgeon")
    pytest.importorskip("onnxruntime")
    import transformers
    from _tokenizers import WORDS, write_wordpiece
    from test_export_sentence import sentence_dir

    from padfree.export.pipeline import export

    st = sentence_dir(tmp_path / "st", "mean", normalize=True)        # max_seq_length 64
    write_wordpiece(st)
    export(st, tmp_path / "out")
    rng = np.random.default_rng(seed)
    words = [w for w in WORDS if not w.startswith("##")]
    texts = [" ".join(str(w) for w in rng.choice(words, int(n))) for n in rng.integers(1, 40, 13)]
    (tmp_path / "texts.txt").write_text("\n".join(texts) + "\n")
    out = tmp_path / "result.json"
    code, _, err = bench([str(tmp_path / "out"), "--texts", str(tmp_path / "texts.txt"), "--batch-size", "4",
                          "--reps", "1", "--out", str(out)], capsys)
    assert code == 0, err
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(st))
    want = sum(len(ids) for ids in tokenizer(texts)["input_ids"])
    result = json.loads(out.read_text())
    assert (result["sequences"]["count"], result["sequences"]["total_tokens"]) == (13, want)

    (tmp_path / "long.txt").write_text("short text\n" + " ".join(["cat"] * 70) + "\n")
    code, _, err = bench([str(tmp_path / "out"), "--texts", str(tmp_path / "long.txt")], capsys)
    one_line_error(code, err, "text 1 has 72 tokens", "--truncate")
    code, _, err = bench([str(tmp_path / "out"), "--texts", str(tmp_path / "long.txt"), "--truncate", "--reps", "1"],
                         capsys)
    assert code == 0, err
    (tmp_path / "blank.txt").write_text("a cat\n\nthe dog\n")
    code, _, err = bench([str(tmp_path / "out"), "--texts", str(tmp_path / "blank.txt")], capsys)
    one_line_error(code, err, "line 2 is blank")


# ---- GPU: the PyTorch path against HF --------------------------------------------------------------

@pytest.mark.gpu
@pytest.mark.parametrize("sentence", [False, True])
def test_gpu_pytorch_path_against_hf(tmp_path, capsys, seed, sentence):
    pytest.importorskip("onnx_graphsurgeon")
    from _tokenizers import write_wordpiece
    from test_export_sentence import sentence_dir

    model = "tiny-bert"
    if sentence:
        model = str(sentence_dir(tmp_path / "st", "mean", normalize=True))
        write_wordpiece(tmp_path / "st")
    lengths = np.random.default_rng(seed).integers(1, 65, 50).tolist()
    (tmp_path / "lengths.txt").write_text("".join(f"{n}\n" for n in lengths))
    out = tmp_path / "result.json"
    code, _, err = bench([model, "--lengths", str(tmp_path / "lengths.txt"), "--batch-size", "16", "--reps", "2",
                          "--dtype", "fp32", "--out", str(out)], capsys)
    assert code == 0, err
    result = json.loads(out.read_text())
    assert set(result["systems"]) == {"padfree", "hf"} and result["graph_buckets"] >= 1
    agreement = result["hf_agreement"]
    assert agreement["output"] == ("sentence_embedding" if sentence else "last_hidden_state")
    assert agreement["max_abs_diff"] < 1e-2      # fp32 both; a wrong output differs by O(1)
