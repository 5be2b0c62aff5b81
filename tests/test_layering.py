"""ARCHITECTURE.md's layering, enforced: protocol/ and crypto/ stay pure, imports run one way.

Walks every module's AST (not a grep), so imports inside functions and under TYPE_CHECKING
count like any other. It fails on:

* an import of I/O, clock or global randomness in protocol/ or crypto/, or a use of
  ``os.urandom`` or the module-level ``random`` functions there;
* an import against the direction of the layers (``ALLOWED_IMPORTS``): crypto <- protocol <-
  models <- simulations <- node, where node (its CLI runs the simulator) is imported by no
  other package and protocol imports neither models nor anything of the network;
* an import cycle among the modules of the five packages (strongly connected components);
* more than ``MAX_FLAT_MODULES`` modules directly in node/, protocol/ or node/bench/ (the rest
  live in one subpackage per concern, or per benchmark with its helpers);
* libp2p imported outside the p2p module, or the network imported by models/.

Each checker has a self-test on a small tree built to breach it.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_PURE = {"trio", "libp2p", "sqlite3", "torch", "time", "socket", "asyncio",
                  "threading", "subprocess", "requests", "httpx", "urllib", "structlog", "logging"}
RANDOM_FUNCS = {"random", "randint", "randrange", "choice", "choices", "shuffle", "sample",
                "uniform", "getrandbits", "seed", "gauss", "randbytes"}


def modules(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def parse(path: Path) -> ast.Module:
    """``path``'s syntax tree; every check walks the same trees, so each is parsed once."""
    return _parse_source(path.read_text(), str(path))


@functools.cache
def _parse_source(source: str, filename: str) -> ast.Module:
    return ast.parse(source, filename=filename)


def violations(path: Path, forbidden: set[str], *, pure: bool = True) -> list[str]:
    """Imports of ``forbidden`` packages; with ``pure``, also global randomness and urandom."""
    tree = parse(path)
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
        tree = parse(path)
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
    assert users and all(u.startswith("node/p2p/") for u in users), users


def test_models_know_nothing_of_the_network() -> None:
    bad = {str(p.relative_to(ROOT)): v for p in modules("models")
           if (v := violations(p, {"libp2p", "trio", "node", "socket"}, pure=False))}
    assert not bad, bad


