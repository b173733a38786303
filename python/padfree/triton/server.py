"""A local tritonserver, started from the nvidia-pytriton wheel's binaries (tests and bench/serve.py).

    with LocalServer("models/") as server:           # gRPC on a free loopback port
        client = tritonclient.grpc.InferenceServerClient(server.grpc_url)

nvidia-pytriton ships tritonserver, the Python backend and one backend stub per Python version
(pytriton/tritonserver/python_backend_stubs/3.X). What makes its Python models run here:
- the stub built for this interpreter's version, placed as backends/python/triton_python_backend_stub;
- the stub links libpython3.X.so.1.0 by name, and the dynamic linker finds the system's first
  (Debian's 3.11.2 beside a pyenv 3.11.7): a libpython of another patch release under this
  interpreter's standard library fails inside threading ('_thread.RLock' object has no attribute
  '_recursion_count'). So LD_LIBRARY_PATH puts this interpreter's LIBDIR first.
Install: `pip install --no-deps nvidia-pytriton` (its Python dependencies pin numpy < 2; only its
binaries are used here), or point PADFREE_TRITONSERVER at the tritonserver binary of a Triton install
(its backends beside it, as in /opt/tritonserver).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from padfree import env

from ._repository import TritonError


@dataclass(frozen=True)
class Distribution:
    binary: Path          # bin/tritonserver
    backends: Path        # holds python/libtriton_python.so
    libraries: Path | None  # the wheel's bundled shared libraries
    stubs: Path | None    # python_backend_stubs/<version>/triton_python_backend_stub (pytriton's layout)


def find() -> Distribution:
    """The tritonserver to run: $PADFREE_TRITONSERVER, else the nvidia-pytriton wheel's. TritonError if neither."""
    path = env.path("PADFREE_TRITONSERVER")
    if path is not None:
        if not path.is_file():
            raise TritonError(f"PADFREE_TRITONSERVER={path}: no such file")
        return Distribution(path, path.parent.parent / "backends", None, None)
    spec = importlib.util.find_spec("pytriton")   # located, not imported (its dependencies may be absent)
    if spec is None or not spec.submodule_search_locations:
        raise TritonError("no tritonserver: pip install --no-deps nvidia-pytriton, or set PADFREE_TRITONSERVER to a"
                          " Triton install's bin/tritonserver")
    root = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    return Distribution(root / "bin" / "tritonserver", root / "backends", root.parent.parent / "nvidia_pytriton.libs",
                        root / "python_backend_stubs")


def python_library_dir() -> str:
    """This interpreter's libpython directory (the stub needs a shared libpython of this very build)."""
    libdir = sysconfig.get_config_var("LIBDIR") or ""
    name = f"libpython{sys.version_info[0]}.{sys.version_info[1]}.so.1.0"
    if not (Path(libdir) / name).is_file():
        raise TritonError(f"this Python ({sys.executable}) has no {name} in {libdir!r}; the Python backend's stub"
                          " embeds it: use a Python built with --enable-shared (pyenv: PYTHON_CONFIGURE_OPTS="
                          "--enable-shared) or the system's python3 with its libpython3.X package")
    return libdir


def _backends(dist: Distribution, work: Path) -> Path:
    """A backend directory whose python/ holds the stub for this interpreter's version."""
    if dist.stubs is None:
        return dist.backends
    stub = dist.stubs / f"{sys.version_info[0]}.{sys.version_info[1]}" / "triton_python_backend_stub"
    if not stub.is_file():
        raise TritonError(f"{dist.stubs} has no stub for Python {sys.version_info[0]}.{sys.version_info[1]}")
    python = work / "backends" / "python"
    python.mkdir(parents=True)
    for f in (dist.backends / "python").iterdir():
        (python / f.name).symlink_to(f)
    (python / "triton_python_backend_stub").symlink_to(stub)
    return python.parent


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalServer:
    """tritonserver on 127.0.0.1 (gRPC only) over `repository`; a context manager that waits for the
    server and its models to be ready and stops the process on exit. The server's log is `log_path`."""

    def __init__(self, repository: str | os.PathLike, startup_timeout_s: float = 120.0, extra_args: tuple = ()):
        self.repository = Path(repository).resolve()
        self.startup_timeout_s = startup_timeout_s
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> LocalServer:
        dist = find()
        self._work = Path(tempfile.mkdtemp(prefix="padfree-triton-"))
        self.log_path = self._work / "tritonserver.log"
        port = _free_port()
        self.grpc_url = f"127.0.0.1:{port}"
        libraries = [python_library_dir()] + ([str(dist.libraries)] if dist.libraries else [])
        environment = env.with_search_path("LD_LIBRARY_PATH", libraries)
        argv = [str(dist.binary), f"--model-repository={self.repository}",
                f"--backend-directory={_backends(dist, self._work)}", "--allow-http=false", "--allow-metrics=false",
                "--grpc-address=127.0.0.1", f"--grpc-port={port}", "--exit-timeout-secs=10", *self.extra_args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, env=environment, stdout=log, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self) -> None:
        import tritonclient.grpc as grpcclient

        client = grpcclient.InferenceServerClient(self.grpc_url)
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise TritonError(f"tritonserver exited ({self.process.returncode}) while starting:\n{self.log_tail()}")
            try:
                if client.is_server_ready():
                    return
            except Exception:  # noqa: BLE001 - not listening yet
                pass
            time.sleep(0.2)
        raise TritonError(f"tritonserver not ready after {self.startup_timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def __exit__(self, *exc) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
        self.log = self.log_tail(200)     # kept for the caller's report; the folder goes
        shutil.rmtree(self._work, ignore_errors=True)
