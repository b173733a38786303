"""`padfree demo`, the README's main job: export + rewrite + ONNX Runtime check (+ an engine where a
TensorRT is installed) on the CPU."""
from __future__ import annotations

import pytest

pytest.importorskip("onnxruntime")
pytest.importorskip("onnx_graphsurgeon")


def test_demo_passes_and_keeps_its_files(tmp_path, capsys):
    from padfree.cli import main
    from padfree.engines import trt_api
    from padfree.engines.errors import BackendUnavailableError

    assert main(["demo", "-o", str(tmp_path), "--seed", "3"]) == 0
    printed = capsys.readouterr().out
    assert "demo PASS" in printed
    assert (tmp_path / "model.onnx").is_file() and (tmp_path / "model.padfree.onnx").is_file()
    try:
        trt_api.load(None)
    except BackendUnavailableError:
        assert "engine: skipped" in printed
        return
    engines = list(tmp_path.glob("*.engine"))
    assert len(engines) == 1 and engines[0].stat().st_size > 0, printed
    assert f"engine: built {engines[0].name}" in printed
    from padfree.engines import plugin_library
    if plugin_library.find(required=False) is not None:  # the README's main job: padfree's plugins
        assert engines[0].name == "model.padfree.engine" and "from model.padfree.onnx" in printed, printed
