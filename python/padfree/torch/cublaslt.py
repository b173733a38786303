"""cuBLASLt matmuls with a chosen algorithm, through the cuBLASLt library torch itself loaded.

torch's GEMM entry points run the first algorithm cuBLASLt's heuristic lists. Here the list itself
is available (Linear.candidates) and a call runs the algorithm it is given, so that a caller can time
the candidates and keep the fastest (padfree.torch.gemms; bench/gemm_algos.py).

No headers or link step: the few enums and two structs below are cuBLASLt's stable C ABI (cublasLt.h,
CUDA 12 and 13). The library is the one torch already mapped into the process (so one cuBLASLt, one
version), found through /proc/self/maps.
"""
from __future__ import annotations

import ctypes
import itertools
import os
from dataclasses import dataclass

import torch

# cublasLt.h / cublas_api.h / library_types.h
_COMPUTE_32F = 68
_CUDA_DTYPE = {torch.float16: 2, torch.bfloat16: 14, torch.float32: 0}
_R_32F = 0
_DESC_TRANSA, _DESC_TRANSB, _DESC_EPILOGUE, _DESC_BIAS_POINTER, _DESC_BIAS_DATA_TYPE = 3, 4, 7, 8, 26
_OP_N, _OP_T = 0, 1
EPILOGUE_DEFAULT, EPILOGUE_BIAS, EPILOGUE_RELU_BIAS, EPILOGUE_GELU_BIAS = 1, 4, 6, 36
_PREF_MAX_WORKSPACE_BYTES = 1
_CONFIG_ID, _CONFIG_TILE_ID, _CONFIG_SPLITK_NUM, _CONFIG_STAGES_ID, _CONFIG_CLUSTER_SHAPE_ID = 0, 1, 2, 6, 8
_CONFIG_REDUCTION_SCHEME = 3
_CAP_SPLITK_SUPPORT, _CAP_REDUCTION_SCHEME_MASK, _CAP_TILE_IDS, _CAP_STAGES_IDS = 0, 1, 6, 13
_REDUCTION_SCHEMES = (1, 2, 4)  # in place, in the compute type, in the output type
# cublasLtClusterShape_t ids searched: auto, 1x1, 2x1, 4x1, 1x2, 2x2, 1x4 (larger clusters do not pay
# for GEMMs of these sizes and multiply the search)
_CLUSTER_SHAPE_IDS = (0, 2, 3, 4, 5, 6, 8)
WORKSPACE_BYTES = 32 << 20


class Algo(ctypes.Structure):
    _fields_ = [("data", ctypes.c_uint64 * 8)]


class _HeuristicResult(ctypes.Structure):
    _fields_ = [("algo", Algo), ("workspace_size", ctypes.c_size_t), ("state", ctypes.c_int),
                ("waves_count", ctypes.c_float), ("reserved", ctypes.c_int * 4)]


class CublasLtError(RuntimeError):
    pass


def version() -> int:
    """cuBLASLt's version (e.g. 130100 for 13.1.0): saved algorithms are only valid for the same one."""
    return int(library().cublasLtGetVersion())


def _loaded_library_path() -> str | None:
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.rstrip("\n").split(" ")[-1]
            if os.path.basename(path).startswith("libcublasLt.so"):
                return path
    return None


_lib = None


