"""A Triton model for a packed padfree engine (TensorRT backend), with ragged batching.

`write_repository(engine, repository)` writes REPOSITORY/NAME/config.pbtxt and REPOSITORY/NAME/1/model.plan
(the engine, checked against its sidecar). Triton concatenates the requests' `input_ids` (each a
sequence of any length) into one 1-D tensor and computes `cu_seqlens` and `max_seqlen` itself
(batch inputs), so a dynamic batch reaches the engine packed, with no padding anywhere; per-token
outputs are scattered back to the requests by the shape of their `input_ids` (docs/SERVING.md).
"""
from __future__ import annotations

import os
from pathlib import Path

from padfree.engines import sidecar

from ._repository import TritonError, check_config, check_name, quote as _q, write_model

_TYPES = {"int32": "TYPE_INT32", "int64": "TYPE_INT64", "bool": "TYPE_BOOL", "float32": "TYPE_FP32",
          "float16": "TYPE_FP16", "bfloat16": "TYPE_BF16"}
RAGGED_INPUTS = ("input_ids", "token_type_ids")  # the per-token inputs a request sends
BATCH_INPUTS = {"cu_seqlens": "BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO",  # [B+1]: 0, len_0, len_0+len_1, ...
                "max_seqlen": "BATCH_MAX_ELEMENT_COUNT_AS_SHAPE"}  # shape [longest request]


def main_profile(data: dict) -> tuple[int, dict]:
    """The index and record of the largest profile (build() writes them smallest first)."""
    index = max(range(len(data["profiles"])), key=lambda i: (data["profiles"][i]["max_tokens"],
                                                              data["profiles"][i]["max_batch"]))
    return index, data["profiles"][index]


def check_engine(data: dict, engine) -> None:
    built = data["backend"]["name"]
    if built != "tensorrt":
        # Triton's TensorRT backend links TensorRT itself (libnvinfer); a TensorRT-RTX plan is another
        # format it cannot deserialize, and Triton has no TensorRT-RTX backend
        raise TritonError(f"{engine} was built with {built}; Triton's TensorRT backend loads plans of TensorRT only:"
                          " build the engine on a machine with TensorRT (`padfree build --backend tensorrt`), or"
                          " serve the export folder as a Python-backend model (`padfree triton EXPORT_DIR`)")
    io = data["model"]["io"]
    if io == "padded":
        raise TritonError(f"{engine} is in the padded I/O form; Triton's ragged batching needs the packed form:"
                          " export with the default `padfree export` (packed) and build that model.padfree.onnx")
    if io != "packed":
        raise TritonError(f"{engine} is an encoder-decoder graph ({io}); Triton serving covers packed encoders only:"
                          " serve generation through padfree.Runtime.generate")
    for t in data["inputs"]:
        if t["name"] not in RAGGED_INPUTS and t["name"] not in BATCH_INPUTS:
            raise TritonError(f"{engine}: input {t['name']!r} has no Triton mapping (expected "
                              f"{', '.join(RAGGED_INPUTS + tuple(BATCH_INPUTS))})")
        if t["dtype"] != "int32":
            raise TritonError(f"{engine}: input {t['name']} is {t['dtype']}, Triton's batch inputs are int32 here;"
                              " export again (padfree export writes int32 inputs)")


