"""ARCHITECTURE.md's layering, enforced: protocol/ and crypto/ stay pure.

Walks every module's AST (not a grep) and fails on an import of I/O, clock or global
randomness, or on a use of ``os.urandom`` or the module-level ``random`` functions. Also
checks that only node/p2p.py imports libp2p and that models/ never imports the network.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_PURE = {"trio", "libp2p", "sqlite3", "torch", "time", "socket", "asyncio",
                  "threading", "subprocess", "requests", "httpx", "urllib", "structlog", "logging"}
RANDOM_FUNCS = {"random", "randint", "randrange", "choice", "choices", "shuffle", "sample",
                "uniform", "getrandbits", "seed", "gauss", "randbytes"}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def violations(path: Path, forbidden: set[str], *, pure: bool = True) -> list[str]:
    """Imports of ``forbidden`` packages; with ``pure``, also global randomness and urandom."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in forbidden:
                    found.append(f"line {node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom) and node.module:
            root = node.module.split(".")[0]
            if root in forbidden:
                found.append(f"line {node.lineno}: from {node.module} import ...")
            if not pure:
                continue
            if node.module == "random" and {a.name for a in node.names} & RANDOM_FUNCS:
                found.append(f"line {node.lineno}: module-level random function imported")
            if node.module == "os" and any(a.name == "urandom" for a in node.names):
                found.append(f"line {node.lineno}: os.urandom")
        elif pure and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            if node.value.id == "os" and node.attr == "urandom":
                found.append(f"line {node.lineno}: os.urandom")
            if node.value.id == "random" and node.attr in RANDOM_FUNCS:
                found.append(f"line {node.lineno}: random.{node.attr}() (global randomness)")
    return found


@pytest.mark.parametrize("package", ["protocol", "crypto"])
def test_pure_layers_do_no_io(package: str) -> None:
    bad = {str(p.relative_to(ROOT)): v for p in modules(package) if (v := violations(p, FORBIDDEN_PURE))}
    assert not bad, f"{package}/ must stay sans-IO: {bad}"


def test_protocol_imports_only_crypto_protocol_stdlib_msgpack() -> None:
    import sys

    allowed = {"crypto", "protocol", "msgpack", "__future__"} | set(sys.stdlib_module_names)
    bad = {}
    for path in modules("protocol"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names = [node.module]
            for name in names:
                if name.split(".")[0] not in allowed:
                    bad.setdefault(str(path.relative_to(ROOT)), []).append(name)
    assert not bad, bad


def test_only_p2p_module_imports_libp2p() -> None:
    users = [
        str(p.relative_to(ROOT))
        for pkg in ("node", "protocol", "crypto", "models", "simulations")
        for p in modules(pkg)
        if violations(p, {"libp2p"}, pure=False)
    ]
    assert set(users) <= {"node/p2p.py"}, users


def test_models_know_nothing_of_the_network() -> None:
    bad = {str(p.relative_to(ROOT)): v for p in modules("models")
           if (v := violations(p, {"libp2p", "trio", "node", "socket"}, pure=False))}
    assert not bad, bad


def test_the_checker_catches_breaches(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nimport random\nx = random.random()\nimport os\nos.urandom(4)\n")
    found = violations(bad, FORBIDDEN_PURE)
    assert len(found) == 3, found
