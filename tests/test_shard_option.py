"""The --shard K/N option of tests/conftest.py, by which the sanitizers spread one test file over
several processes (scripts/device_check.sh): the shards must cover the file's tests exactly once."""
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILE = "tests/test_padding.py"  # ~100 parametrized ids (collection only: no GPU needed)


def collect(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           FILE, *args], cwd=ROOT, capture_output=True, text=True)


def collected(*args: str) -> list[str]:
    result = collect(*args)
    assert result.returncode == 0, result.stdout + result.stderr
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_shards_cover_each_test_once():
    everything = collected()
    shards = [collected("--shard", f"{k}/3") for k in range(3)]
    assert len(everything) >= 6
    assert sorted(sum(shards, [])) == sorted(everything)
    assert all(abs(len(s) - len(everything) / 3) < 1 for s in shards)  # round robin: balanced
    assert shards[1][0] == everything[1]  # every third test, not a block


@pytest.mark.parametrize("spec", ["3/3", "-1/2", "x", "1/0"])
def test_bad_shard_is_a_usage_error(spec):
    result = collect("--shard", spec)
    assert result.returncode == 4, result.stdout + result.stderr
    assert "--shard" in result.stderr
