"""Command-line numbers, checked where they enter: every subcommand's integer and tolerance options
go through these argparse types, so a zero, negative, NaN or infinite value is a usage error (exit
status 2, one line naming the option) instead of being ignored or turning a check into a pass."""
from __future__ import annotations

import argparse
import math

from ._lib import PadfreeError

# Exit statuses of every `padfree` subcommand (padfree --help lists them).
EXIT_OK = 0
EXIT_DIFFERENCE = 1  # the command ran and found a difference: a check or the demo failed its tolerance
EXIT_ERROR = 2  # the command could not run: bad arguments or input, a missing or unusable file
EXIT_INTERRUPTED = 130


class CommandError(PadfreeError, ValueError):
    """A subcommand cannot run with what it was given; the message says what to give instead."""


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}")
    return value


def non_negative_int(text: str) -> int:
    value = _integer(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def tolerance(text: str) -> float:
    """A finite float >= 0: NaN compares false with every error, so `err > nan` never fails a check."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value
