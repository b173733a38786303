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
    from . import __version__

    parser = argparse.ArgumentParser(prog="padfree", description=__doc__.splitlines()[0], epilog=EPILOG)
    parser.add_argument("--version", action="version", version=f"padfree {__version__}")
    _add_verbosity(parser, argparse.SUPPRESS)
    parser.set_defaults(verbose=False, quiet=False)
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        try:
            module = importlib.import_module(f"{__package__}.commands.{name}")
        except ModuleNotFoundError as e:
            if e.name and e.name.startswith("padfree"):
                continue  # a component not built into this install
            raise
        module.register(subparsers)
    for sub in subparsers.choices.values():  # -q / -v before or after the subcommand
        _add_verbosity(sub, argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.verbose and args.quiet:
        parser.error("-q/--quiet and -v/--verbose exclude each other")
    level = logging.DEBUG if args.verbose else logging.WARNING if args.quiet else logging.INFO
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("padfree").setLevel(level)
    try:
        return int(args.func(args) or EXIT_OK)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except (PadfreeError, OSError) as e:
        # a user error: what was wrong and what to do, without a traceback (-v shows it)
        log.debug("traceback of the error below", exc_info=True)
        print(f"padfree {args.command}: error: {e}", file=sys.stderr)
        return EXIT_ERROR


def _add_verbosity(parser: argparse.ArgumentParser, default) -> None:
    """-v / -q: on the root parser and on every subcommand (default SUPPRESS there, so that one given
    before the subcommand is not reset by the subcommand's parser)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("-v", "--verbose", action="store_true", default=default,
                       help="show each step and match (debug logging; polygraphy's full log in check)")
    group.add_argument("-q", "--quiet", action="store_true", default=default,
                       help="warnings and errors only, no progress lines")


if __name__ == "__main__":
    sys.exit(main())
