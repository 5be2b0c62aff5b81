"""llama.cpp's own ``llama-server``: the baseline `symphony bench tasks --concurrency` compares
the network with (what a user would run instead of it).

Built once, CPU only, from the llama.cpp sources that the installed llama-cpp-python vendors
(so both run the same kernels): the sdist of that exact version, fetched with the ordinary
pip client (``pip download --no-binary :all: --no-deps llama-cpp-python==<version>``) unless
a copy already lies in ``<venv>/llama-server/sdist``, is unpacked and built with cmake
(target ``llama-server`` only) into ``<venv>/llama-server/build/bin``. `make llama-server`
builds it; the benchmark builds it on first use when it is missing (the build is not timed).

The sdist leaves out llama.cpp's browser UI (``tools/ui``), which llama-server links an asset
table from; :data:`UI_CMAKE` stands in for it with an empty table, so the server runs its
HTTP API without the browser UI.

:class:`LlamaServer` runs the binary on loopback for one concurrency level (``--parallel``
slots) and says when it is ready.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from types import TracebackType

import httpx

SERVER_DIR = Path(sys.prefix) / "llama-server"
BINARY = SERVER_DIR / "build" / "bin" / "llama-server"
#: cmake options: the portable CPU build the Makefile gives llama-cpp-python, no downloads
CMAKE_OPTIONS = ("-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF", "-DLLAMA_CURL=OFF",
                 "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
                 "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_USE_PREBUILT_UI=OFF",
                 "-DBUILD_SHARED_LIBS=OFF")
#: how long the server may take to load the model and answer /health
READY_TIMEOUT_S = 120.0
UI_CMAKE = '''# symphony-node: the llama-cpp-python sdist leaves out llama.cpp's browser UI (tools/ui);
# llama-server links an asset table from it. This one is empty: the HTTP API without the UI.
set(UI_DIR "${CMAKE_CURRENT_BINARY_DIR}")
file(WRITE "${UI_DIR}/ui.h" "#pragma once
#include <cstddef>
#include <string>
#include <vector>
struct llama_ui_asset {
    std::string name;
    const unsigned char * data;
    std::size_t size;
    std::string type;
    std::string etag;
};
const std::vector<llama_ui_asset> & llama_ui_get_assets();
const llama_ui_asset * llama_ui_find_asset(const std::string & name);
bool llama_ui_use_gzip();
")
file(WRITE "${UI_DIR}/ui.cpp" "#include \\"ui.h\\"
const std::vector<llama_ui_asset> & llama_ui_get_assets() {
    static const std::vector<llama_ui_asset> none;
    return none;
}
const llama_ui_asset * llama_ui_find_asset(const std::string &) { return nullptr; }
bool llama_ui_use_gzip() { return false; }
")
add_custom_target(llama-ui-assets)
add_library(llama-ui STATIC "${UI_DIR}/ui.cpp")
target_include_directories(llama-ui PUBLIC "${UI_DIR}")
'''


class BuildFailed(Exception):
    """The sdist could not be fetched, or cmake failed (the message names the step)."""


def _run(args: list[str], what: str, log: Path) -> None:
    with log.open("a") as out:
        rc = subprocess.run(args, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        raise BuildFailed(f"{what} failed (exit {rc}); see {log}")


def _sdist(log: Path) -> Path:
    """The llama-cpp-python sdist of the installed version: the one kept, else pip's."""
    wanted = f"llama_cpp_python-{version('llama-cpp-python')}.tar.gz"
    kept = SERVER_DIR / "sdist" / wanted
    if not kept.exists():
        _run([sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps",
              f"llama-cpp-python=={version('llama-cpp-python')}", "-d", str(kept.parent)],
             "pip download of the llama-cpp-python sdist", log)
    return kept


def ensure_built(say: Callable[[str], None] = print) -> Path:
    """The llama-server binary, built first when it is missing (minutes); BuildFailed."""
    if BINARY.exists():
        return BINARY
    SERVER_DIR.mkdir(parents=True, exist_ok=True)
    log = SERVER_DIR / "build.log"
    say(f"building llama-server into {SERVER_DIR} (once; log: {log})")
    source = SERVER_DIR / "src"
    if not (source / "vendor" / "llama.cpp" / "CMakeLists.txt").exists():
        with tarfile.open(_sdist(log)) as tar:
            top = tar.getnames()[0].split("/")[0]
            tar.extractall(SERVER_DIR, filter="data")
        (SERVER_DIR / top).rename(source)
    llama = source / "vendor" / "llama.cpp"
    ui = llama / "tools" / "ui"
    if not (ui / "CMakeLists.txt").exists():
        ui.mkdir(parents=True, exist_ok=True)
        (ui / "CMakeLists.txt").write_text(UI_CMAKE)
    build = SERVER_DIR / "build"
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(llama), "-B", str(build), *generator, *CMAKE_OPTIONS],
         "cmake configure", log)
    _run(["cmake", "--build", str(build), "--target", "llama-server",
          "-j", str(os.cpu_count() or 2)], "cmake build", log)
    if not BINARY.exists():
        raise BuildFailed(f"the build made no {BINARY}; see {log}")
    return BINARY


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class LlamaServer:
    """``llama-server`` on ``model`` with ``parallel`` slots of ``slot_ctx`` tokens each and
    ``threads`` threads, on a free loopback port, for the length of a ``with`` block."""

    def __init__(self, model: Path, *, parallel: int, threads: int, slot_ctx: int) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = [str(ensure_built()), "--model", str(model), "--host", "127.0.0.1",
                     "--port", str(self.port), "--parallel", str(parallel),
                     "--ctx-size", str(parallel * slot_ctx), "--threads", str(threads),
                     "--threads-batch", str(threads), "--no-webui"]
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LlamaServer:
        self.proc = subprocess.Popen(self.args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited ({self.proc.returncode}): "
                                   f"{' '.join(self.args)}")
            try:
                if httpx.get(f"{self.url}/health", timeout=2.0).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)  # polling a child process that has no readiness signal
        self.__exit__(None, None, None)
        raise RuntimeError(f"llama-server not ready after {READY_TIMEOUT_S:.0f} s")

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


if __name__ == "__main__":  # `make llama-server`
    print(ensure_built())
