"""The `padfree` subcommands, one module each (padfree.cli registers them in this order).

Each module defines `register(subparsers)`, which adds its parser and sets `args.func`. The pipeline's
order: export (padfree.export), check, build (padfree.engines), run (padfree.runtime), bench, demo;
then inspect (what a model or an engine sidecar holds) and triton (a Triton model repository entry).
"""

COMMANDS = ("export", "check", "build", "run", "bench", "demo", "inspect", "triton")
