"""How fast the copy engine streams global memory into shared memory, by request size, requests in flight
a CTA and CTAs an SM, against plain 16-byte loads: the rates a weight-streaming kernel is built on.

Two kernels measured slower than their bytes suggested: a persistent LM head fed by 64 x 64 tensor-copy
boxes (2.3 TB/s with one CTA an SM and 16 boxes in flight, 3.3 with two CTAs) and a cross-attention whose
block bulk-copied a source's 72 KB at once (~24 us a call; docs/KERNELS.md). bench/copy_rates.cu measures
the rates that decide such designs (its header names each case); this script builds it with nvcc for the
current GPU (compute capability 9.0: sm_90a), runs it and records the numbers.

On the device machine:
  python bench/copy_rates.py [--out FILE.json]
Writes bench/results/copy-rates-<gpu>.json (device, date, versions, commit, command, GB/s per case).
"""
from __future__ import annotations

import argparse
import os
import sys

from sync_costs import build_and_run, device_capability, gpu_arch  # bench/: the script's own folder, first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCE = os.path.join(ROOT, "bench", "copy_rates.cu")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=None, help="JSON report (default bench/results/copy-rates-<gpu>.json)")
    args = parser.parse_args(argv)
    major, minor = device_capability(parser)
    if (major, minor) != (9, 0):
        parser.error(f"the copies measured are sm_90a's (compute capability 9.0), this GPU has {major}.{minor}")
    import torch

    from padfree.bench import record
    from padfree.bench.timing import gpu_slug
    values = build_and_run(SOURCE, gpu_arch(major, minor))  # {case: GB/s, "sms": count}
    for name, value in values.items():
        print(f"{name:24s} {value:g}")
    device = torch.cuda.get_device_name()
    report = {"benchmark": "global-to-shared streaming rates: copy-engine requests and plain loads",
              "device": device, **record.provenance(ROOT),
              "timing": "CUDA events, best of 5 runs, each reading a 512 MB buffer once (one_bulk_*: 64 MB by one CTA)",
              "gb_per_s": {k: v for k, v in values.items() if k != "sms"},
              "sms": int(values.get("sms", 0))}
    record.write(report, args.out or os.path.join(ROOT, "bench", "results", f"copy-rates-{gpu_slug(device)}.json"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
