"""padfree bench's report (CPU): the targets each row is judged by and the table's ratio columns.
The timings themselves are the benchmark's (bench/bert.py on the device), never a test's."""
from __future__ import annotations

from padfree import bench_cli


def row(batch, max_seqlen, padfree, compile_ms, floor, blocks):
    ms = {"padfree": padfree, "compile": compile_ms, "floor": floor, "padfree_packed": padfree}
    return {"batch": batch, "max_seqlen": max_seqlen, "total_tokens": batch * max_seqlen // 2, "ms": ms,
            "ms_blocks": {"compile": blocks[0], "padfree": blocks[1]},
            "ratios": {"padfree_over_floor": padfree / floor, "packed_over_floor": padfree / floor,
                       "compile_over_padfree": compile_ms / padfree,
                       "compile_over_padfree_blocks": blocks[0] / blocks[1]}}


def test_targets_judge_latency_at_1x128_and_ratios_elsewhere():
    assert bench_cli._targets(row(1, 128, 0.399, 0.9, 0.25, (0.9, 0.41))) == "ok"
    assert bench_cli._targets(row(1, 128, 0.401, 9.0, 0.3, (9.0, 0.39))) == "MISS"
    assert bench_cli._targets(row(64, 512, 8.0, 16.1, 6.2, (16.0, 8.1))) == "ok"
    assert bench_cli._targets(row(64, 512, 8.1, 16.1, 6.2, (16.0, 7.9))) == "MISS"  # 1.99x: blocks don't count
    assert bench_cli._targets(row(16, 256, 1.3, 3.0, 0.8, (3.0, 1.3))) == "MISS"  # 1.63x the floor


def test_table_prints_both_compile_ratios(capsys):
    bench_cli.print_table([row(64, 512, 8.0, 16.4, 6.2, (16.2, 8.2))])
    line = capsys.readouterr().out.splitlines()[1]
    assert "2.05" in line and "1.98" in line and line.endswith("ok")
