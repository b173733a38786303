"""The plugin spec (plugins/spec/plugins.json) as Python objects: the one loader everyone imports.

The exporter builds plugin nodes from it, the ONNX Runtime references check node fields against it,
and the TensorRT plugins (C++) follow the same names. Node convention (TensorRT ONNX parser's
plugin fallback): op_type = plugin name, domain = namespace, attributes `plugin_version`,
`plugin_namespace` and the plugin's fields.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np

_HERE = Path(__file__).resolve().parent
# Where plugins.json is, first match wins: beside the installed package (a wheel installs it as
# padfree/spec/plugins.json, next to padfree/export/), then the source tree (an editable install or
# a checkout, where export/ sits beside plugins/).
SPEC_CANDIDATES = (_HERE.parent / "spec" / "plugins.json", _HERE.parent / "plugins" / "spec" / "plugins.json")
SPEC_PATH = next((p for p in SPEC_CANDIDATES if p.is_file()), SPEC_CANDIDATES[-1])

_FIELD_TYPES = {"int32": int, "float32": float}


@dataclass(frozen=True)
class Port:
    name: str
    dtype: str  # "float" (the activation dtype), "float32", "int32", "int64", "any", "same as <input>"
    shape: tuple[str, ...]
    when: str | None = None  # "field == value": the port exists only then
    when_default: Any = None  # the default of the field `when` names, where it has one
    aliases: str | None = None  # an output: the input whose buffer it may share (updated in place)

    def present(self, fields: dict[str, Any]) -> bool:
        if self.when is None:
            return True
        key, value = (s.strip() for s in self.when.split("=="))
        if key not in fields and self.when_default is not None:
            return int(self.when_default) == int(value)
        return int(fields[key]) == int(value)


@dataclass(frozen=True)
class Plugin:
    name: str
    doc: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    fields: dict[str, str] = field(default_factory=dict)  # field name -> "int32" | "float32"
    # field name -> its default: a field added after the first exports, which a node may lack (it then
    # has the default, the behaviour from before the field; the TensorRT plugins read it the same way)
    defaults: dict[str, Any] = field(default_factory=dict)

    @property
    def aliases_inputs(self) -> bool:
        """Whether an output may share its input's buffer (the plugin updates state in place)."""
        return any(p.aliases for p in self.outputs)

    def input_names(self, fields: dict[str, Any]) -> list[str]:
        return [p.name for p in self.inputs if p.present(fields)]

    def output_names(self, fields: dict[str, Any]) -> list[str]:
        return [p.name for p in self.outputs if p.present(fields)]

    def check_fields(self, fields: dict[str, Any]) -> dict[str, Any]:
        """Fields converted to their spec types, defaults filled in; raises ValueError naming a missing
        (without a default) or unknown one."""
        fields = {**self.defaults, **fields}
        missing = sorted(set(self.fields) - set(fields))
        extra = sorted(set(fields) - set(self.fields))
        if missing or extra:
            raise ValueError(f"{self.name}: fields missing {missing}, unknown {extra} "
                             f"(the spec has {sorted(self.fields)})")
        out = {}
        for key, kind in self.fields.items():
            value = fields[key]
            if isinstance(value, np.generic):
                value = value.item()
            out[key] = _FIELD_TYPES[kind](value)
        return out


@dataclass(frozen=True)
class Spec:
    namespace: str
    version: str
    plugins: dict[str, Plugin]

    def __getitem__(self, name: str) -> Plugin:
        return self.plugins[name]

    def node_attributes(self, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        """The attributes a plugin node carries: plugin_version, plugin_namespace and its fields."""
        attrs = {"plugin_version": self.version, "plugin_namespace": self.namespace}
        attrs.update(self.plugins[name].check_fields(fields))
        return attrs


def _port(d: dict, defaults: dict[str, Any]) -> Port:
    when = d.get("when")
    key = when.split("==")[0].strip() if when else None
    return Port(d["name"], d["dtype"], tuple(d["shape"]), when, defaults.get(key), d.get("aliases"))


def _plugin(name: str, p: dict) -> Plugin:
    fields = p.get("fields", {})
    defaults = {k: _FIELD_TYPES[v["type"]](v["default"]) for k, v in fields.items() if "default" in v}
    return Plugin(name, p.get("doc", ""), tuple(_port(d, defaults) for d in p["inputs"]),
                  tuple(_port(d, defaults) for d in p["outputs"]), {k: v["type"] for k, v in fields.items()},
                  defaults)


@lru_cache(maxsize=None)
def load(path: str | Path = SPEC_PATH) -> Spec:
    if not Path(path).is_file():
        looked = ", ".join(str(p) for p in SPEC_CANDIDATES) if Path(path) == SPEC_PATH else str(path)
        raise FileNotFoundError(f"plugin spec plugins.json not found (looked in: {looked}): reinstall padfree, whose"
                                " wheel carries it as padfree/spec/plugins.json, or run from a source checkout")
    raw = json.loads(Path(path).read_text())
    plugins = {name: _plugin(name, p) for name, p in raw["plugins"].items()}
    return Spec(raw["namespace"], str(raw["version"]), plugins)
