"""padfree bench's report (CPU): the targets each row is judged by and the table's ratios, and the commit
a result records. The timings themselves are the benchmark's (bench/bert.py on the device), never a
test's."""
from __future__ import annotations

from padfree.bench import report, timing
from padfree.commands import bench as bench_cli


def row(batch, max_seqlen, padfree, compile_ms, floor):
    ms = {"padfree": padfree, "compile": compile_ms, "floor": floor, "padfree_packed": padfree * 1.1}
    return {"batch": batch, "max_seqlen": max_seqlen, "total_tokens": batch * max_seqlen // 2, "ms": ms,
            "ratios": {"padfree_over_floor": padfree / floor, "packed_over_floor": padfree * 1.1 / floor,
                       "compile_over_padfree": compile_ms / padfree}}


def test_targets_judge_latency_at_1x128_and_ratios_elsewhere():
    assert report._targets(row(1, 128, 0.399, 0.9, 0.25)) == "ok"
    assert report._targets(row(1, 128, 0.401, 9.0, 0.3)) == "MISS"
    assert report._targets(row(64, 512, 8.0, 16.1, 6.2)) == "ok"
    assert report._targets(row(64, 512, 8.1, 16.1, 6.2)) == "MISS"  # 1.99x
    assert report._targets(row(16, 256, 1.3, 3.0, 0.8)) == "MISS"   # 1.63x the floor


def test_table_prints_the_ratios(capsys):
    report.print_table([row(64, 512, 8.0, 16.4, 6.2)])
    line = capsys.readouterr().out.splitlines()[1]
    assert "1.29" in line and "1.42" in line and "2.05" in line and line.endswith("ok")


def test_table_leaves_out_what_a_system_alone_cannot_judge(capsys):
    hf_only = {"batch": 1, "max_seqlen": 128, "total_tokens": 93, "ms": {"hf_eager": 1.9}, "ratios": {}}
    report.print_table([hf_only])
    line = capsys.readouterr().out.splitlines()[1]
    assert "1.900" in line and line.endswith("n/a")


def _args(**kw):
    import argparse
    parser = argparse.ArgumentParser()
    bench_cli.add_arguments(parser)
    return bench_cli.resolve(parser.parse_args([a for k, v in kw.items()
                                                for a in ((f"--{k}",) if v is True else (f"--{k}", v))]))


def test_systems_follow_the_switches():
    assert bench_cli.chosen_systems(_args()) == ["hf", "compile", "padfree"]
    assert bench_cli.chosen_systems(_args(**{"no-hf": True})) == ["compile", "padfree"]
    assert bench_cli.chosen_systems(_args(**{"no-compile": True, "no-hf": True})) == ["padfree"]
    assert bench_cli.chosen_systems(_args(systems="compile")) == ["compile"]
    import pytest

    from padfree.arguments import CommandError
    with pytest.raises(CommandError, match="unknown systems"):
        bench_cli.chosen_systems(_args(systems="trt"))


def test_each_child_times_one_system_with_the_runs_settings():
    from padfree.bench import processes as bench_processes
    args = _args(shapes="1x128", reps="7", profile=True, **{"gemm-tuning": "t.json", "no-hf": True})
    padfree = bench_processes.child_argv(args, "padfree", "p.json")
    assert padfree[padfree.index("--systems") + 1] == "padfree" and padfree[padfree.index("--reps") + 1] == "7"
    assert {"--profile", "--no-hf", "--gemm-tuning"} <= set(padfree)
    compile_ = bench_processes.child_argv(args, "compile", "c.json")
    assert compile_[compile_.index("--shapes") + 1] == "1x128" and "--profile" not in compile_
    parsed = _args(**dict(zip([a[2:] for a in compile_[3::2]], compile_[4::2])))  # the child parses it
    assert parsed.systems == "compile" and parsed.out == "c.json"


def test_merge_joins_each_processes_times_and_judges_them_together():
    from padfree.bench import processes as bench_processes

    def result(ms, host):
        rows = [{"batch": 16, "max_seqlen": 256, "total_tokens": 2564, "ms": ms, "ratios": {}}]
        return {"device": "H100", "torch": "2.11", "date": f"2026-11-24T0{host}", "host_loop_ms": host, "rows": rows}
    merged = bench_processes.merge({
        "hf": result({"hf_eager": 3.0, "hf_sdpa": 2.5}, 1),
        "compile": result({"compile": 2.4}, 2),
        "padfree": result({"padfree": 1.1, "padfree_packed": 1.2, "floor": 0.8}, 3)})
    row = merged["rows"][0]
    assert row["ms"] == {"padfree": 1.1, "padfree_packed": 1.2, "floor": 0.8, "hf_eager": 3.0, "hf_sdpa": 2.5,
                         "compile": 2.4}
    assert abs(row["ratios"]["compile_over_padfree"] - 2.4 / 1.1) < 1e-12
    assert merged["host_loop_ms"] == {"hf": 1, "compile": 2, "padfree": 3} and merged["date"] == "2026-11-24T01"


def test_kernel_chain_takes_each_kernels_exposed_time_over_the_middle_steps():
    """A step of three kernels, the second starting before the first ends (PDL): its duration overstates
    what it adds, its exposed time is its end minus the first's. A step with a kernel more (a graph
    capture's first step, say) is left out, as are steps outside the middle half."""
    events = []
    for step in range(8):
        t = 100.0 * step
        events += [(t, t + 2, "step_embedding_kernel"), (t + 1, t + 6, "decode_linear_kernel"),
                   (t + 5, t + 9, "decoder_attention_kernel")]
        if step == 3:
            events.append((t + 9, t + 50, "an extra kernel"))
    events.append((800.0, 801.0, "step_embedding_kernel"))  # the last step's end marker
    chain = timing.kernel_chain(list(reversed(events)), "step_embedding")
    assert chain["kernels"] == 3 and chain["sequences"] == 3    # steps 2, 4 and 5 of the middle 2..5
    assert [r["exposed_us"] for r in chain["chain"]] == [2.0, 4.0, 3.0]
    assert [r["us"] for r in chain["chain"]] == [2.0, 5.0, 4.0]
    assert chain["span_us"] == 9.0 and chain["chain"][1]["kernel"] == "decode_linear_kernel"
    assert timing.kernel_chain([(0.0, 1.0, "step_embedding")], "step_embedding") is None


def test_commit_names_a_modified_tree(tmp_path):
    """record.commit: the HEAD commit, "+modified" once a tracked file differs from it (untracked files do
    not count), "unknown" outside a git checkout."""
    import subprocess

    from padfree.bench import record
    assert record.commit(str(tmp_path)) == "unknown"

    def git(*args):
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True).stdout

    git("init", "-q")
    (tmp_path / "f.txt").write_text("a\n")
    git("add", "f.txt")
    git("-c", "user.email=t@example.com", "-c", "user.name=t", "commit", "-qm", "c")
    head = git("rev-parse", "HEAD").strip()
    assert record.commit(str(tmp_path)) == head
    (tmp_path / "g.txt").write_text("untracked\n")
    assert record.commit(str(tmp_path)) == head
    (tmp_path / "f.txt").write_text("b\n")
    assert record.commit(str(tmp_path)) == head + "+modified"
