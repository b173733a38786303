"""Where each link of a few-row decode step's chain of linear layers spends its time: NLLB-600M-size
layers' six decode_linear calls (qkv, out, cross_q, cross_out, fc1, fc2; 12 layers, each call reading
the previous one's output, fp16, one CUDA graph, PDL as padfree launches them), with a %globaltimer
stamp per block at its entry, after the PDL wait, after staging x, after the LayerNorm and at its end.

The stamps go into a copy of plugins/kernels/decoder/decode_linear.cu written at build time (the
kernel itself carries no instrumentation); bench/decode_linear_phases.cu drives the chain and says
what each column means. A step at 1x4 is such a chain (with its attention kernels between), so the
columns show which part of a link is worth shortening (docs/GENERATION.md).

On the device machine:
  python bench/decode_linear_phases.py [--rows 1,4,8] [--out FILE.json]
Prints per projection, in microseconds: exposed, release, spread, x_stage, ln, compute, ahead.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

from sync_costs import gpu_arch, nvcc  # bench/: the script's own folder, first on sys.path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNEL = os.path.join(ROOT, "plugins", "kernels", "decoder", "decode_linear.cu")
DRIVER = os.path.join(ROOT, "bench", "decode_linear_phases.cu")
COLUMNS = ("exposed", "release", "spread", "x_stage", "ln", "compute", "ahead")

_STAMPS = """
constexpr int kMaxStampedCalls = 128, kMaxStampedBlocks = 1024, kStamps = 5;
__device__ unsigned long long g_stamps[kMaxStampedCalls][kMaxStampedBlocks][kStamps];
__device__ const char* g_out_base;  // a call's stamps: (out - g_out_base) / g_out_stride
__device__ long long g_out_stride;
__device__ __forceinline__ unsigned long long stamp() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
"""

# a block's last stamp, where the kernel's products end (either path)
_STAMP_END = (
    "    __syncthreads();\n"
    "    {\n"
    "    const long long call = (reinterpret_cast<const char*>(a.out) - g_out_base) / g_out_stride;\n"
    "    if (threadIdx.x == 0 && blockIdx.x < kMaxStampedBlocks && call >= 0 && call < kMaxStampedCalls) {\n"
    "        unsigned long long* s = g_stamps[call][blockIdx.x];\n"
    "        s[0] = s0; s[1] = s1; s[2] = s2; s[3] = s3; s[4] = stamp();\n"
    "    }\n"
    "    }\n")

# (text in decode_linear.cu, what replaces it): each must occur exactly once
_EDITS = [
    ('#include "../attention/attention_ptx.cuh"', '#include "attention/attention_ptx.cuh"'),
    ('#include "../ptx/tma_ptx.cuh"', '#include "ptx/tma_ptx.cuh"'),
    ("constexpr int kWarps = 4;", _STAMPS + "constexpr int kWarps = 4;"),
    ("    extern __shared__ __align__(16) unsigned char smem_raw[];\n",
     "    extern __shared__ __align__(16) unsigned char smem_raw[];\n    const unsigned long long s0 = stamp();\n"),
    ("    wait_on_producer();\n\n    // the x rows",
     "    wait_on_producer();\n    const unsigned long long s1 = stamp();\n\n    // the x rows"),
    ("    attention_detail::cp_async_wait<0>();\n    __syncthreads();\n",
     "    attention_detail::cp_async_wait<0>();\n    __syncthreads();\n    const unsigned long long s2 = stamp();\n"),
    ("    allow_consumers();\n\n    if constexpr (kTensorCores) {",
     "    const unsigned long long s3 = stamp();\n    allow_consumers();\n\n    if constexpr (kTensorCores) {"),
    ("        mma_detail::tile_products<T, kRows>(a, xs, wtile, bar, pre, preloaded, from_smem, warp, lane, tiles);\n",
     "        mma_detail::tile_products<T, kRows>(a, xs, wtile, bar, pre, preloaded, from_smem, warp, lane, tiles);\n"
     + _STAMP_END),
    ("            if (first && m < M && n < N) store_output<T>(a, sums[0], m, n);\n        }\n    }\n}\n",
     "            if (first && m < M && n < N) store_output<T>(a, sums[0], m, n);\n        }\n    }\n" + _STAMP_END
     + "}\n"),
]


def stamped_source(path: str = KERNEL) -> str:
    """decode_linear.cu with the stamps in; refuses where the kernel no longer has a place they go."""
    with open(path) as f:
        source = f.read()
    for old, new in _EDITS:
        if source.count(old) != 1:
            raise SystemExit(f"decode_linear_phases: {os.path.relpath(path, ROOT)} no longer has exactly one"
                             f" {old.strip().splitlines()[0]!r}; update bench/decode_linear_phases.py's _EDITS")
        source = source.replace(old, new)
    return source


def build(folder: str, arch: str, compile_only: bool = False) -> str:
    """The stamped kernel and the driver built into `folder`; the binary's (or object's) path."""
    with open(os.path.join(folder, "decode_linear_stamped.cu"), "w") as f:
        f.write(stamped_source())
    target = os.path.join(folder, "decode_linear_phases" + (".o" if compile_only else ""))
    kernels = os.path.join(ROOT, "plugins", "kernels")
    command = [nvcc(), f"-arch={arch}", "-O3", "-std=c++17", "--expt-relaxed-constexpr", f"-I{folder}", f"-I{kernels}",
               f"-I{os.path.join(kernels, 'decoder')}", f"-I{os.path.join(ROOT, 'plugins', 'capi')}", DRIVER,
               "-o", target]
    subprocess.run(command + (["-c"] if compile_only else []), check=True)
    return target


def parse(output: str) -> dict:
    """The driver's lines: scalars, then one line per projection with COLUMNS."""
    result: dict = {"projections": {}}
    for line in output.splitlines():
        name, *values = line.split()
        if len(values) == 1:
            result[name] = float(values[0])
        elif len(values) == len(COLUMNS):
            result["projections"][name] = dict(zip(COLUMNS, map(float, values)))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,4,8", help="comma-separated row counts, each 1 to 8")
    parser.add_argument("--out", default=None, help="JSON report (printed only where not given)")
    args = parser.parse_args(argv)
    try:
        rows = [int(r) for r in args.rows.split(",") if r]
    except ValueError:
        parser.error(f"--rows takes comma-separated integers, got {args.rows!r}")
    if not rows or any(not 1 <= r <= 8 for r in rows):
        parser.error(f"--rows: each from 1 to 8 (decode_linear's CUDA-core kernel), got {args.rows!r}")
    import torch
    if not torch.cuda.is_available():
        parser.error("the benchmark runs on a CUDA device")
    major, minor = torch.cuda.get_device_capability()
    if major < 9:
        parser.error(f"the chain is timed as padfree launches it on compute capability 9.0+ (PDL), this GPU has"
                     f" {major}.{minor}")
    report = {"benchmark": "decode_linear's phases in a chain of NLLB-size projections",
              "device": torch.cuda.get_device_name(), "columns_us": list(COLUMNS), "rows": []}
    with tempfile.TemporaryDirectory() as folder:
        binary = build(folder, gpu_arch(major, minor))
        for r in rows:
            out = subprocess.run([binary, str(r)], check=True, capture_output=True, text=True).stdout
            result = parse(out)
            report["rows"].append(result)
            print(f"rows {r}: {result['graph_us']:.1f} us per graph of {int(result['calls'])} calls")
            print(f"  {'':10s}" + "".join(f"{c:>9s}" for c in COLUMNS))
            for name, values in result["projections"].items():
                print(f"  {name:10s}" + "".join(f"{values[c]:9.2f}" for c in COLUMNS))
    if args.out:
        from padfree.bench import record
        report.update(record.provenance(ROOT))
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
            f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
