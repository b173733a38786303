"""ONNX -> engine: parse (with the padfree plugin library loaded), optimization profiles over
total tokens / batch / longest sequence, precision per backend (trt_api), timing cache, progress,
then the engine file and its JSON sidecar (padfree.engines.sidecar)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import padfree
from padfree import env as padfree_env, kernel_sizes, outputs

from . import model_info, plugin_library, profiles, sidecar, trt_api
from .errors import BuildError, EngineError
from .progress import monitor_class

log = logging.getLogger(__name__)
DEFAULT_MAX_SEQLEN = 512
DEFAULT_MAX_CACHE = 256
_WORKER_ENV = "PADFREE_ENGINES_BUILD_WORKER"


@dataclass
class BuildOptions:
    onnx: str
    output: str
    precision: str | None = None  # None: the backend's default for the model's dtype (trt_api.default_precision)
    max_tokens: int = 4096
    max_batch: int = 64
    max_seqlen: int | None = None  # default: min(max_tokens, the model's position table, 512 if unknown)
    max_cache: int | None = None  # decoder step: the longest K/V cache L (default DEFAULT_MAX_CACHE)
    num_beams: int | None = None  # decoder step: rows = batch x num_beams (default: the graph's field, else 1)
    profiles: list[str] = field(default_factory=list)  # extra "TOKENSxBATCH[xSEQLEN]" profiles
    timing_cache: str | None = None
    plugin_library: str | None = None
    backend: str | None = None  # "tensorrt" | "tensorrt_rtx" | None: whichever is installed
    progress: bool = True
    verbose: bool = False


def build(options: BuildOptions) -> dict[str, Any]:
    """Build options.onnx into options.output and write its sidecar; returns the sidecar's contents."""
    onnx_path = Path(options.onnx)
    if not onnx_path.is_file():
        raise BuildError(f"{onnx_path} does not exist")
    _check_options(options)
    info = model_info.read(onnx_path)
    _check_kernel_sizes(info, onnx_path)
    if info.plugins:
        _check_wiring(onnx_path)
    all_profiles = _profiles(options, info)
    api = trt_api.load(options.backend)
    if options.precision is None:
        options = replace(options, precision=api.default_precision(info.float_dtype))
    strongly_typed, flags, precision_mode = api.plan_precision(options.precision, info.float_dtype)
    library = plugin_library.find(options.plugin_library) if info.plugins else None

    link = api.needs_parser_link() if library is not None else None
    if link is not None and not padfree_env.is_set(_WORKER_ENV):
        return _build_in_worker(options, link)

    start = time.perf_counter()
    log.info("building %s with %s %s: %s; profiles %s", onnx_path.name, api.name, api.version, precision_mode,
             ", ".join(f"{p.max_tokens}x{p.max_batch}x{p.max_seqlen}"
                       + (f" (cache {p.max_cache}, {p.num_beams} beams)" if p.max_cache else "") for p in all_profiles))
    logger = api.logger(options.verbose)
    if library is not None:
        plugin_library.load_into(api.trt, library)
    builder = api.trt.Builder(logger)
    network = api.create_network(builder, strongly_typed)
    parser = api.trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx_path)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise BuildError(f"{api.name} could not parse {onnx_path}: {errors}")
    plugin_layers = api.plugin_layers(network)
    _check_plugin_layers(plugin_layers, info.plugin_nodes, onnx_path)

    config = builder.create_builder_config()
    api.configure(config, flags, options.precision)
    preview_features = [api.allow_aliased_plugin_io(config)] if info.aliased_plugin_io else []
    profile_records = []
    for p in all_profiles:
        trt_profile = builder.create_optimization_profile()
        shapes = profiles.shapes(info, p)
        for name, s in shapes.items():
            trt_profile.set_shape(name, s["min"], s["opt"], s["max"])
        config.add_optimization_profile(trt_profile)
        profile_records.append({**p.to_dict(), "shapes": shapes})
    timing_cache = options.timing_cache
    if timing_cache is not None and not api.has_timing_cache:
        log.warning("%s %s ignores timing caches (a no-op there): --timing-cache %s is not used", api.name,
                    api.version, timing_cache)
        timing_cache = None
    cache = _load_timing_cache(config, timing_cache)
    progress_class = monitor_class(api.trt) if options.progress else None
    if progress_class is not None:
        config.progress_monitor = progress_class()

    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise BuildError(f"{api.name} failed to build {onnx_path} (its messages are above; rerun with -v for more)")
    blob = bytes(plan)
    if cache is not None:
        outputs.write_bytes(timing_cache, bytes(config.get_timing_cache().serialize()))
    out = Path(options.output)
    metadata = {
        "format": sidecar.FORMAT,
        "format_version": sidecar.FORMAT_VERSION,
        "padfree_version": padfree.__version__,
        "backend": {"name": api.name, "version": api.version},
        "model": {"onnx": str(onnx_path.resolve()), "sha256": plugin_library.sha256(onnx_path),
                  **{k: v for k, v in info.to_dict().items()
                     if k not in ("inputs", "outputs", "plugins", "plugin_nodes", "attention_sizes")}},
        "precision": options.precision,
        "precision_mode": precision_mode,
        "profiles": profile_records,
        "inputs": [asdict(t) for t in info.inputs],
        "outputs": [asdict(t) for t in info.outputs],
        "plugins": info.plugins,
        "plugin_layers": plugin_layers,
        "preview_features": preview_features,
        "plugin_library": None if library is None else {"path": str(library), "sha256": plugin_library.sha256(library)},
        "timing_cache": timing_cache,
        "engine": {"bytes": len(blob), "sha256": sidecar.digest(blob)},
        "build_seconds": round(time.perf_counter() - start, 2),
    }
    # The engine, then its sidecar (the mark of a complete build), each renamed into place whole: an
    # interruption between the two leaves a pair whose hashes disagree, which open_engine refuses.
    with outputs.staged(out.parent) as stage:
        stage.path(out.name).write_bytes(blob)
        stage.path(sidecar.path_for(out).name).write_text(sidecar.text(metadata))
    log.info("wrote %s (%.1f MB) and %s in %.1f s", out, len(blob) / 1e6, sidecar.path_for(out).name,
             metadata["build_seconds"])
    return metadata


