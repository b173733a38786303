"""The `padfree` command. Subcommands mirror the pipeline: export, check, build, run, bench, demo.

Each subcommand is one module of padfree.commands, listed in padfree.commands.COMMANDS, that registers
itself through `register(subparsers)`; the modules import their components' heavy parts lazily so that
`padfree --help` works without torch or TensorRT installed, and a command whose component is not built
into this install (padfree.export, padfree.engines) is left out.
A user error (padfree's own errors, a file that cannot be read or written) ends in one line and exit
status 2; exit status 1 is kept for "the command ran and found a difference" (padfree.arguments).
"""
from __future__ import annotations

import argparse
import importlib
import logging
import sys

from ._lib import PadfreeError
from .arguments import EXIT_DIFFERENCE, EXIT_ERROR, EXIT_INTERRUPTED, EXIT_OK
from .commands import COMMANDS

log = logging.getLogger(__name__)
EPILOG = (f"exit status: {EXIT_OK} done (a check passed); {EXIT_DIFFERENCE} a check ran and found a difference past"
          f" its tolerance; {EXIT_ERROR} the command could not run (bad arguments, input or files);"
          f" {EXIT_INTERRUPTED} interrupted")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="padfree", description=__doc__.splitlines()[0], epilog=EPILOG)
    parser.add_argument("-v", "--verbose", action="store_true", help="show each step and match")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"{__package__}.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("padfree"):
                continue  # a component not built into this install
            raise
        module.register(subparsers)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return int(args.func(args) or EXIT_OK)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (PadfreeError, OSError) as e:
        # a user error: what was wrong and what to do, without a traceback (-v shows it)
        log.debug("traceback of the error below", exc_info=True)
        print(f"padfree {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())
