"""Scenario files: TOML describing one experiment (nodes, network, workload, faults, sweep).

Layout (every table optional except ``kind``)::

    name = "ledger"                  # defaults to the file name
    kind = "ledger"                  # which workload runs it: simulations/workloads/<kind>.py
    description = "..."
    seed = 1
    nodes = 1000                     # the workload's default node count
    duration_s = 600                 # virtual seconds per run
    wire_bytes = false               # true: every message crosses as encoded bytes

    [network]
    latency = { kind = "lognormal", a = 40.0, b = 0.5, jitter_ms = 5.0 }
    # or a region matrix: regions = ["eu", "us"], matrix_ms = [[10, 80], [80, 15]]
    loss = 0.0
    duplicate = 0.0
    degree = 8                       # connections each node opens (static random topology)
    bandwidth = [{ share = 0.8, up_mbps = 20, down_mbps = 100 },
                 { share = 0.2, up_mbps = 200, down_mbps = 1000 }]
    partitions = [{ start_s = 100, heal_s = 200, groups = [0.5, 0.5] }]

    [churn]                          # per-minute rates, as fractions of live nodes
    crash_per_min = 0.0
    leave_per_min = 0.0
    join_per_min = 0.0
    restart_after_s = 60             # a crashed node comes back (with its store) after this

    [compute]                        # how executors compute (the voting workload)
    backend = "cost"                 # "cost": time = tokens / speed, answers from a profile;
                                     # "models": the real models/ backend (small runs only)
    model = ""                       # models: registry name or path ("" = embedded SmolLM2)
    max_tokens = 128                 # models: generation budget per answer
    temperature = 0.7                # models: sampling temperature (0 = greedy: k copies agree)
    time = "tokens"                  # models: "tokens" = generated tokens / the device's speed
                                     # (reproducible); "measured" = the solve's wall-clock time
    threads = 0                      # models: CPU threads (0 = the backend's default)

    [workload]                       # the workload's own keys (see its module)
    [sweep]                          # parameter lists the workload sweeps (see its module)

Unknown top-level keys and unknown keys in ``network``/``churn``/``compute`` are errors that name the key,
as the node's config is. ``--nodes`` and ``--seed`` on the command line override the file.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from simulations.network import MBIT, LatencyModel, LinkFaults

SCENARIO_DIR = Path(__file__).parent / "scenarios"
TOP_KEYS = {
    "name",
    "kind",
    "description",
    "seed",
    "nodes",
    "duration_s",
    "wire_bytes",
    "network",
    "churn",
    "compute",
    "workload",
    "sweep",
}
NETWORK_KEYS = {
    "latency",
    "regions",
    "matrix_ms",
    "loss",
    "duplicate",
    "degree",
    "bandwidth",
    "partitions",
}
CHURN_KEYS = {"crash_per_min", "leave_per_min", "join_per_min", "restart_after_s"}
COMPUTE_KEYS = {"backend", "model", "max_tokens", "temperature", "time", "threads"}
#: ``[compute] backend``: the cost model, or the real models/ backend
COMPUTE_BACKENDS = ("cost", "models")
#: ``[compute] time`` with the models backend: reproducible token time, or wall-clock time
COMPUTE_TIMES = ("tokens", "measured")
#: ``[compute] max_tokens`` upper bound (protocol.market.messages caps a task's budget far higher; a
#: real solve on a CPU at this budget already takes seconds)
MAX_COMPUTE_TOKENS = 4096


class ScenarioError(ValueError):
    """A scenario file is malformed; the message names the file and the key."""


@dataclass(frozen=True)
class BandwidthClass:
    share: float
    up_bps: float
    down_bps: float


@dataclass(frozen=True)
class PartitionSpec:
    start_s: float
    heal_s: float
    #: fractions of the nodes in each group, in node order
    groups: tuple[float, ...]


@dataclass(frozen=True)
class NetworkSpec:
    latency: LatencyModel = field(default_factory=lambda: LatencyModel("lognormal", 40.0, 0.5))
    faults: LinkFaults = field(default_factory=LinkFaults)
    degree: int = 8
    bandwidth: tuple[BandwidthClass, ...] = (BandwidthClass(1.0, 50 * MBIT, 200 * MBIT),)
    partitions: tuple[PartitionSpec, ...] = ()


@dataclass(frozen=True)
class ChurnSpec:
    crash_per_min: float = 0.0
    leave_per_min: float = 0.0
    join_per_min: float = 0.0
    restart_after_s: float = 60.0

    @property
    def active(self) -> bool:
        return bool(self.crash_per_min or self.leave_per_min or self.join_per_min)


@dataclass(frozen=True)
class ComputeSpec:
    backend: str = "cost"
    model: str = ""  # registry name, .gguf path or HF dir; "" = the embedded default
    max_tokens: int = 128  # generation budget of each real answer
    temperature: float = 0.7  # sampled, so the k executors of a task may disagree
    time: str = "tokens"  # virtual compute time: "tokens" (reproducible) or "measured"
    threads: int = 0  # CPU threads of the real backend; 0 = its default

    @property
    def real(self) -> bool:
        return self.backend == "models"


@dataclass(frozen=True)
class Scenario:
    name: str
    kind: str
    description: str = ""
    seed: int = 1
    nodes: int = 100
    duration_s: float = 600.0
    wire_bytes: bool = False
    network: NetworkSpec = field(default_factory=NetworkSpec)
    churn: ChurnSpec = field(default_factory=ChurnSpec)
    compute: ComputeSpec = field(default_factory=ComputeSpec)
    workload: dict[str, Any] = field(default_factory=dict)
    sweep: dict[str, Any] = field(default_factory=dict)
    #: the node count was given on the command line (workloads then run that size only)
    nodes_overridden: bool = False

    def with_overrides(self, *, nodes: int | None = None, seed: int | None = None) -> Scenario:
        out = self
        if nodes is not None:
            if nodes < 2:
                raise ScenarioError("--nodes must be at least 2")
            out = replace(out, nodes=nodes, nodes_overridden=True)
        if seed is not None:
            out = replace(out, seed=seed)
        return out

    def as_dict(self) -> dict[str, Any]:
        net = self.network
        return {
            "name": self.name,
            "kind": self.kind,
            "description": self.description,
            "seed": self.seed,
            "nodes": self.nodes,
            "duration_s": self.duration_s,
            "wire_bytes": self.wire_bytes,
            "network": {
                "latency": {
                    "kind": net.latency.kind,
                    "a": net.latency.a,
                    "b": net.latency.b,
                    "jitter_ms": net.latency.jitter_ms,
                    "regions": list(net.latency.region_names),
                },
                "loss": net.faults.loss,
                "duplicate": net.faults.duplicate,
                "degree": net.degree,
                "bandwidth": [
                    {"share": b.share, "up_bps": b.up_bps, "down_bps": b.down_bps}
                    for b in net.bandwidth
                ],
                "partitions": [
                    {"start_s": p.start_s, "heal_s": p.heal_s, "groups": list(p.groups)}
                    for p in net.partitions
                ],
            },
            "churn": vars(self.churn).copy(),
            "compute": vars(self.compute).copy(),
            "workload": dict(self.workload),
            "sweep": dict(self.sweep),
        }


def _check_keys(where: str, table: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise ScenarioError(
            f"{where}: unknown key {unknown[0]!r} (known: {', '.join(sorted(allowed))})"
        )


def _network(where: str, raw: dict[str, Any]) -> NetworkSpec:
    _check_keys(f"{where} [network]", raw, NETWORK_KEYS)
    lat = dict(raw.get("latency", {}))
    latency = LatencyModel(
        kind=str(lat.pop("kind", "lognormal")),
        a=float(lat.pop("a", 40.0)),
        b=float(lat.pop("b", 0.5)),
        jitter_ms=float(lat.pop("jitter_ms", 0.0)),
        region_names=tuple(raw.get("regions", ())),
        regions=tuple(tuple(float(v) for v in row) for row in raw.get("matrix_ms", ())),
    )
    if lat:
        raise ScenarioError(f"{where} [network.latency]: unknown key {sorted(lat)[0]!r}")
    bands = (
        tuple(
            BandwidthClass(
                float(b["share"]), float(b["up_mbps"]) * MBIT, float(b["down_mbps"]) * MBIT
            )
            for b in raw.get("bandwidth", ())
        )
        or NetworkSpec().bandwidth
    )
    total = sum(b.share for b in bands)
    if abs(total - 1.0) > 1e-6:
        raise ScenarioError(f"{where} [network.bandwidth]: shares add up to {total}, not 1")
    parts = tuple(
        PartitionSpec(float(p["start_s"]), float(p["heal_s"]), tuple(float(g) for g in p["groups"]))
        for p in raw.get("partitions", ())
    )
    return NetworkSpec(
        latency=latency,
        faults=LinkFaults(
            loss=float(raw.get("loss", 0.0)), duplicate=float(raw.get("duplicate", 0.0))
        ),
        degree=int(raw.get("degree", 8)),
        bandwidth=bands,
        partitions=parts,
    )


def _compute(where: str, raw: dict[str, Any]) -> ComputeSpec:
    where = f"{where} [compute]"
    _check_keys(where, raw, COMPUTE_KEYS)
    spec = ComputeSpec()

    def get(key: str, kind: type, default: Any) -> Any:
        value = raw.get(key, default)
        ok = isinstance(value, kind) and not (kind is not bool and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            ok, value = True, float(value)
        if not ok:
            raise ScenarioError(f"{where} {key}: expected a {kind.__name__}, got {value!r}")
        return value

    backend = get("backend", str, spec.backend)
    if backend not in COMPUTE_BACKENDS:
        raise ScenarioError(
            f"{where} backend: unknown value {backend!r} (known: {', '.join(COMPUTE_BACKENDS)})"
        )
    time_kind = get("time", str, spec.time)
    if time_kind not in COMPUTE_TIMES:
        raise ScenarioError(
            f"{where} time: unknown value {time_kind!r} (known: {', '.join(COMPUTE_TIMES)})"
        )
    max_tokens = get("max_tokens", int, spec.max_tokens)
    if not 1 <= max_tokens <= MAX_COMPUTE_TOKENS:
        raise ScenarioError(f"{where} max_tokens: {max_tokens} is not in 1..{MAX_COMPUTE_TOKENS}")
    temperature = get("temperature", float, spec.temperature)
    if not 0.0 <= temperature <= 2.0:
        raise ScenarioError(f"{where} temperature: {temperature} is not in 0..2")
    threads = get("threads", int, spec.threads)
    if threads < 0:
        raise ScenarioError(f"{where} threads: {threads} is negative")
    model = get("model", str, spec.model)
    if backend == "cost" and len(raw.keys() - {"backend"}):
        extra = sorted(raw.keys() - {"backend"})[0]
        raise ScenarioError(f'{where} {extra}: only used with backend = "models"')
    return ComputeSpec(backend, model, max_tokens, temperature, time_kind, threads)


def parse(raw: dict[str, Any], where: str, default_name: str) -> Scenario:
    _check_keys(where, raw, TOP_KEYS)
    if "kind" not in raw:
        raise ScenarioError(f"{where}: 'kind' is required (which workload runs the scenario)")
    churn_raw = raw.get("churn", {})
    _check_keys(f"{where} [churn]", churn_raw, CHURN_KEYS)
    try:
        return Scenario(
            name=str(raw.get("name", default_name)),
            kind=str(raw["kind"]),
            description=str(raw.get("description", "")),
            seed=int(raw.get("seed", 1)),
            nodes=int(raw.get("nodes", 100)),
            duration_s=float(raw.get("duration_s", 600.0)),
            wire_bytes=bool(raw.get("wire_bytes", False)),
            network=_network(where, raw.get("network", {})),
            churn=ChurnSpec(**{k: float(v) for k, v in churn_raw.items()}),
            compute=_compute(where, raw.get("compute", {})),
            workload=dict(raw.get("workload", {})),
            sweep=dict(raw.get("sweep", {})),
        )
    except (TypeError, KeyError, ValueError) as exc:
        if isinstance(exc, ScenarioError):
            raise
        raise ScenarioError(f"{where}: {exc}") from None


def resolve(name_or_path: str) -> Path:
    """A path to a TOML file, or the name of a shipped scenario (``ledger`` -> scenarios/ledger.toml)."""
    path = Path(name_or_path)
    if path.suffix == ".toml" and path.exists():
        return path
    shipped = SCENARIO_DIR / f"{name_or_path.removesuffix('.toml')}.toml"
    if shipped.exists():
        return shipped
    known = ", ".join(sorted(p.stem for p in SCENARIO_DIR.glob("*.toml")))
    raise ScenarioError(f"no scenario {name_or_path!r}: not a .toml file, nor one of: {known}")


def load(name_or_path: str) -> Scenario:
    path = resolve(name_or_path)
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: {exc}") from None
    return parse(raw, str(path), path.stem)


def workload_value(scenario: Scenario, key: str, default: Any) -> Any:
    """A ``[workload]`` value of the type of ``default`` (a bad value names the key)."""
    value = scenario.workload.get(key, default)
    try:
        if isinstance(default, bool):
            if not isinstance(value, bool):
                raise TypeError
            return value
        if isinstance(default, (int, float, str)):
            return type(default)(value)
        return value
    except (TypeError, ValueError):
        raise ScenarioError(
            f"{scenario.name} [workload] {key}: expected a {type(default).__name__}, got {value!r}"
        ) from None