def default_max_batch(data: dict) -> int:
    """The most requests Triton may batch so that any batch fits the profile: max_batch requests of up
    to max_seqlen tokens each must stay within max_tokens (Triton batches by request count only)."""
    _, p = main_profile(data)
    return max(1, min(p["max_batch"], p["max_tokens"] // p["max_seqlen"]))


def config_text(data: dict, name: str, max_batch: int | None = None, max_queue_delay_us: int = 100,
                instances: int = 1, engine="engine") -> str:
    """config.pbtxt for the engine whose sidecar is `data`."""
    check_engine(data, engine)
    index, p = main_profile(data)
    if max_batch is None:
        max_batch = default_max_batch(data)
    if max_batch > p["max_batch"]:
        raise TritonError(f"--max-batch {max_batch} exceeds the engine profile's max batch {p['max_batch']};"
                          f" give at most {p['max_batch']} or rebuild with a larger --max-batch")
    if max_batch * p["max_seqlen"] > p["max_tokens"]:
        raise TritonError(f"--max-batch {max_batch} requests of up to {p['max_seqlen']} tokens exceed the profile's"
                          f" max tokens {p['max_tokens']}; give at most {default_max_batch(data)} or rebuild with a"
                          " larger --max-tokens")
    names = [t["name"] for t in data["inputs"]]
    ids_dim = next(t.get("shape", [None])[0] for t in data["inputs"] if t["name"] == "input_ids")
    lines = [f"name: {_q(name)}", 'platform: "tensorrt_plan"', f"max_batch_size: {max_batch}", "input ["]
    ragged = [n for n in RAGGED_INPUTS if n in names]
    lines.append(",\n".join(f"  {{\n    name: {_q(n)}\n    data_type: TYPE_INT32\n    dims: [ -1 ]\n"
                            "    allow_ragged_batch: true\n  }" for n in ragged))
    lines += ["]", "batch_input ["]
    lines.append(",\n".join(f"  {{\n    kind: {BATCH_INPUTS[n]}\n    target_name: {_q(n)}\n"
                            '    data_type: TYPE_INT32\n    source_input: "input_ids"\n  }' for n in BATCH_INPUTS))
    lines += ["]", "output ["]
    outs, scattered = [], []
    for t in data["outputs"]:
        shape = list(t.get("shape") or [])
        if t["dtype"] not in _TYPES:
            raise TritonError(f"{engine}: output {t['name']} is {t['dtype']}, which Triton has no type for")
        per_token = (bool(shape) and isinstance(ids_dim, str) and shape[0] == ids_dim) or \
            (not shape and t["name"] == "last_hidden_state")
        # per request: Triton prepends the batch dimension; per token: [-1 tokens] + the rest, and the
        # scatter sets the -1 to each request's input_ids length
        rest = [d if isinstance(d, int) and not isinstance(d, bool) and d > 0 else -1 for d in shape[1:]]
        dims = ([-1] + rest) if per_token else rest
        if not dims:
            dims = [1]  # a per-request scalar ([B]): Triton needs a non-empty shape
        outs.append(f"  {{\n    name: {_q(t['name'])}\n    data_type: {_TYPES[t['dtype']]}\n"
                    f"    dims: [ {', '.join(str(d) for d in dims)} ]\n" +
                    ("    reshape: { shape: [ ] }\n" if not rest and not per_token else "") + "  }")
        if per_token:
            scattered.append(t["name"])
    lines += [",\n".join(outs), "]"]
    if scattered:
        lines += ["batch_output ["]
        lines.append(",\n".join(f"  {{\n    target_name: {_q(n)}\n    kind: BATCH_SCATTER_WITH_INPUT_SHAPE\n"
                                '    source_input: "input_ids"\n  }' for n in scattered))
        lines.append("]")
    lines += [f"dynamic_batching {{\n  max_queue_delay_microseconds: {max_queue_delay_us}\n}}",
              f"instance_group [\n  {{\n    count: {instances}\n    kind: KIND_GPU\n"
              f'    profile: [ "{index}" ]\n  }}\n]']
    return "\n".join(lines) + "\n"


def write_repository(engine: str | os.PathLike, repository: str | os.PathLike, name: str | None = None,
                     max_batch: int | None = None, max_queue_delay_us: int = 100, instances: int = 1) -> Path:
    """REPOSITORY/NAME/{config.pbtxt,1/model.plan}, all or nothing (_repository.write_model)."""
    data = sidecar.read(engine)
    name = check_name(name or Path(engine).stem)
    text = config_text(data, name, max_batch, max_queue_delay_us, instances, engine)
    check_config(text)
    blob = sidecar.read_engine_bytes(engine, data)

    def fill(stage: Path) -> list[Path]:
        (stage / "1").mkdir()
        (stage / "1" / "model.plan").write_bytes(blob)
        return [stage / "1" / "model.plan"]

    return write_model(repository, name, text, fill)