def test_the_checker_catches_breaches(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("import time\nimport random\nx = random.random()\nimport os\nos.urandom(4)\n")
    found = violations(bad, FORBIDDEN_PURE)
    assert len(found) == 3, found


# ------------------------------------------------------------------ direction and cycles

#: the five packages, lowest layer first
PACKAGES = ("crypto", "protocol", "models", "simulations", "node")
#: which of the five packages each one may import (tests/ may import anything)
ALLOWED_IMPORTS = {
    "crypto": {"crypto"},
    "protocol": {"crypto", "protocol"},
    "models": {"crypto", "protocol", "models"},
    "simulations": {"crypto", "protocol", "models", "simulations"},
    "node": {"crypto", "protocol", "models", "simulations", "node"},
}
#: modules allowed directly in node/ and in protocol/ (``__init__`` not counted)
MAX_FLAT_MODULES = 12


def module_files(root: Path, packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of ``packages`` under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def imported_names(path: Path, module: str) -> list[tuple[int, str]]:
    """Every ``(line, dotted name)`` that ``path`` (module ``module``) imports, anywhere.

    ``from a.b import c`` yields ``a.b.c`` (which :func:`resolve` maps to module ``a.b.c``
    when that is a module, else to ``a.b``); relative imports are made absolute.
    """
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    names = []
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            names += [(node.lineno, f"{base}.{alias.name}" if base else alias.name)
                      for alias in node.names]
    return names


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The longest prefix of dotted ``name`` that is one of ``modules``, or None."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        candidate = ".".join(parts[:end])
        if candidate in modules:
            return candidate
    return None


def direction_breaches(root: Path) -> list[str]:
    """Imports from one of the five packages into one it may not import."""
    breaches = []
    for module, path in module_files(root).items():
        package = module.split(".")[0]
        for line, name in imported_names(path, module):
            target = name.split(".")[0]
            if target in ALLOWED_IMPORTS and target not in ALLOWED_IMPORTS[package]:
                breaches.append(f"{path.relative_to(root)}:{line} imports {name}")
    return sorted(breaches)


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the modules of the five packages it imports (itself excluded)."""
    modules = module_files(root)
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for _, name in imported_names(path, module):
            target = resolve(name, modules)
            if target is not None and target != module:
                graph[module].add(target)
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, targets = work[-1]
            for target in targets:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[module] = min(low[module], index[target])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1:
                        cycles.append(sorted(component))
    return cycles


def flat_modules(root: Path, package: str) -> list[str]:
    """The modules directly in ``package`` (not in a subpackage), ``__init__`` not counted."""
    return sorted(p.name for p in (root / package).glob("*.py") if p.name != "__init__.py")


def test_imports_run_one_way_between_the_packages() -> None:
    breaches = direction_breaches(ROOT)
    assert not breaches, "imports against the layers (see ALLOWED_IMPORTS):\n" + "\n".join(breaches)


def test_no_import_cycles_among_the_modules() -> None:
    cycles = import_cycles(import_graph(ROOT))
    assert not cycles, f"{len(cycles)} import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


@pytest.mark.parametrize("package", ["node", "protocol", "node/bench"])
def test_few_modules_sit_directly_in_the_package(package: str) -> None:
    flat = flat_modules(ROOT, package)
    assert len(flat) <= MAX_FLAT_MODULES, f"{package}/ holds {len(flat)} modules directly: {flat}"


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_direction_checker_catches_breaches(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "crypto/__init__.py": "",
        "crypto/keys.py": "",
        "protocol/__init__.py": "from crypto import keys\n",  # allowed
        "protocol/machine.py": "def f():\n    import node.daemon\n",  # inside a function
        "models/__init__.py": "",
        "models/solver.py": (
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from node.market import executor\n"
            "from protocol import machine\n"  # allowed
        ),
        "simulations/__init__.py": "",
        "simulations/swarm.py": "from node import testnet\nimport models.solver\n",
        "node/__init__.py": "",
        "node/daemon.py": "import simulations.swarm, models, protocol.machine, crypto.keys\n",
    })
    found = direction_breaches(root)
    assert found == [
        "models/solver.py:3 imports node.market.executor",
        "protocol/machine.py:2 imports node.daemon",
        "simulations/swarm.py:1 imports node.testnet",
    ], found
    _tree(root, {"protocol/relay/__init__.py": "",
                 "protocol/relay/plan.py": "from ..machine import f\nfrom models import solver\n"})
    assert "protocol/relay/plan.py:2 imports models.solver" in direction_breaches(root)


def test_the_cycle_checker_catches_cycles(tmp_path: Path) -> None:
    root = _tree(tmp_path, {
        "node/__init__.py": "",
        "node/relay/__init__.py": "",
        # a cycle through an import inside a function, and a relative one
        "node/relay/api.py": "def routes():\n    from node.relay.service import Service\n",
        "node/relay/service.py": "from . import streams\n",
        "node/relay/streams.py": "from node.relay import api\n",
        # a two-module cycle under TYPE_CHECKING
        "models/__init__.py": "",
        "models/backend.py": "import typing\nif typing.TYPE_CHECKING:\n    import models.hf\n",
        "models/hf.py": "from models.backend import Backend\n",
        # no cycle: a chain, and a module that imports its own package's __init__
        "models/a.py": "import models.b\n",
        "models/b.py": "import models\n",
    })
    graph = import_graph(root)
    assert graph["node.relay.service"] == {"node.relay.streams"}
    assert graph["models.hf"] == {"models.backend"}  # `from m import name` -> module m
    assert import_cycles(graph) == [
        ["models.backend", "models.hf"],
        ["node.relay.api", "node.relay.service", "node.relay.streams"],
    ]
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_the_flat_module_count_sees_only_the_top_level(tmp_path: Path) -> None:
    root = _tree(tmp_path, {f"node/m{i}.py": "" for i in range(MAX_FLAT_MODULES + 1)})
    _tree(root, {"node/__init__.py": "", "node/market/a.py": "", "node/market/b.py": ""})
    assert len(flat_modules(root, "node")) == MAX_FLAT_MODULES + 1
