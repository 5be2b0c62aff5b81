"""Doctor checks that need no network: key, data dir, listen ports, model, disk and memory, GPU.

Each function takes what it checks and returns one :class:`Check` (``listen_checks``: one per
address). They read and probe, never change anything: the key is loaded, not rewritten; a port
is bound and released at once; the model is loaded, timed on a short generation and freed.
"""

from __future__ import annotations

import errno
import shutil
import socket
import tempfile
import time
from dataclasses import astuple
from pathlib import Path
from typing import Any

from node import plugins
from node.doctor.report import FAIL, PASS, SKIP, WARN, Check
from node.p2p.multiaddrs import AddrError, direct_tcp_endpoints, tcp_endpoint

#: free disk the data dir needs beyond what is stored: the ledger, chunk store and logs grow
MIN_FREE_DISK_BYTES = 1 << 30
#: memory a node needs beside its model's weights (Python, libp2p, SQLite, the API)
NODE_MEMORY_BYTES = 512 << 20
#: tokens generated to measure the model's speed (a few seconds on 2 CPU cores)
MEASURE_TOKENS = 16
MEMINFO = Path("/proc/meminfo")


def key_check(key_path: Path) -> Check:
    from crypto.keys import KeyFileError, load_identity

    if not key_path.exists():
        return Check("key", FAIL, f"no key file at {key_path}",
                     f"symphony keygen --data-dir {key_path.parent} (or start the node once)")
    try:
        identity = load_identity(key_path)
    except KeyFileError as exc:
        mode = key_path.stat().st_mode & 0o777
        fix = (f"chmod 600 {key_path}" if mode & 0o077 else
               f"restore the key from a backup, or make a new identity: symphony keygen "
               f"--force --data-dir {key_path.parent}")
        return Check("key", FAIL, f"{exc} (mode {mode:04o})", fix)
    return Check("key", PASS, f"{key_path} (mode 0600), peer id {identity.peer_id}")


def data_dir_check(data_dir: Path) -> Check:
    if not data_dir.is_dir():
        return Check("data dir", FAIL, f"{data_dir} does not exist",
                     f"symphony node run --data-dir {data_dir} creates it on first run")
    try:
        with tempfile.NamedTemporaryFile(dir=data_dir, prefix=".doctor-"):
            pass
    except OSError as exc:
        return Check("data dir", FAIL, f"{data_dir} is not writable: {exc.strerror}",
                     f"chown $(id -un) {data_dir} && chmod 700 {data_dir}")
    return Check("data dir", PASS, f"{data_dir} is writable")


def listen_checks(listen: tuple[str, ...], bound: list[str] | None) -> list[Check]:
    """Each listen address bindable; ``bound``: the running daemon's addresses (None: stopped)."""
    checks = []
    for addr in listen:
        name = f"listen {addr}"
        try:
            family, host, port = astuple(tcp_endpoint(addr))
        except AddrError as exc:
            checks.append(Check(name, FAIL, str(exc), "fix 'listen' in node.toml or --listen"))
            continue
        if bound is not None:
            # port 0 became whatever port the daemon got: any of its TCP addresses
            held = [str(e) for e in direct_tcp_endpoints(bound) if e.port == port or not port]
            if held:
                checks.append(Check(name, PASS, f"bound by the running daemon ({held[0]})"))
            else:
                checks.append(Check(name, FAIL, "the running daemon does not list it among "
                                    f"its addresses ({', '.join(bound) or 'none'})",
                                    "restart the daemon and read its log for the listen error"))
            continue
        if port == 0:
            checks.append(Check(name, PASS, "port 0: the daemon picks a free port"))
            continue
        checks.append(_bind_check(name, family, host, port))
    return checks


