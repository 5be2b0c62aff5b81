"""A sweep's points on a Dask cluster (simulations/runner/points.py): the same figures as a
local run, and clear errors for what cannot run there."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from distributed import LocalCluster

from simulations.runner.points import DaskPoints, LocalPoints, Sweep
from simulations.runner.run import run_scenario
from simulations.scenario import ScenarioError, parse
from tests.simulations.tiny_scenarios import tiny_ledger


@pytest.fixture(scope="module")
def scheduler() -> Iterator[str]:
    """A loopback Dask cluster: two single-threaded workers in this process, reached over TCP
    as a remote one would be."""
    with LocalCluster(
        processes=False,
        n_workers=2,
        threads_per_worker=1,
        protocol="tcp",
        host="127.0.0.1",
        scheduler_port=0,
        dashboard_address=None,
    ) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tcp://127.0.0.1:")
        yield address


def _square_plus(x: int, y: int, progress: object = None) -> int:
    return x * x + y


def test_dask_sweep_gives_the_figures_of_a_local_run(scheduler: str) -> None:
    marks: list[float] = []
    local = run_scenario(tiny_ledger(1))[0]
    remote = run_scenario(tiny_ledger(1), lambda f, label: marks.append(f), scheduler)[0]
    # every point of the sweep: two sizes, one churn rate
    assert len(remote.results["by_nodes"]) == 2 and len(remote.results["by_churn"]) == 1
    assert json.loads(remote.to_json()) == json.loads(local.to_json())
    assert marks and marks[-1] == pytest.approx(1.0)


def test_dask_points_keep_the_order_of_the_points(scheduler: str) -> None:
    points = [(x, 10 * x) for x in range(7)]
    got = DaskPoints(scheduler).map(Sweep(_square_plus, points, [1.0] * len(points), "t"))
    assert got == [_square_plus(*p) for p in points]
    assert LocalPoints().map(Sweep(_square_plus, points, [1.0] * len(points), "t")) == got


def test_a_workload_without_cluster_sweeps_is_refused(scheduler: str) -> None:
    voting = parse({"kind": "voting", "seed": 1, "nodes": 4}, "x.toml", "x")
    with pytest.raises(ScenarioError, match="--scheduler runs the sweeps of ledger only"):
        run_scenario(voting, scheduler=scheduler)


def test_a_bad_or_silent_scheduler_is_a_clear_error() -> None:
    with pytest.raises(ScenarioError, match="expected tcp://HOST:PORT"):
        DaskPoints("127.0.0.1:8786")
    # port 1 on loopback: nothing listens there, the connection is refused at once
    with pytest.raises(ScenarioError, match="no Dask scheduler at tcp://127.0.0.1:1"):
        DaskPoints("tcp://127.0.0.1:1", connect_timeout_s=0.5).map(Sweep(_square_plus, [(1, 2)], [1.0], "t"))


def test_the_cli_refuses_a_scheduler_that_is_not_a_tcp_address() -> None:
    from click.testing import CliRunner

    from node.cli.simulate import simulate

    result = CliRunner().invoke(simulate, ["ledger", "--scheduler", "localhost:8786"])
    assert result.exit_code == 2 and "tcp://HOST:PORT" in result.output