def _check_options(options: BuildOptions) -> None:
    """The numbers and paths of a build, checked before the slow part (a build takes minutes)."""
    for name in ("max_tokens", "max_batch", "max_seqlen", "max_cache", "num_beams"):
        value = getattr(options, name)
        if value is None and name in ("max_seqlen", "max_cache", "num_beams"):
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise BuildError(f"{name} must be a positive integer, got {value!r}")
    if Path(options.output).suffix == ".json":
        raise BuildError(f"output {options.output} ends in .json, the sidecar's suffix: name the engine file"
                         " (MODEL.engine); its sidecar goes beside it")
    try:
        outputs.writable_file(options.output, "engine output")
        if options.timing_cache is not None:
            outputs.writable_file(options.timing_cache, "timing cache")
    except outputs.OutputError as e:
        raise BuildError(str(e)) from e


def _check_wiring(onnx_path: Path) -> None:
    """Plugin nodes whose inputs are the wrong tensors still parse and build; refuse them here."""
    from padfree.export.wiring import problems

    found = problems(onnx_path)
    if found:
        raise BuildError(f"{onnx_path}: plugin nodes wired against the spec (plugins/spec/plugins.json):\n  - "
                         + "\n  - ".join(found) + "\nExport the model again with `padfree export`.")


def _check_kernel_sizes(info: model_info.ModelInfo, onnx_path: Path) -> None:
    """Refuse attention nodes the kernel library has no kernels for now, not at the engine's first run."""
    for heads, head_dim in sorted(set(info.attention_sizes)):
        problem = kernel_sizes.attention_problem(heads, head_dim)
        if problem is not None:
            raise BuildError(f"{onnx_path}: a PadfreeAttention node of {heads} heads x {head_dim}: {problem};"
                             " export the model again (padfree export leaves such an attention unfused with"
                             " --allow-partial)")


