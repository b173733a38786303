"""The `padfree` command. Subcommands mirror the pipeline: export, check, build, run, bench, demo.

Each subcommand lives with its component and registers itself through `register(subparsers)`;
they are imported lazily so that `padfree --help` works without torch or TensorRT installed.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

# subcommand -> module that defines register(subparsers) and sets args.func
SUBCOMMANDS = {
    "export": "padfree.export.cli",
    "check": "padfree.check_cli",
    "build": "padfree.engines.cli",
    "run": "padfree.runtime_cli",
    "bench": "padfree.bench_cli",
    "demo": "padfree.demo",
}

log = logging.getLogger("padfree")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="padfree", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="show each step and match")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name, module_name in SUBCOMMANDS.items():
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("padfree"):
                continue  # a component not built into this install
            raise
        module.register(subparsers)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
