"""`symphony bench tasks --concurrency 1,4,16`: the levels are parsed and reach the tasks
bench's run, bad ones are a usage error, and the per-level figures come out of the waves as
node/bench/tasks/concurrency.py documents. The bench itself is not run here (real daemons
and a llama-server build: its figures are in the report of the run)."""

from __future__ import annotations

import inspect

import pytest
from click.testing import CliRunner

from node.bench import load
from node.bench.tasks.concurrency import _figures, _wave, parse_levels
from node.cli.main import bench, bench_options, main


def _given(args: list[str]) -> dict[str, object]:
    with bench.make_context("bench", args) as ctx:
        params = dict(ctx.params)
    options = {k: v for k, v in params.items() if k not in ("name", "quick", "as_json")}
    return bench_options(str(params["name"]), options)


def test_the_levels_reach_the_tasks_bench_run() -> None:
    given = _given(["tasks", "--quick", "--concurrency", "1,4,16", "--json"])
    assert given == {"concurrency": "1,4,16"}
    assert inspect.signature(load("tasks")).bind(True, **given).arguments["concurrency"]
    assert _given(["tasks", "--quick"]) == {}


@pytest.mark.parametrize("spec", ["1,x", "0", "1,,4", "65", ""])
def test_bad_levels_are_a_usage_error(spec: str) -> None:
    with pytest.raises(ValueError, match="concurrency levels"):
        parse_levels(spec)
    result = CliRunner().invoke(main, ["bench", "tasks", "--concurrency", spec])
    assert result.exit_code == 2 and "--concurrency" in result.output, result.output


def test_levels_parse_in_order() -> None:
    assert parse_levels("1,4,16") == (1, 4, 16)
    assert parse_levels("8") == (8,)


def test_a_wave_runs_every_job_and_counts_the_ones_that_succeed() -> None:
    seen: list[int] = []

    def call(job: int) -> bool:
        seen.append(job)
        return job % 2 == 0

    wall_s, latencies, done = _wave(call, [0, 1, 2, 3])
    assert sorted(seen) == [0, 1, 2, 3] and len(latencies) == 4 and done == 2
    assert wall_s >= 0


def test_the_figures_of_a_level() -> None:
    # two waves of 4: 4 done in 2 s, 2 done in 1 s -> (2 + 2) / 2 answers per second
    figures = _figures("x_", 4, [(2.0, [100.0, 200.0, 300.0, 400.0], 4),
                                 (1.0, [500.0, 600.0, 700.0, 800.0], 2)])
    assert figures == {"x_throughput_rps_4": 2.0, "x_p50_ms_4": 500.0,
                       "x_p99_ms_4": 800.0, "x_done_4": 6}