def _check_plugin_layers(layers: list[dict[str, str]], nodes: dict[str, int], onnx_path: Path) -> None:
    """Every padfree plugin node became a plugin layer of its own name (and nothing else did)."""
    made: dict[str, int] = {}
    for layer in layers:
        if layer["namespace"] == model_info.PLUGIN_NAMESPACE:
            made[layer["plugin"]] = made.get(layer["plugin"], 0) + 1
    if made != nodes:
        raise BuildError(f"{onnx_path}: the ONNX has plugin nodes {nodes}, but the parsed network has padfree plugin"
                         f" layers {made}")


def _profiles(options: BuildOptions, info: model_info.ModelInfo) -> list[profiles.Profile]:
    limit = info.max_positions
    max_seqlen = options.max_seqlen if options.max_seqlen is not None else \
        min(options.max_tokens, limit or DEFAULT_MAX_SEQLEN)
    if limit is not None and max_seqlen > limit:
        raise BuildError(f"max_seqlen {max_seqlen} exceeds the model's position table ({limit} positions)")
    step = {}
    if info.io == "decoder_step":
        if info.num_beams is not None and options.num_beams not in (None, info.num_beams):
            raise BuildError(f"num_beams {options.num_beams}: this decoder step's cross-attention serves num_beams"
                             f" {info.num_beams} (fixed at export: `padfree export --num-beams N`)")
        step = {"max_cache": options.max_cache or DEFAULT_MAX_CACHE,
                "num_beams": info.num_beams or options.num_beams or 1}
    elif options.max_cache is not None or options.num_beams is not None:
        raise BuildError("max_cache and num_beams are a decoder step's profile dimensions; "
                         f"this graph is {info.io}")
    try:
        main = replace(profiles.make(options.max_tokens, options.max_batch, max_seqlen), **step)
        extra = [replace(profiles.parse(text, max_seqlen), **step) for text in options.profiles]
    except ValueError as e:
        raise BuildError(str(e)) from e
    for p in extra:
        if not main.fits(p.max_tokens, p.max_batch, p.max_seqlen):
            raise BuildError(f"profile {p.max_tokens}x{p.max_batch}x{p.max_seqlen} exceeds --max-tokens"
                             f" {main.max_tokens} / --max-batch {main.max_batch} / --max-seqlen {main.max_seqlen}")
    # Smallest first: the backend takes the first profile a batch fits.
    return sorted(set(extra) | {main}, key=lambda p: (p.max_tokens, p.max_batch, p.max_seqlen, p.max_cache))


def _load_timing_cache(config, path: str | None):
    if path is None:
        return None
    data = Path(path).read_bytes() if Path(path).is_file() else b""
    cache = config.create_timing_cache(data)
    if cache is None or not config.set_timing_cache(cache, ignore_mismatch=False):
        raise BuildError(f"timing cache {path} was refused (made by another TensorRT or device?); delete it")
    return cache


def _build_in_worker(options: BuildOptions, versioned: Path) -> dict[str, Any]:
    """Builds in a child process whose LD_LIBRARY_PATH has libtensorrt_rtx.so -> `versioned` (see
    trt_api): the dynamic loader reads LD_LIBRARY_PATH only at process start."""
    with tempfile.TemporaryDirectory(prefix="padfree-trt-") as tmp:
        (Path(tmp) / "libtensorrt_rtx.so").symlink_to(versioned)
        error_file = Path(tmp) / "error.json"
        env = padfree_env.with_value(_WORKER_ENV, str(error_file))
        env["LD_LIBRARY_PATH"] = tmp + (os.pathsep + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
        log.debug("TensorRT-RTX's parser needs libtensorrt_rtx.so: building in a child process")
        done = subprocess.run([sys.executable, "-m", "padfree.engines.build", json.dumps(asdict(options))], env=env)
        if error_file.is_file():
            kind, message = json.loads(error_file.read_text())
            from . import errors
            raise getattr(errors, kind, BuildError)(message)
        if done.returncode != 0:
            raise BuildError(f"the engine build process failed (exit status {done.returncode}); see its messages above")
    return sidecar.read(options.output)


def _worker_main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    options = BuildOptions(**json.loads(argv[0]))
    try:
        build(options)
    except (EngineError, OSError) as e:  # an unwritable output too: one message in the parent
        padfree_env.path(_WORKER_ENV).write_text(json.dumps([type(e).__name__, str(e)]))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main(sys.argv[1:]))
