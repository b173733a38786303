"""The PADFREE_* environment variables: each defined once here, and read only through this module.

None of them is needed to use padfree. They say where a library is (a build outside the installation),
switch a kernel choice for A/B measurements (diagnostics), or make a test repeatable (test hooks).
The kernel library (C++) reads some of them itself, once per process: those are listed here too
(reader "kernels") so that one table covers them all; docs/ENVIRONMENT.md is that table, and
tests/test_layout.py checks that it lists exactly these.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variable:
    name: str
    kind: str            # "path", "flag" (0 turns off), "choice" or "text"
    default: str | None  # the value when unset (None: unset means "not given")
    role: str            # "location", "diagnostic", "test hook" or "internal"
    readers: str         # who reads it: "python", "kernels" (the C++ library), "tests", "build"
    doc: str


_VARIABLES = (
    Variable("PADFREE_LIBRARY", "path", None, "location", "python",
             "the kernel library (libpadfree_kernels.so) to load instead of the installed one"),
    Variable("PADFREE_TRT_LIBRARY", "path", None, "location", "python",
             "the TensorRT plugin library (libpadfree_trt.so) to load, as if passed as --plugin-library"),
    Variable("PADFREE_TRITONSERVER", "path", None, "location", "python",
             "the tritonserver padfree.triton.server starts (backends beside it) instead of nvidia-pytriton's"),
    Variable("PADFREE_TRT_BACKEND", "choice", None, "location", "python",
             "tensorrt or tensorrt_rtx: which installed TensorRT the engines use (default: the first importable)"),
    Variable("PADFREE_PDL", "flag", "1", "diagnostic", "python, kernels",
             "0 turns programmatic dependent launch off in the kernels and the PyTorch path (A/B runs)"),
    Variable("PADFREE_COUNTER_MEMSETS", "choice", None, "diagnostic", "python",
             "keep: captured forwards keep cuBLASLt's workspace memsets instead of dropping them (A/B runs)"),
    Variable("PADFREE_GENERATION_TORCH_OPS", "text", None, "diagnostic", "python",
             "comma-separated generation ops (e.g. decoder_step_embedding; fragment_layout: decode_linear on the "
             "nn.Linear weights) that run their torch reference (A/B runs)"),
    Variable("PADFREE_FRAGMENT_ROWS", "text", None, "diagnostic", "python",
             "the most rows (1-64) a generation step runs its linear layers in fragment order for (default: "
             "padfree.generation.dispatch.FRAGMENT_STEP_ROWS; A/B runs)"),
    Variable("PADFREE_DECODE_GEMM", "choice", None, "diagnostic", "python",
             "0|1: 0 keeps generation steps of 17-256 rows off decode_gemm (cuBLAS GEMMs and LayerNorm "
             "kernels), 1 takes it from 1 row and past 64 whatever its grids (A/B runs, tests)"),
    Variable("PADFREE_ATTENTION_PATH", "choice", None, "diagnostic", "kernels",
             "resident|tiled|wgmma|tma|held forces the attention kernel's path where it can run (bench/attention.py)"),
    Variable("PADFREE_ATTENTION_ORDER", "choice", None, "diagnostic", "kernels",
             "tiles|heads|sequences forces the attention grid's order (A/B runs)"),
    Variable("PADFREE_CROSS_ATTENTION_PATH", "choice", None, "diagnostic", "kernels",
             "beams|rows forces the decoder cross-attention's path where it can run (A/B runs, tests)"),
    Variable("PADFREE_DECODE_LINEAR_STREAM", "choice", None, "diagnostic", "kernels",
             "0 keeps decode_linear's vocabulary-sized projections of 1-16 rows off the bulk-copy stream kernels "
             "(A/B runs)"),
    Variable("PADFREE_ROW_ORDER", "choice", None, "diagnostic", "kernels",
             "forward|reverse forces the order in which the row-wise kernels walk their rows (A/B runs)"),
    Variable("PADFREE_SEED", "text", None, "test hook", "tests",
             "the tests' random seed (each run prints the one it drew), to replay a failure"),
    Variable("PADFREE_KERNEL_FAMILIES", "text", None, "test hook", "tests, build",
             "the kernel families a partial build holds (CMake -DPADFREE_KERNEL_FAMILIES); tests skip the others"),
    Variable("PADFREE_TRT_HARNESS", "path", None, "test hook", "tests",
             "the plugin test harness (padfree_trt_harness) to run instead of the one found under build/"),
    Variable("PADFREE_BUILD_TRT_PLUGINS", "text", "ON", "location", "build",
             "OFF skips libpadfree_trt.so when pip builds padfree (pyproject.toml)"),
    Variable("PADFREE_ENGINES_BUILD_WORKER", "path", None, "internal", "python",
             "set by `padfree build` for its worker process: the file the worker reports an error to"),
)
VARIABLES: dict[str, Variable] = {v.name: v for v in _VARIABLES}


def _variable(name: str) -> Variable:
    try:
        return VARIABLES[name]
    except KeyError:
        raise KeyError(f"{name} is not a padfree environment variable (padfree.env.VARIABLES)") from None


def get(name: str) -> str | None:
    """The variable's value, its default where unset or empty."""
    return os.environ.get(name) or _variable(name).default


def raw(name: str) -> str | None:
    """The variable's value exactly as set, an empty one included (None where unset)."""
    _variable(name)
    return os.environ.get(name)


def is_set(name: str) -> bool:
    """Whether the variable holds a non-empty value."""
    _variable(name)
    return bool(os.environ.get(name))


def path(name: str) -> Path | None:
    """A "path" variable's value as a Path (None where unset)."""
    value = get(name)
    return None if value is None else Path(value)


def flag(name: str) -> bool:
    """A "flag" variable: off only where it says exactly 0 (as the kernel library reads it)."""
    return get(name) != "0"


def with_search_path(name: str, entries: list[str], base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process: `base` (default this one) with `entries` put first on the
    search-path variable `name` (LD_LIBRARY_PATH, not a padfree variable), its previous value after them."""
    base = dict(os.environ if base is None else base)
    base[name] = os.pathsep.join(list(entries) + [p for p in [base.get(name)] if p])
    return base


def with_value(name: str, value: str, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment for a child process: `base` (default this one) with `name` set to `value`."""
    _variable(name)
    return dict(os.environ if base is None else base, **{name: value})


def snapshot() -> dict[str, str]:
    """Every PADFREE_* variable set in this process but the library paths (*_LIBRARY), for a
    benchmark's record of the switches it ran with."""
    return {k: v for k, v in os.environ.items() if k.startswith("PADFREE_") and not k.endswith("_LIBRARY")}
