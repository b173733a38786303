"""The one place that knows which TensorRT is installed: `tensorrt` (>= 10) or TensorRT-RTX
(`tensorrt_rtx_bindings`, or `tensorrt_rtx`). Everything else in padfree.engines goes through Api.

Precision, per backend (what `padfree build --precision` does):
- tensorrt: a float32 ONNX builds as a weakly typed network; fp16 / bf16 set BuilderFlag.FP16 /
  BF16, which lets TensorRT (and the padfree plugins, through supportsFormatCombination) run layers
  in that precision where it chooses; fp32 clears TF32 so that matrix products stay float32. A model
  whose ONNX is already fp16 / bf16 is built strongly typed (its own dtypes decide).
- tensorrt_rtx: every network is strongly typed and there are no precision flags: the ONNX's
  dtypes decide. The requested precision must equal the model's float dtype; otherwise the build
  is refused (export the model in that dtype), rather than silently building another precision.
Without --precision a build follows the model (default_precision): its own dtype, except a float32
ONNX on TensorRT, which builds weakly typed with fp16 allowed.

Aliased plugin I/O: a plugin whose outputs alias its inputs (the decoder self-attention's caches,
model_info.aliasing_plugins()) builds only with PreviewFeature.ALIASED_PLUGIN_IO_10_03 on (both
backends; TensorRT-RTX refuses the network without it); `allow_aliased_plugin_io` sets it, and
refuses a TensorRT without the feature by name.

TensorRT-RTX's ONNX parser dlopens "libtensorrt_rtx.so" (the unversioned name, which its wheel does
not ship) when it imports a plugin node; `needs_parser_link` says so, and padfree.engines.build
then builds in a child process whose LD_LIBRARY_PATH holds such a link.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from padfree import env

from .errors import BackendUnavailableError, PrecisionError

PRECISIONS = ("fp32", "fp16", "bf16")
ENV_BACKEND = "PADFREE_TRT_BACKEND"  # "tensorrt" or "tensorrt_rtx": which one to prefer
# module name -> backend name; the first importable wins unless PADFREE_TRT_BACKEND says otherwise.
_MODULES = (("tensorrt", "tensorrt"), ("tensorrt_rtx", "tensorrt_rtx"), ("tensorrt_rtx_bindings", "tensorrt_rtx"))


@dataclass
class Api:
    trt: ModuleType
    name: str  # "tensorrt" | "tensorrt_rtx"

    @property
    def version(self) -> str:
        return str(getattr(self.trt, "__version__", "unknown"))

    @property
    def is_rtx(self) -> bool:
        return self.name == "tensorrt_rtx"

    @property
    def has_timing_cache(self) -> bool:
        # TensorRT-RTX keeps the API, but its timing cache operations are no-ops since 1.2.
        return not self.is_rtx

    @property
    def strongly_typed_only(self) -> bool:
        return self.is_rtx or not hasattr(self.trt.BuilderFlag, "FP16")

    def logger(self, verbose: bool = False):
        return self.trt.Logger(self.trt.Logger.VERBOSE if verbose else self.trt.Logger.WARNING)

    def create_network(self, builder, strongly_typed: bool):
        flags = 0
        strongly = getattr(self.trt.NetworkDefinitionCreationFlag, "STRONGLY_TYPED", None)
        if strongly_typed and strongly is not None and not self.is_rtx:
            flags |= 1 << int(strongly)
        return builder.create_network(flags)

    def default_precision(self, model_dtype: str) -> str:
        """What a build without --precision makes: the ONNX's own dtype where the network is strongly
        typed (TensorRT-RTX always; TensorRT for an fp16 / bf16 export), else fp16 for a float32 ONNX
        on TensorRT (weakly typed, so the builder may choose fp16 kernels)."""
        return model_dtype if self.strongly_typed_only or model_dtype != "fp32" else "fp16"

    def plan_precision(self, requested: str | None, model_dtype: str) -> tuple[bool, list[str], str]:
        """(strongly typed, builder flags to set, a sentence saying what the build does).

        requested: "fp32" | "fp16" | "bf16", or None for default_precision(model_dtype).
        model_dtype: the ONNX model's float dtype ("fp32", "fp16", "bf16")."""
        requested = requested or self.default_precision(model_dtype)
        if requested not in PRECISIONS:
            raise PrecisionError(f"precision must be one of {PRECISIONS}, got {requested!r}")
        if self.strongly_typed_only:
            if requested != model_dtype:
                raise PrecisionError(
                    f"{self.name} {self.version} builds strongly typed networks only: the ONNX's dtypes decide the"
                    f" precision, and this model is {model_dtype}. Export it with `padfree export --dtype {requested}`"
                    f" or build without --precision (it follows the model).")
            return True, [], f"strongly typed: {model_dtype} as exported ({self.name} has no precision flags)"
        if model_dtype != "fp32":
            if requested != model_dtype:
                raise PrecisionError(f"the model is already {model_dtype}; build it with --precision {model_dtype}")
            return True, [], f"strongly typed: {model_dtype} as exported"
        if requested == "fp32":
            return False, [], "weakly typed, float32 layers, TF32 disabled"
        flag = {"fp16": "FP16", "bf16": "BF16"}[requested]
        return False, [flag], f"weakly typed with BuilderFlag.{flag}: TensorRT picks {requested} where it can"

    def configure(self, config, flags: list[str], requested: str) -> None:
        for flag in flags:
            config.set_flag(getattr(self.trt.BuilderFlag, flag))
        if requested == "fp32" and hasattr(self.trt.BuilderFlag, "TF32"):
            config.clear_flag(self.trt.BuilderFlag.TF32)

    def allow_aliased_plugin_io(self, config) -> str:
        """Turn on the preview feature that lets plugin outputs alias plugin inputs; returns its name."""
        feature = getattr(getattr(self.trt, "PreviewFeature", None), "ALIASED_PLUGIN_IO_10_03", None)
        if feature is None:
            raise BackendUnavailableError(
                f"{self.name} {self.version} has no PreviewFeature.ALIASED_PLUGIN_IO_10_03, which a network with"
                " aliased plugin I/O (the decoder self-attention's caches) needs: install TensorRT >= 10.3 or"
                " TensorRT-RTX")
        config.set_preview_feature(feature, True)
        return "ALIASED_PLUGIN_IO_10_03"

    def plugin_layers(self, network) -> list[dict[str, str]]:
        """The network's IPluginV3 layers as TensorRT parsed them: layer name, plugin name, namespace
        and version (read from the plugin object, not from the ONNX node), and each output's name,
        dtype and shape as TensorRT inferred them (-1: a runtime dimension)."""
        trt = self.trt
        layers = []
        for i in range(network.num_layers):
            layer = network.get_layer(i)
            if layer.type != trt.LayerType.PLUGIN_V3:
                continue
            layer.__class__ = trt.IPluginV3Layer  # the bindings' documented downcast
            core = layer.plugin.get_capability_interface(trt.PluginCapabilityType.CORE)
            outputs = [layer.get_output(k) for k in range(layer.num_outputs)]
            layers.append({"layer": layer.name, "plugin": core.plugin_name, "namespace": core.plugin_namespace,
                           "version": core.plugin_version,
                           "outputs": [{"name": t.name, "dtype": t.dtype.name, "shape": list(t.shape)}
                                       for t in outputs]})
        return layers

    def needs_parser_link(self) -> Path | None:
        """The versioned libtensorrt_rtx.so.N that needs an unversioned link for the parser, or None."""
        if not self.is_rtx:
            return None
        libs = _rtx_library_dir()
        if libs is None or (libs / "libtensorrt_rtx.so").exists():
            return None
        versioned = sorted(libs.glob("libtensorrt_rtx.so.*"))
        return versioned[0] if versioned else None


def _rtx_library_dir() -> Path | None:
    try:
        libs = importlib.import_module("tensorrt_rtx_libs")
    except ImportError:
        return None
    return Path(libs.__file__).resolve().parent


def load(prefer: str | None = None) -> Api:
    """The installed TensorRT. prefer (or $PADFREE_TRT_BACKEND): "tensorrt" or "tensorrt_rtx"."""
    prefer = prefer or env.get(ENV_BACKEND)
    if prefer not in (None, "tensorrt", "tensorrt_rtx"):
        raise ValueError(f"backend must be 'tensorrt' or 'tensorrt_rtx', got {prefer!r}")
    errors = []
    for module_name, backend in _MODULES:
        if prefer is not None and backend != prefer:
            continue
        try:
            return Api(importlib.import_module(module_name), backend)
        except ImportError as e:
            errors.append(f"{module_name}: {e}")
    raise BackendUnavailableError(
        "no TensorRT Python bindings could be imported (" + "; ".join(errors) + "). Install TensorRT-RTX with"
        " `pip install 'padfree[trt-rtx]'` or TensorRT with `pip install tensorrt`.")


def available(prefer: str | None = None) -> bool:
    try:
        load(prefer)
        return True
    except (BackendUnavailableError, ValueError):
        return False
