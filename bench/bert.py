"""BERT-base: padfree vs HF eager / sdpa / torch.compile and the GEMM floor (issue 2's benchmark).

The logic is `padfree bench` (python/padfree/commands/bench.py); this script runs it with the same
arguments. On the device machine, after `source scripts/device_env.sh`:
  python bench/bert.py [--profile] [--no-compile] [--shapes 1x128,16x256] [--out FILE.json]
"""
import sys

from padfree.commands.bench import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
