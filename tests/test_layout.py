"""The package's layering (CPU): which parts import which, checked on the source, without running it."""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# package -> its source folder (pyproject.toml's wheel.packages)
PACKAGES = {"padfree.engines": ROOT / "engines", "padfree.export": ROOT / "export",
            "padfree": ROOT / "python" / "padfree"}


def _module_of(path: Path) -> str:
    for package, folder in PACKAGES.items():
        if folder in path.parents or path.parent == folder:
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join([package, *parts])
    raise AssertionError(path)


def _imports(path: Path) -> set[str]:
    """Every padfree module `path` imports, at its top or inside a function."""
    module = _module_of(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rpartition(".")[0]
            name = (f"{base}.{node.module}" if node.module else base) if node.level else node.module
            found.add(name)
            found.update(f"{name}.{a.name}" for a in node.names)
    return {name for name in found if name == "padfree" or name.startswith("padfree.")}


def _sources(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.py") if ".venv" not in p.parts)


def test_engines_never_imports_the_runtime():
    """padfree.runtime serves engines through padfree.engines (sidecar, plugin library, trt_api); the
    engine backend lives in padfree.runtime.backends.engine, so that the dependency runs one way."""
    for path in _sources(PACKAGES["padfree.engines"]):
        wrong = {name for name in _imports(path) if name.startswith("padfree.runtime")}
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


def test_bench_modules_import_one_way():
    """The bench command drives padfree.bench's modules; none of those imports the command back."""
    for path in _sources(PACKAGES["padfree"] / "bench"):
        wrong = {name for name in _imports(path) if name.startswith("padfree.commands")}
        assert not wrong, f"{path.relative_to(ROOT)} imports {sorted(wrong)}"


def test_each_runtime_and_engines_module_imports_alone():
    """Each module imports in a fresh interpreter on its own, and importing padfree.runtime does not
    pull in padfree.engines (only opening an engine does: the engine backends)."""
    engine_backends = ["padfree.runtime.backends.engine", "padfree.runtime.backends.engine_generation"]
    modules = sorted({_module_of(p) for folder in (PACKAGES["padfree.engines"], PACKAGES["padfree"] / "runtime")
                      for p in _sources(folder)})
    script = ("import importlib, sys\n"
              f"for name in {modules!r}:\n"
              "    for m in [m for m in sys.modules if m == 'padfree' or m.startswith('padfree.')]:\n"
              "        del sys.modules[m]\n"
              "    importlib.import_module(name)\n"
              f"    if name.startswith('padfree.runtime') and name not in {engine_backends!r}:\n"
              "        assert 'padfree.engines' not in sys.modules, name\n")
    subprocess.run([sys.executable, "-c", script], check=True, timeout=300)


def test_environment_variables_are_read_in_one_place():
    """padfree.env defines every PADFREE_* variable and is the only package module reading os.environ
    for them; docs/ENVIRONMENT.md lists exactly those variables."""
    import re

    from padfree import env

    for folder in (PACKAGES["padfree"], PACKAGES["padfree.engines"], PACKAGES["padfree.export"]):
        for path in _sources(folder):
            if path == PACKAGES["padfree"] / "env.py":
                continue
            text = path.read_text()
            assert not re.search(r"os\.environ|os\.getenv", text), f"{path.relative_to(ROOT)} reads the environment"
    named = set(re.findall(r"\bPADFREE_[A-Z0-9_]+\b", "\n".join(
        p.read_text() for folder in PACKAGES.values() for p in _sources(folder))))
    named -= {"PADFREE_ABI_VERSION", "PADFREE_VERSION_STRING", "PADFREE_HAS_SM90A"}  # C macros, not variables
    named -= {n for n in named if n.startswith(("PADFREE_GELU_", "PADFREE_INPUT_", "PADFREE_ATTENTION_CAUSAL"))}
    assert named <= set(env.VARIABLES), sorted(named - set(env.VARIABLES))
    table = set(re.findall(r"^\| `(PADFREE_[A-Z0-9_]+)` \|", (ROOT / "docs" / "ENVIRONMENT.md").read_text(), re.M))
    assert table == set(env.VARIABLES)