def _bind_check(name: str, family: str, host: str, port: int) -> Check:
    af = socket.AF_INET6 if family == "ip6" else socket.AF_INET
    try:
        with socket.socket(af, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
    except OSError as exc:
        why = "already in use" if exc.errno == errno.EADDRINUSE else exc.strerror
        fix = (f"stop what holds it (ss -ltnp 'sport = :{port}') or listen on another port: "
               f"--listen /{family}/{host}/tcp/<port>")
        if exc.errno == errno.EACCES:
            fix = "ports below 1024 need root: listen on a port above 1024"
        return Check(name, FAIL, f"cannot bind {host}:{port}: {why}", fix)
    return Check(name, PASS, f"{host}:{port} is free")


def model_check(executor: Any) -> tuple[Check, int]:
    """The configured model present, loadable and its speed; also its file size (0: none)."""
    if executor is None or not executor.solver:
        return Check("model", WARN, "no solver configured: this node executes no tasks",
                     "set [executor] solver = \"models\" in node.toml to serve the default "
                     "model"), 0
    if executor.solver != "models":
        try:
            plugins.load(executor.solver)
        except (ImportError, AttributeError) as exc:
            return Check("model", FAIL, f"solver {executor.solver!r} cannot be imported: {exc}",
                         "fix [executor] solver in node.toml (\"module:callable\")"), 0
        return Check("model", PASS, f"custom solver {executor.solver} imports "
                     "(its model is its own: not measured)"), 0
    return _models_check(executor.model, executor.threads)


def _models_check(spec: str, threads: int) -> tuple[Check, int]:
    from models.backend import measure_throughput
    from models.config import ModelConfig
    from models.loader import load_backend
    from models.registry import ModelNotFound, resolve

    fix = ("set [executor] model in node.toml to a registry name, an existing .gguf file or "
           "an HF directory (\"\" = the embedded default)")
    try:
        info = resolve(spec)
    except ModelNotFound as exc:
        return Check("model", FAIL, f"model not found: {exc}", fix), 0
    size = _size(info.path)
    started = time.perf_counter()
    try:
        backend = load_backend(ModelConfig(spec=spec or ModelConfig().spec, n_threads=threads))
    except Exception as exc:  # a corrupt file, a missing backend library: say which
        return Check("model", FAIL, f"{info.path} does not load: {exc!r}", fix), size
    try:
        load_s = time.perf_counter() - started
        tokens_per_s = measure_throughput(backend, n_tokens=MEASURE_TOKENS)
    finally:
        backend.close() if hasattr(backend, "close") else None
    return Check("model", PASS, f"{info.name} ({info.path}, {size / 2**20:.0f} MiB) loads in "
                 f"{load_s:.2f} s, {tokens_per_s:.1f} tokens/s"), size


def _size(path: Path) -> int:
    if path.is_dir():
        return sum(p.stat().st_size for p in path.iterdir() if p.is_file())
    return path.stat().st_size if path.exists() else 0


def resources_check(data_dir: Path, model_bytes: int) -> Check:
    """Free disk under the data dir and available memory for the model and the node."""
    where = data_dir if data_dir.exists() else data_dir.parent
    if not where.exists():
        return Check("disk and memory", SKIP, f"{data_dir} and its parent do not exist",
                     "create the data dir first (symphony node run)")
    free = shutil.disk_usage(where).free
    available = available_memory_bytes()
    need_memory = model_bytes + NODE_MEMORY_BYTES
    detail = (f"{free / 2**30:.1f} GiB free disk (need {MIN_FREE_DISK_BYTES / 2**30:.1f}), "
              f"{available / 2**30:.1f} GiB memory available (need "
              f"{need_memory / 2**30:.2f}: model {model_bytes / 2**20:.0f} MiB + node)")
    if free < MIN_FREE_DISK_BYTES:
        return Check("disk and memory", FAIL, detail, f"free disk space under {where}, or "
                     "use a data dir on a larger disk (--data-dir)")
    if available and available < need_memory:
        return Check("disk and memory", FAIL, detail,
                     "close other programs, or configure a smaller model ([executor] model)")
    return Check("disk and memory", PASS, detail)


def available_memory_bytes(meminfo: Path = MEMINFO) -> int:
    """``MemAvailable`` of /proc/meminfo in bytes (0 where the platform does not say)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def gpu_check() -> Check:
    from models.device import detect_gpu

    report = detect_gpu()
    if report.found:
        return Check("gpu", PASS, report.line())
    return Check("gpu", WARN, report.line() + " (models run on the CPU)",
                 "with an NVIDIA GPU and its driver: make install GPU=cuda")
