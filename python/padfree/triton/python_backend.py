"""A Triton Python-backend model serving padfree.Runtime, with ragged batching.

`write_python_model(source, repository)` writes REPOSITORY/NAME/config.pbtxt, 1/model.py (this
package's model.py) and the model beside it in 1/:
- an encoder export folder (`padfree export`): 1/export/, served by the Runtime on ONNX Runtime on
  the CPU (instance_group KIND_CPU): a CPU server, and the graph an engine would be built from;
- an HF model directory: 1/hf/, served on the PyTorch path (padfree.torch.from_hf, KIND_GPU): for
  GPUs where no engine runs.
input_ids (and token_type_ids where the model has token types, optional: zeros when absent) are
`dims: [-1]` with `allow_ragged_batch: true`, so the dynamic batcher groups requests of any length;
model.py packs them (docs/SERVING.md).
"""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from ._repository import TritonError, check_config, check_name, quote as _q, write_model

DEFAULT_MAX_BATCH = 64
_TYPES = {"float32": "TYPE_FP32", "float16": "TYPE_FP16"}
_DTYPES = ("float16", "bfloat16", "float32")
PER_REQUEST = ("pooler_output", "sentence_embedding")   # as model.py and the Runtime shape them
# The PyTorch path's CUDA graphs under serving traffic (padfree.torch.from_hf's options; config.pbtxt
# parameters, which model.py reads). A graph per recurring bucket, kept: ragged batches of up to 16
# sequences of up to 128 tokens fell into 10-22 buckets, and with 8 kept each eviction was captured
# again. A bucket's first call runs eagerly (capture_after 1: one-off buckets are common), and a
# capture times no GEMM candidates (gemm_search "none"), which cut a capture's stall from 0.15-0.8 s
# to under 8 ms with the same replay times (H100, small-bert fp16: bench/results/serve-h100.json,
# docs/SERVING.md).
TORCH_GRAPHS = {"max_graphs": 64, "capture_after": 1, "gemm_search": "none"}


def _export_io(folder: Path) -> dict:
    """Inputs and outputs of an encoder export, read the way the Runtime serves it (its refusals included)."""
    from padfree._lib import PadfreeError
    from padfree.runtime.backends.onnxrt_encoder import OnnxrtEncoderBackend

    report = json.loads((folder / "report.json").read_text())
    try:
        backend = OnnxrtEncoderBackend(folder)
    except PadfreeError as e:
        raise TritonError(str(e)) from e
    files = ["report.json", Path(str(report.get("rewritten") or "model.padfree.onnx")).name]
    files += [files[1] + ".data"] if (folder / (files[1] + ".data")).is_file() else []
    files += [f for f in report.get("text_files", []) if (folder / f).is_file()]
    widths = {o.name: o.shape[-1] for o in backend.session.get_outputs()}
    outputs = {n: ("float32", widths[n] if isinstance(widths[n], int) else -1) for n in backend.output_names}
    return {"runtime": "onnxruntime", "kind": "KIND_CPU", "outputs": outputs,
            "token_types": bool(backend.limits.type_vocab_size), "files": files}


def _hf_io(folder: Path, dtype: str) -> dict:
    """Inputs and outputs of an HF encoder directory on the PyTorch path, from its config alone (the
    model is built on the meta device: no weights are read, no GPU is needed)."""
    import torch
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    if getattr(config, "is_encoder_decoder", False):
        raise TritonError(f"{folder} is an encoder-decoder ({config.model_type}); Triton serving covers encoders:"
                          " serve generation through padfree.Runtime.generate")
    with torch.device("meta"):
        model = transformers.AutoModel.from_config(config)
    base = getattr(model, "base_model", model)
    outputs = ["last_hidden_state"] + (["pooler_output"] if getattr(base, "pooler", None) is not None else [])
    # bfloat16 leaves the Runtime as float32 (numpy has no bfloat16)
    wire = "float16" if dtype == "float16" else "float32"
    return {"runtime": "torch", "kind": "KIND_GPU", "outputs": {n: (wire, int(config.hidden_size)) for n in outputs},
            "dtype": dtype, "graphs": dict(TORCH_GRAPHS),
            "token_types": bool(getattr(config, "type_vocab_size", 0)),
            "files": sorted(str(p.relative_to(folder)) for p in folder.rglob("*")
                            if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts))}


