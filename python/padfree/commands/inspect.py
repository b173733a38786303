"""`padfree inspect FILE`: what an ONNX model, an engine's JSON sidecar or an export folder holds.

ONNX (model.onnx, model.padfree.onnx): inputs and outputs (dtype, shape), opset, node count, padfree
plugin nodes by type, float dtype, metadata (padfree.task, padfree.io, ...). An engine (MODEL.engine
or its MODEL.engine.json sidecar): backend, precision, I/O form, plugins, profiles, inputs and
outputs, as `padfree build` recorded them. A `padfree export` folder: what its report.json (an
encoder's) or seq2seq.json (an encoder-decoder's) records: the files, their dtype and I/O form, what
fused, and for an encoder-decoder the graphs engines are built from. Reads the files only: no model
is loaded or run.
"""
from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path
from typing import Any

from ..arguments import CommandError


def register(subparsers) -> None:
    p = subparsers.add_parser("inspect", help="show what an ONNX model or an engine sidecar holds",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", metavar="FILE", help="an .onnx model, an engine, an engine's .json sidecar, or an "
                   "export folder")
    p.add_argument("--json", action="store_true", help="print the facts as one JSON object")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.exists():
        raise CommandError(f"{path}: no such file")
    if path.is_dir():
        facts = export_facts(path)
    elif path.suffix == ".onnx":
        facts = onnx_facts(path)
    else:
        sidecar = path if path.suffix == ".json" else Path(str(path) + ".json")
        if not sidecar.is_file():
            raise CommandError(f"{path}: neither an .onnx model nor an engine with a JSON sidecar ({sidecar.name})")
        facts = engine_facts(sidecar)
    print(json.dumps(facts, indent=2) if args.json else format_facts(facts))
    return 0


def _dims(value_info) -> list:
    return [d.dim_param or d.dim_value or "?" for d in value_info.type.tensor_type.shape.dim]


def onnx_facts(path: Path) -> dict:
    import onnx
    from onnx import helper

    model = onnx.load(str(path), load_external_data=False)
    try:
        from padfree.export.spec import load as load_spec
        namespace = load_spec().namespace
    except (ImportError, OSError, ValueError):
        namespace = "padfree"

    def io(values):
        return [{"name": v.name, "dtype": helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name
                 if v.type.tensor_type.elem_type else "?", "shape": _dims(v)} for v in values]

    floats = {t.data_type for t in model.graph.initializer} & {1, 10, 16}
    dtype = {1: "fp32", 10: "fp16", 16: "bf16"}
    return {"file": str(path), "kind": "onnx",
            "opset": {o.domain or "ai.onnx": o.version for o in model.opset_import},
            "producer": f"{model.producer_name} {model.producer_version}".strip(),
            "inputs": io(model.graph.input), "outputs": io(model.graph.output),
            "nodes": len(model.graph.node),
            "plugin_nodes": dict(sorted(Counter(n.op_type for n in model.graph.node if n.domain == namespace).items())),
            "float_dtype": "/".join(dtype[d] for d in sorted(floats)) or "none",
            "metadata": {p.key: p.value for p in model.metadata_props}}


def engine_facts(sidecar: Path) -> dict:
    data = _read_json(sidecar)
    if not isinstance(data, dict) or data.get("format") != "padfree-engine":
        raise CommandError(f"{sidecar}: not a padfree engine sidecar (format {data.get('format')!r})"
                           if isinstance(data, dict) else f"{sidecar}: not a padfree engine sidecar")
    keep = ("backend", "precision", "precision_mode", "model", "plugins", "profiles", "inputs", "outputs",
            "padfree_version", "engine")
    return {"file": str(sidecar), "kind": "engine", **{k: data[k] for k in keep if k in data}}


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CommandError(f"{path}: not readable JSON ({e})") from e


def _record(path: Path) -> dict:
    """An export folder's JSON record, which is an object."""
    data = _read_json(path)
    if not isinstance(data, dict):
        raise CommandError(f"{path}: expected a JSON object")
    return data


def export_facts(folder: Path) -> dict:
    """What a `padfree export` folder's record says: seq2seq.json (an encoder-decoder) or report.json."""
    if (folder / "seq2seq.json").is_file():
        data = _record(folder / "seq2seq.json")
        keep = ("family", "hf_class", "source", "dtype", "files", "engine_graphs", "encoder", "decoder",
                "encoder_plugins", "decoder_plugins", "generation", "text_files")
        facts = {"file": str(folder), "kind": "seq2seq export"}
        for key in keep:
            value = data.get(key)
            if key == "encoder_plugins" and isinstance(value, dict):
                value = {"io": value.get("io"), "fused": value.get("fused")}
            if key == "decoder_plugins" and isinstance(value, dict):
                value = {"num_beams": value.get("num_beams"), "plugins": value.get("plugins")}
            if key in ("encoder", "decoder", "generation") and isinstance(value, dict):
                value = {k: v for k, v in value.items() if k not in ("inputs", "outputs")}
            if value is not None:
                facts[key] = value
        facts.setdefault("dtype", "fp32")  # exports from before the dtype was recorded
        return facts
    if (folder / "report.json").is_file():
        data = _record(folder / "report.json")
        keep = ("source", "task", "io", "dtype", "model", "rewritten", "fused", "complete", "text_files")
        return {"file": str(folder), "kind": "encoder export", **{k: data[k] for k in keep if k in data}}
    raise CommandError(f"{folder}: a folder without report.json or seq2seq.json, so not a `padfree export` "
                       f"folder; give an .onnx model, an engine, or an export folder")


def _io_line(t: dict) -> str:
    shape = t.get("shape")
    return f"  {t.get('name')}: {t.get('dtype', '?')} {list(shape) if shape is not None else ''}".rstrip()


def format_facts(facts: dict) -> str:
    lines = [f"{facts['file']} ({facts['kind']})"]
    for key, value in facts.items():
        if key in ("file", "kind"):
            continue
        if key in ("inputs", "outputs") and isinstance(value, list):
            lines.append(f"{key}:")
            lines += [_io_line(t) if isinstance(t, dict) else f"  {t}" for t in value]
        elif isinstance(value, dict) and value:
            lines.append(f"{key}:")
            lines += [f"  {k}: {v}" for k, v in value.items()]
        else:
            lines.append(f"{key}: {value if value != {} else 'none'}")
    return "\n".join(lines)
