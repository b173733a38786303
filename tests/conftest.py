"""Test setup: GPU tests (marker `gpu`) skip with a reason where there is no CUDA device or no
built kernel library; they run on the device machine."""
from __future__ import annotations

import pytest


def _gpu_skip_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "no CUDA device on this machine (GPU tests run on the device machine)"
    from padfree import _lib
    try:
        _lib.load()
    except Exception as e:  # noqa: BLE001 - reported as the skip reason
        return f"kernel library not loadable: {e}"
    return None


def pytest_addoption(parser):
    parser.addoption("--shard", metavar="K/N", default=None,
                     help="run only the tests at positions K, K+N, K+2N, ... of the collection (0 <= K < N): "
                          "the sanitizers run one test file in N processes over one GPU")


def _select_shard(config, items) -> None:
    spec = config.getoption("--shard")
    if spec is None:
        return
    try:
        k, n = (int(part) for part in spec.split("/"))
    except ValueError:
        raise pytest.UsageError(f"--shard: expected K/N, got {spec!r}") from None
    if not 0 <= k < n:
        raise pytest.UsageError(f"--shard: expected 0 <= K < N, got {spec!r}")
    # Every N-th test rather than a contiguous block: a file's slow cases (long sequences) sit
    # together, and a block would leave them all to one process.
    config.hook.pytest_deselected(items=[item for i, item in enumerate(items) if i % n != k])
    items[:] = items[k::n]


def pytest_collection_modifyitems(config, items):
    _select_shard(config, items)
    reason = _gpu_skip_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason=reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed():
    """A fresh seed per test run, printed so a failure can be replayed (PADFREE_SEED=...)."""
    import random

    from padfree import env
    given = env.get("PADFREE_SEED")
    value = int(given) if given is not None else random.SystemRandom().randrange(2**31)
    print(f"PADFREE_SEED={value}")
    return value


@pytest.fixture
def no_tf32():
    """float32 GEMMs in float32 (not TF32) for the test, as the references compute them."""
    import torch
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


@pytest.fixture(scope="session")
def tiny_bert_export(tmp_path_factory):
    """The built-in tiny BERT (128 positions) exported once per test run (padfree export's folder: the
    plain and the rewritten ONNX model, report.json), for the tests that only read it."""
    for module in ("torch", "transformers", "onnx_graphsurgeon", "onnxruntime"):
        pytest.importorskip(module)
    from padfree.export.pipeline import export

    out = tmp_path_factory.mktemp("tiny-bert") / "out"
    export("tiny-bert", out)
    files = sorted(p.relative_to(out) for p in out.rglob("*"))
    yield out
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == files, "a test wrote into the shared export"