def model_io(source: str | os.PathLike, dtype: str = "float16") -> dict:
    """What the Python model serves for `source` (an export folder or an HF directory)."""
    folder = Path(source)
    if (folder / "seq2seq.json").is_file():
        raise TritonError(f"{folder} is an encoder-decoder export; Triton serving covers encoders: serve generation"
                          " through padfree.Runtime.generate")
    if (folder / "report.json").is_file():
        return _export_io(folder)
    if (folder / "config.json").is_file():
        if dtype not in _DTYPES:
            raise TritonError(f"--dtype {dtype}: give one of {', '.join(_DTYPES)}")
        return _hf_io(folder, dtype)
    raise TritonError(f"{folder}: not an engine file, a `padfree export` folder (report.json) or an HF model"
                      " directory (config.json)")


def default_python_path() -> list[str]:
    """This interpreter's import path: the stub's embedded Python ignores PYTHONPATH, so model.py adds it."""
    return [p for p in sys.path if p and os.path.isdir(p)]


def config_text(io: dict, name: str, max_batch: int = DEFAULT_MAX_BATCH, max_queue_delay_us: int = 100,
                instances: int = 1, python_path: list[str] | None = None) -> str:
    """config.pbtxt of the Python model for `io` (model_io's answer)."""
    inputs = ["input_ids"] + (["token_type_ids"] if io["token_types"] else [])
    lines = [f"name: {_q(name)}", 'backend: "python"', f"max_batch_size: {max_batch}", "input ["]
    lines.append(",\n".join(f"  {{\n    name: {_q(n)}\n    data_type: TYPE_INT32\n    dims: [ -1 ]\n"
                            "    allow_ragged_batch: true\n" + ("    optional: true\n" if n != "input_ids" else "")
                            + "  }" for n in inputs))
    lines += ["]", "output ["]
    # per request (Triton prepends the batch dim k, the request's sequence count): [k, len, H] per token,
    # [k, H] per sequence
    lines.append(",\n".join(f"  {{\n    name: {_q(n)}\n    data_type: {_TYPES[t]}\n"
                            f"    dims: [ {width if n in PER_REQUEST else f'-1, {width}'} ]\n  }}"
                            for n, (t, width) in io["outputs"].items()))
    lines.append("]")
    params = {"runtime": io["runtime"], "source": "export" if io["runtime"] == "onnxruntime" else "hf",
              "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}",
              "python_path": os.pathsep.join(default_python_path() if python_path is None else python_path)}
    if "dtype" in io:
        params["dtype"] = io["dtype"]
    params.update({k: str(v) for k, v in io.get("graphs", {}).items()})
    lines += ["parameters ["]
    lines.append(",\n".join(f"  {{\n    key: {_q(k)}\n    value: {{ string_value: {_q(v)} }}\n  }}"
                            for k, v in params.items()))
    lines += ["]", f"dynamic_batching {{\n  max_queue_delay_microseconds: {max_queue_delay_us}\n}}",
              f"instance_group [\n  {{\n    count: {instances}\n    kind: {io['kind']}\n  }}\n]"]
    return "\n".join(lines) + "\n"


def write_python_model(source: str | os.PathLike, repository: str | os.PathLike, name: str | None = None,
                       max_batch: int = DEFAULT_MAX_BATCH, max_queue_delay_us: int = 100, instances: int = 1,
                       dtype: str = "float16", python_path: list[str] | None = None,
                       graphs: dict | None = None) -> Path:
    """REPOSITORY/NAME/{config.pbtxt, 1/model.py, 1/export/ or 1/hf/}, all or nothing (_repository.write_model).
    python_path: where model.py imports padfree and its packages from (default: this interpreter's sys.path).
    graphs: for an HF directory, TORCH_GRAPHS's options replaced where given."""
    folder = Path(source)
    if not folder.is_dir():
        raise TritonError(f"{folder}: expected an export folder or an HF model directory")
    name = check_name(name or folder.resolve().name)
    io = model_io(folder, dtype)
    if graphs:
        unknown = set(graphs) - set(TORCH_GRAPHS)
        if unknown or "graphs" not in io:
            raise TritonError(f"graphs: {sorted(unknown) if unknown else 'given'}: only an HF directory's model takes"
                              f" {', '.join(TORCH_GRAPHS)}")
        io["graphs"].update(graphs)
    text = config_text(io, name, max_batch, max_queue_delay_us, instances, python_path)
    check_config(text)

    def fill(stage: Path) -> list[Path]:
        target = stage / "1" / ("export" if io["runtime"] == "onnxruntime" else "hf")
        written = []
        for f in io["files"]:
            (target / f).parent.mkdir(parents=True, exist_ok=True)
            written.append(Path(shutil.copyfile(folder / f, target / f)))
        written.append(Path(shutil.copyfile(Path(__file__).with_name("model.py"), stage / "1" / "model.py")))
        return written

    return write_model(repository, name, text, fill)
