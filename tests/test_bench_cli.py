"""padfree bench's report (CPU): the targets each row is judged by and the table's ratios.
The timings themselves are the benchmark's (bench/bert.py on the device), never a test's."""
from __future__ import annotations

from padfree import bench_cli


def row(batch, max_seqlen, padfree, compile_ms, floor):
    ms = {"padfree": padfree, "compile": compile_ms, "floor": floor, "padfree_packed": padfree * 1.1}
    return {"batch": batch, "max_seqlen": max_seqlen, "total_tokens": batch * max_seqlen // 2, "ms": ms,
            "ratios": {"padfree_over_floor": padfree / floor, "packed_over_floor": padfree * 1.1 / floor,
                       "compile_over_padfree": compile_ms / padfree}}


def test_targets_judge_latency_at_1x128_and_ratios_elsewhere():
    assert bench_cli._targets(row(1, 128, 0.399, 0.9, 0.25)) == "ok"
    assert bench_cli._targets(row(1, 128, 0.401, 9.0, 0.3)) == "MISS"
    assert bench_cli._targets(row(64, 512, 8.0, 16.1, 6.2)) == "ok"
    assert bench_cli._targets(row(64, 512, 8.1, 16.1, 6.2)) == "MISS"  # 1.99x
    assert bench_cli._targets(row(16, 256, 1.3, 3.0, 0.8)) == "MISS"   # 1.63x the floor


def test_table_prints_the_ratios(capsys):
    bench_cli.print_table([row(64, 512, 8.0, 16.4, 6.2)])
    line = capsys.readouterr().out.splitlines()[1]
    assert "1.29" in line and "1.42" in line and "2.05" in line and line.endswith("ok")
