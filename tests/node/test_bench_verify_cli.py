"""`symphony bench verify --honest N` and `--only PART,...`: parsed, passed to the verify bench's run, refused by the
benches that do not take it. The bench itself is not run here (it loads the real model: the
figures are in the README; tests/node/test_bench_verify_swaps.py runs its parts)."""

from __future__ import annotations

import inspect

import click
import pytest
from click.testing import CliRunner

from node.bench import load
from node.cli.main import bench, bench_options, main


def _given(args: list[str]) -> dict[str, object]:
    with bench.make_context("bench", args) as ctx:
        params = dict(ctx.params)
    options = {k: v for k, v in params.items() if k not in ("name", "quick", "as_json")}
    return bench_options(str(params["name"]), options)


def test_honest_reaches_the_verify_bench_run() -> None:
    given = _given(["verify", "--quick", "--honest", "300", "--json"])
    assert given == {"honest": 300}
    signature = inspect.signature(load("verify"))
    assert signature.bind(True, **given).arguments["honest"] == 300
    assert signature.parameters["honest"].default is None  # the bench's own default
    assert _given(["verify", "--quick"]) == {}


def test_honest_is_refused_by_other_benches_and_must_be_positive() -> None:
    with pytest.raises(click.BadParameter, match="--honest applies only to: verify"):
        _given(["models", "--honest", "5"])
    result = CliRunner().invoke(main, ["bench", "verify", "--honest", "0"])
    assert result.exit_code == 2 and "--honest" in result.output, result.output


def test_only_picks_the_verify_parts_and_refuses_unknown_ones() -> None:
    from node.bench import chosen_parts
    from node.bench.verify.bench import PARTS

    given = _given(["verify", "--only", "honest", "--honest", "2000"])
    assert given == {"only": "honest", "honest": 2000}
    assert inspect.signature(load("verify")).bind(False, **given).arguments["only"] == "honest"
    assert chosen_parts("", PARTS) == list(PARTS)
    assert chosen_parts("stages, honest", PARTS) == ["honest", "stages"]
    with pytest.raises(ValueError, match="unknown parts \\['chain'\\]"):
        chosen_parts("honest,chain", PARTS)