def library() -> ctypes.CDLL:
    """torch's libcublasLt (loaded by one small GEMM if torch has not touched cuBLAS yet)."""
    global _lib
    if _lib is None:
        path = _loaded_library_path()
        if path is None:
            a = torch.ones(8, 8, device="cuda", dtype=torch.float16)
            torch.mm(a, a)
            path = _loaded_library_path()
        if path is None:
            raise CublasLtError("torch did not load libcublasLt (a CPU-only or ROCm build?)")
        lib = ctypes.CDLL(path)
        vp, i32, u64, i64, sz = ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64, ctypes.c_size_t
        for name, args in (
                ("cublasLtCreate", [ctypes.POINTER(vp)]),
                ("cublasLtMatmulDescCreate", [ctypes.POINTER(vp), i32, i32]),
                ("cublasLtMatmulDescSetAttribute", [vp, i32, vp, sz]),
                ("cublasLtMatrixLayoutCreate", [ctypes.POINTER(vp), i32, u64, u64, i64]),
                ("cublasLtMatmulPreferenceCreate", [ctypes.POINTER(vp)]),
                ("cublasLtMatmulPreferenceSetAttribute", [vp, i32, vp, sz]),
                ("cublasLtMatmulAlgoGetHeuristic", [vp, vp, vp, vp, vp, vp, vp, i32,
                                                    ctypes.POINTER(_HeuristicResult), ctypes.POINTER(i32)]),
                ("cublasLtMatmulAlgoConfigGetAttribute", [ctypes.POINTER(Algo), i32, vp, sz, ctypes.POINTER(sz)]),
                ("cublasLtMatmulAlgoConfigSetAttribute", [ctypes.POINTER(Algo), i32, vp, sz]),
                ("cublasLtMatmulAlgoCapGetAttribute", [ctypes.POINTER(Algo), i32, vp, sz, ctypes.POINTER(sz)]),
                ("cublasLtMatmulAlgoGetIds", [vp, i32, i32, i32, i32, i32, i32, i32, ctypes.POINTER(i32),
                                              ctypes.POINTER(i32)]),
                ("cublasLtMatmulAlgoInit", [vp, i32, i32, i32, i32, i32, i32, i32, ctypes.POINTER(Algo)]),
                ("cublasLtMatmulAlgoCheck", [vp, vp, vp, vp, vp, vp, ctypes.POINTER(Algo),
                                             ctypes.POINTER(_HeuristicResult)]),
                ("cublasLtGetVersion", []),
                ("cublasLtMatmul", [vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, vp, ctypes.POINTER(Algo),
                                    vp, sz, vp])):
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = args, i32
        lib.cublasLtGetVersion.restype = sz
        _lib = lib
    return _lib


def _check(status: int, what: str) -> None:
    if status != 0:
        raise CublasLtError(f"{what} failed: cublasStatus_t {status}")


_handles: dict[int, ctypes.c_void_p] = {}


def _handle() -> ctypes.c_void_p:
    dev = torch.cuda.current_device()
    if dev not in _handles:
        h = ctypes.c_void_p()
        _check(library().cublasLtCreate(ctypes.byref(h)), "cublasLtCreate")
        _handles[dev] = h
    return _handles[dev]


@dataclass(frozen=True)
class AlgoInfo:
    index: int           # rank in the heuristic's list (0 = torch's choice), -1: from Linear.enumerate
    config_id: int
    tile_id: int
    stages_id: int
    split_k: int
    cluster_shape_id: int
    workspace_size: int

    def label(self) -> str:
        rank = f"#{self.index}" if self.index >= 0 else "enum"
        return (f"{rank} algo {self.config_id} tile {self.tile_id} stages {self.stages_id} "
                f"splitk {self.split_k} cluster {self.cluster_shape_id} workspace {self.workspace_size}")


def _config(algo: Algo, attr: int) -> int:
    v, size = ctypes.c_uint64(0), ctypes.c_size_t(0)
    # sizeInBytes must be the attribute's own size: ask for it first
    library().cublasLtMatmulAlgoConfigGetAttribute(ctypes.byref(algo), attr, None, 0, ctypes.byref(size))
    ok = 0 < size.value <= 8 and library().cublasLtMatmulAlgoConfigGetAttribute(
        ctypes.byref(algo), attr, ctypes.byref(v), size.value, ctypes.byref(size)) == 0
    return int(v.value) if ok else -1


def _set_config(algo: Algo, attr: int, value: int, size: int) -> bool:
    v = ctypes.c_uint64(value)  # little-endian: the low `size` bytes are the value
    return library().cublasLtMatmulAlgoConfigSetAttribute(ctypes.byref(algo), attr, ctypes.byref(v), size) == 0


