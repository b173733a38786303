"""What a benchmark result records beside its figures (bench/README.md): the date, the versions, the
commit measured and the command that measured it."""
from __future__ import annotations

import datetime
import os
import subprocess
import sys


def commit(root: str) -> str:
    """The checked-out commit of the repository at `root`, with "+modified" where tracked files differ
    from it (uncommitted edits, or a working tree copied onto another machine beside an older .git): then
    the figures are not that commit's alone, and the result should name the commit that was measured.
    "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True,
                              check=True).stdout.strip()
        changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                                 capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+modified" if changed else "")


def provenance(root: str | None = None, program: str = "padfree") -> dict:
    """date, padfree / torch / transformers / CUDA versions and the command: with the repository's root
    (a script of bench/), the commit measured and the script's path from that root; else the command
    as `program` and its arguments (the padfree command's)."""
    import torch

    from padfree import __version__
    try:
        import transformers
        transformers_version = transformers.__version__
    except ImportError:
        transformers_version = None
    record = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "padfree": __version__, "torch": torch.__version__, "transformers": transformers_version,
              "cuda": torch.version.cuda}
    if root is not None:
        program = os.path.relpath(sys.argv[0], root)
        record["commit"] = commit(root)
    record["command"] = " ".join([program] + sys.argv[1:])
    return record


def write(report: dict, out: str) -> None:
    """The result file (bench/results/<name>-<gpu>.json by default), its folder made where missing."""
    import json
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(report, f, indent=1)
        f.write("\n")
    print(f"wrote {out}")
