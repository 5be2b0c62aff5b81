"""`symphony bench simulate`'s workload: reproducible, and every node ends up with every item."""

from __future__ import annotations

from simulations.machines.ledger import ledger_of
from simulations.workloads.bench import bench_swarm

TIMING = ("wall_s", "cpu_s", "setup_s", "events_per_s", "virtual_s_per_wall_s", "peak_rss_mb")


def _run(seed: int) -> tuple[dict[str, object], list[bytes]]:
    report, swarm = bench_swarm(300, 4.0, seed=seed, tasks_per_min=2.0)
    now = swarm.machine_now_ms
    digests = [ledger_of(node).view.digest_hash(now) for node in swarm.nodes]
    return {k: v for k, v in report.items() if k not in TIMING}, digests


def test_bench_is_reproducible_and_converges() -> None:
    first, digests = _run(3)
    again, digests_again = _run(3)
    assert first == again and digests == digests_again, "seed 3"
    assert first["tasks_ended"] == first["tasks_submitted"] > 0
    # gossip reached everyone: after the last broadcast has spread, all ledgers agree
    assert len(set(digests)) == 1



def test_bench_command_takes_a_size() -> None:
    from click.testing import CliRunner

    from node.bench.simulate import run
    from node.cli.main import bench, bench_options

    assert bench_options("simulate", {"nodes": 40, "link": None}) == {"nodes": 40}
    assert run(True, nodes=40)["nodes"] == 40
    result = CliRunner().invoke(bench, ["simulate", "--quick", "--nodes", "1", "--json"])
    assert result.exit_code == 2 and "--nodes" in result.output