def _cap_ids(algo: Algo, cap: int) -> list[int]:
    """A capability that is an array of uint32 ids (tile or stage ids)."""
    size = ctypes.c_size_t(0)
    if library().cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), cap, None, 0, ctypes.byref(size)) != 0:
        return []
    n = size.value // 4
    if n == 0:
        return []
    ids = (ctypes.c_uint32 * n)()
    if library().cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), cap, ids, n * 4, ctypes.byref(size)) != 0:
        return []
    return list(ids[:size.value // 4])


def _cap_value(algo: Algo, cap: int) -> int:
    """A capability that is one int32/uint32 (0 where it cannot be read)."""
    v, size = ctypes.c_uint32(0), ctypes.c_size_t(0)
    ok = library().cublasLtMatmulAlgoCapGetAttribute(ctypes.byref(algo), cap, ctypes.byref(v), 4,
                                                     ctypes.byref(size)) == 0
    return int(v.value) if ok else 0


def _info(algo: Algo, index: int, workspace_size: int) -> "AlgoInfo":
    cfg = [_config(algo, attr) for attr in
           (_CONFIG_ID, _CONFIG_TILE_ID, _CONFIG_STAGES_ID, _CONFIG_SPLITK_NUM, _CONFIG_CLUSTER_SHAPE_ID)]
    return AlgoInfo(index, *cfg, workspace_size)


class Linear:
    """out[M, N] = epilogue(x[M, K] @ weight[N, K]^T (+ bias)) (+ out, when accumulate), all row-major
    and contiguous, dtype fixed; one problem shape per object (the descriptors bake it in)."""

    def __init__(self, rows: int, in_features: int, out_features: int, dtype: torch.dtype, *,
                 epilogue: int = EPILOGUE_DEFAULT, accumulate: bool = False, max_workspace: int = 0):
        """max_workspace: bytes of workspace the candidates may ask for (0: none, so that no buffer is
        shared between streams or graphs); calls pass a workspace tensor of at least that size."""
        lib = library()
        # Column-major view: D^T[N, M] = W[N, K] (row-major = col-major K x N, transposed) @ X^T.
        self._desc = ctypes.c_void_p()
        _check(lib.cublasLtMatmulDescCreate(ctypes.byref(self._desc), _COMPUTE_32F, _R_32F), "MatmulDescCreate")
        for attr, value in ((_DESC_TRANSA, _OP_T), (_DESC_TRANSB, _OP_N), (_DESC_EPILOGUE, epilogue)):
            v = ctypes.c_int32(value)
            _check(lib.cublasLtMatmulDescSetAttribute(self._desc, attr, ctypes.byref(v), 4), "MatmulDescSetAttribute")
        if epilogue != EPILOGUE_DEFAULT:
            v = ctypes.c_int32(_CUDA_DTYPE[dtype])
            _check(lib.cublasLtMatmulDescSetAttribute(self._desc, _DESC_BIAS_DATA_TYPE, ctypes.byref(v), 4),
                   "MatmulDescSetAttribute(bias type)")
        t = self._dtype_id = _CUDA_DTYPE[dtype]
        self._a, self._b, self._d = (ctypes.c_void_p() for _ in range(3))
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self._a), t, in_features, out_features, in_features), "A")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self._b), t, in_features, rows, in_features), "B")
        _check(lib.cublasLtMatrixLayoutCreate(ctypes.byref(self._d), t, out_features, rows, out_features), "D")
        self._pref = ctypes.c_void_p()
        _check(lib.cublasLtMatmulPreferenceCreate(ctypes.byref(self._pref)), "PreferenceCreate")
        self.max_workspace = max_workspace
        ws = ctypes.c_uint64(max_workspace)
        _check(lib.cublasLtMatmulPreferenceSetAttribute(self._pref, _PREF_MAX_WORKSPACE_BYTES, ctypes.byref(ws), 8),
               "PreferenceSetAttribute")
        self._alpha, self._beta = ctypes.c_float(1.0), ctypes.c_float(1.0 if accumulate else 0.0)

    def candidates(self, count: int = 32) -> list[tuple[Algo, AlgoInfo]]:
        lib = library()
        results = (_HeuristicResult * count)()
        found = ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetHeuristic(_handle(), self._desc, self._a, self._b, self._d, self._d,
                                                  self._pref, count, results, ctypes.byref(found)),
               "MatmulAlgoGetHeuristic")
        out = []
        for i in range(found.value):
            r = results[i]
            if r.state != 0:
                continue
            algo = Algo()
            ctypes.memmove(ctypes.byref(algo), ctypes.byref(r.algo), ctypes.sizeof(Algo))
            out.append((algo, _info(algo, i, int(r.workspace_size))))
        return out

    def enumerate(self, max_workspace: int | None = None, split_ks: tuple[int, ...] = (1,)
                  ) -> list[tuple[Algo, AlgoInfo]]:
        """Every configuration cuBLASLt accepts for this problem beyond the heuristic's ranked list: each
        algorithm id x its tile and stage ids x cluster shapes x split_ks (a split above 1 with each
        reduction scheme the algorithm supports), kept where cublasLtMatmulAlgoCheck passes with at
        most max_workspace bytes (default: this object's). Host-only, ~1 ms per thousand checks."""
        lib, t = library(), self._dtype_id
        limit = self.max_workspace if max_workspace is None else max_workspace
        ids, found = (ctypes.c_int * 256)(), ctypes.c_int(0)
        _check(lib.cublasLtMatmulAlgoGetIds(_handle(), _COMPUTE_32F, _R_32F, t, t, t, t, 256, ids,
                                            ctypes.byref(found)), "MatmulAlgoGetIds")
        out = []
        for algo_id in ids[:found.value]:
            base = Algo()
            if lib.cublasLtMatmulAlgoInit(_handle(), _COMPUTE_32F, _R_32F, t, t, t, t, algo_id,
                                          ctypes.byref(base)) != 0:
                continue
            settings = [[(_CONFIG_TILE_ID, tile, 4) for tile in _cap_ids(base, _CAP_TILE_IDS)] or [None],
                        [(_CONFIG_STAGES_ID, stage, 4) for stage in _cap_ids(base, _CAP_STAGES_IDS)] or [None]]
            if _set_config(Algo.from_buffer_copy(base), _CONFIG_CLUSTER_SHAPE_ID, 0, 2):
                settings.append([(_CONFIG_CLUSTER_SHAPE_ID, c, 2) for c in _CLUSTER_SHAPE_IDS])
            splits = [None]
            if _cap_value(base, _CAP_SPLITK_SUPPORT):
                mask = _cap_value(base, _CAP_REDUCTION_SCHEME_MASK)
                schemes = [bit for bit in _REDUCTION_SCHEMES if mask & bit]
                splits += [((_CONFIG_SPLITK_NUM, k, 4), (_CONFIG_REDUCTION_SCHEME, scheme, 4))
                           for k in split_ks if k > 1 for scheme in schemes]
            for choice in itertools.product(*settings, splits):
                algo = Algo.from_buffer_copy(base)
                flat = [c for c in choice[:-1] if c is not None] + list(choice[-1] or ())
                if not all(_set_config(algo, attr, value, size) for attr, value, size in flat):
                    continue
                workspace = self.check(algo)
                if workspace is not None and workspace <= limit:
                    out.append((algo, _info(algo, -1, workspace)))
        return out

    def check(self, algo: Algo) -> int | None:
        """The workspace bytes `algo` needs for this problem, or None where cuBLASLt refuses it (an
        algorithm saved by another cuBLASLt or for another device)."""
        result = _HeuristicResult()
        status = library().cublasLtMatmulAlgoCheck(_handle(), self._desc, self._a, self._b, self._d, self._d,
                                                   ctypes.byref(algo), ctypes.byref(result))
        return int(result.workspace_size) if status == 0 else None

    def __call__(self, x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, bias: torch.Tensor | None = None,
                 workspace: torch.Tensor | None = None, algo: Algo | None = None) -> torch.Tensor:
        """algo: one of candidates() or enumerate(), or None for cuBLASLt's own pick. workspace: at
        least the bytes check(algo) reports (cuBLASLt refuses less), or max_workspace for its own pick."""
        lib = library()
        if bias is not None:
            p = ctypes.c_void_p(bias.data_ptr())
            _check(lib.cublasLtMatmulDescSetAttribute(self._desc, _DESC_BIAS_POINTER, ctypes.byref(p), 8),
                   "MatmulDescSetAttribute(bias)")
        stream = torch._C._cuda_getCurrentRawStream(x.device.index)
        ws = None if workspace is None else workspace.data_ptr()
        ws_bytes = 0 if workspace is None else workspace.numel() * workspace.element_size()
        if algo is None and ws_bytes < self.max_workspace:
            raise CublasLtError(f"a workspace of {self.max_workspace} bytes is needed")
        _check(lib.cublasLtMatmul(_handle(), self._desc, ctypes.byref(self._alpha), weight.data_ptr(), self._a,
                                  x.data_ptr(), self._b, ctypes.byref(self._beta), out.data_ptr(), self._d,
                                  out.data_ptr(), self._d, None if algo is None else ctypes.byref(algo),
                                  ws, ws_bytes, stream), "cublasLtMatmul")
        return out
