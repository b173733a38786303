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


def pytest_collection_modifyitems(config, items):
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
    import os
    import random
    value = int(os.environ.get("PADFREE_SEED", random.SystemRandom().randrange(2**31)))
    print(f"PADFREE_SEED={value}")
    return value
