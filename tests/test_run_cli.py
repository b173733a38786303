"""`padfree run` (padfree.commands.run) on the CPU: the runtime is the backend test double."""
from __future__ import annotations

import argparse
import json

import numpy as np
import pytest
from _runtime_double import MAX_SEQLEN, VOCAB, ToyBackend, check_padded, expected_sequence, pad, random_sequences

from padfree.runtime import Runtime

# ---------------------------------------------------------------------------------------------
# `padfree run` (CPU: the runtime is the test double)
# ---------------------------------------------------------------------------------------------

def _cli(monkeypatch, argv, backend):
    from padfree.commands import run as runtime_cli

    monkeypatch.setattr(runtime_cli, "open_runtime", lambda args: Runtime(backend))
    parser = argparse.ArgumentParser()
    runtime_cli.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["run", *argv])
    return args.func(args)


def test_cli_json_list_writes_outputs(seed, tmp_path, monkeypatch, capsys):
    seqs, _ = random_sequences(np.random.default_rng(seed), 4)
    (tmp_path / "batch.json").write_text(json.dumps([s.tolist() for s in seqs]))
    assert _cli(monkeypatch, ["engine", "--input", str(tmp_path / "batch.json"), "-o",
                              str(tmp_path / "out.npz")], ToyBackend()) == 0
    printed = capsys.readouterr().out
    assert f"lengths {[len(s) for s in seqs]}" in printed and "pooler_output: [4, 5]" in printed
    saved = np.load(tmp_path / "out.npz")
    np.testing.assert_array_equal(saved["cu_seqlens"], np.cumsum([0] + [len(s) for s in seqs]))
    np.testing.assert_array_equal(saved["last_hidden_state"],
                                  np.concatenate([expected_sequence(s) for s in seqs]).astype(np.float32))


def test_cli_json_padded_and_random(seed, tmp_path, monkeypatch, capsys):
    seqs, types = random_sequences(np.random.default_rng(seed), 3)
    ids, mask = pad(seqs)
    (tmp_path / "batch.json").write_text(json.dumps({"input_ids": ids.tolist(), "attention_mask": mask.tolist(),
                                                     "token_type_ids": pad(types)[0].tolist()}))
    _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "--padded", "-o", str(tmp_path / "p.npz")],
         ToyBackend())
    check_padded(dict(np.load(tmp_path / "p.npz")), seqs, ids.shape[1], types)
    backend = ToyBackend(max_batch=2)
    _cli(monkeypatch, ["x", "--random", f"5,{MAX_SEQLEN}", "--seed", str(seed % 1000), "--padded"], backend)
    printed = capsys.readouterr().out
    assert "last_hidden_state: [5, " in printed and "pooler_output: [5, 5]" in printed
    assert len(backend.calls) == 3  # 5 sequences of at most 24 tokens, 2 per chunk


def test_cli_writes_exactly_the_named_file_and_checks_it_first(seed, tmp_path, monkeypatch):
    seqs, _ = random_sequences(np.random.default_rng(seed), 3)
    (tmp_path / "batch.json").write_text(json.dumps([s.tolist() for s in seqs]))
    out = tmp_path / "outputs.bin"  # np.savez(path) would have written outputs.bin.npz
    assert _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "-o", str(out)], ToyBackend()) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["batch.json", "outputs.bin"]  # no temporary left
    np.testing.assert_array_equal(np.load(out)["cu_seqlens"], np.cumsum([0] + [len(s) for s in seqs]))
    from padfree.outputs import OutputError
    backend = ToyBackend()
    with pytest.raises(OutputError, match="is a folder"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "-o", str(tmp_path)], backend)
    with pytest.raises(OutputError, match="is a file, not a folder"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "batch.json"), "-o", str(out / "o.npz")], backend)
    assert backend.calls == []  # refused before anything ran


def test_cli_reports_bad_input(tmp_path, monkeypatch):
    from padfree.arguments import CommandError
    (tmp_path / "bad.json").write_text(json.dumps([[1, 2], [VOCAB]]))
    with pytest.raises(CommandError, match="bad input: token id 100 at sequence 1"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "bad.json")], ToyBackend())
    (tmp_path / "odd.json").write_text(json.dumps({"ids": []}))
    with pytest.raises(CommandError, match="expected a list of token-id lists"):
        _cli(monkeypatch, ["x", "--input", str(tmp_path / "odd.json")], ToyBackend())
