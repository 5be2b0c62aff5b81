"""`symphony bench NAME --link SPEC`: the four benches that start daemons take a link spec, a bad
one is refused while the command line is parsed, and the testnet helper every bench starts its
daemons through writes the link into each daemon's config. No bench runs here (they start
daemons with models: run by hand, figures in the README)."""

from __future__ import annotations

import inspect
import tomllib
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from node.bench import OPTIONS, load
from node.cli.main import bench, bench_options, main
from node.config import load_config
from node.daemon import config_sections, load_service_classes
from node.p2p.link import LinkSpec, LinkSpecError, parse_link
from node.testnet import FAST_MEMBERSHIP, LocalTestnet

LINKED = ("tasks", "distributed", "relay", "ledger")
HOME_LINK = "rtt=60ms,up=20mbit"


def _parse(args: list[str]) -> dict[str, object]:
    """The bench command's parameters for ``args``, parsed without running the command."""
    with bench.make_context("bench", args) as ctx:
        return dict(ctx.params)


@pytest.mark.parametrize("name", LINKED)
def test_each_daemon_bench_takes_a_link_through_to_its_run(name: str) -> None:
    params = _parse([name, "--quick", "--link", HOME_LINK, "--json"])
    options = {k: v for k, v in params.items() if k not in ("name", "quick", "as_json")}
    given = bench_options(name, options)
    assert given == {"link": HOME_LINK}
    # the bench's run takes it as a keyword (what `load(name)(quick, **given)` calls)
    signature = inspect.signature(load(name))
    assert signature.bind(True, **given).arguments["link"] == HOME_LINK
    assert signature.parameters["link"].default == ""  # without --link: loopback
    assert bench_options(name, {"link": None, "frames": None, "cycles": None}) == {}


@pytest.mark.parametrize("name", LINKED)
@pytest.mark.parametrize(("spec", "names"), [
    ("rtt=60", ["'rtt=60'", "ms or s"]),
    ("rtt=60ms,up=20", ["'up=20'", "a rate needs a unit"]),
    ("delay=60ms", ["unknown key 'delay'"]),
])
def test_a_bad_link_spec_is_a_usage_error_naming_the_part(name: str, spec: str,
                                                          names: list[str]) -> None:
    with pytest.raises(click.BadParameter) as caught:
        _parse([name, "--quick", "--link", spec])
    message = caught.value.format_message()
    assert "--link" in message and all(n in message for n in names), message
    # the same through the whole command: exit status 2, the reason on the terminal, no run
    result = CliRunner().invoke(main, ["bench", name, "--quick", "--link", spec])
    assert result.exit_code == 2, result.output
    assert "Invalid value for '--link'" in result.output
    assert all(n in result.output for n in names), result.output


def test_link_is_refused_by_benches_that_start_no_daemon_behind_it() -> None:
    assert sorted(n for n, opts in OPTIONS.items() if "link" in opts) == sorted(LINKED)
    with pytest.raises(click.BadParameter, match="--link applies only to: distributed, "
                                                 "ledger, relay, tasks"):
        bench_options("models", {"link": HOME_LINK})


def test_the_testnet_writes_its_link_into_every_daemon_config(tmp_path: Path) -> None:
    net = LocalTestnet(tmp_path, config=FAST_MEMBERSHIP, link=HOME_LINK)
    # a node's own config cannot take its daemon off the testnet's link
    data_dirs = [net.write_config("a", {}),
                 net.write_config("b", {"link": "", "executor": {"solver": ""}})]
    sections = config_sections(load_service_classes())
    for data_dir in data_dirs:
        written = tomllib.loads((data_dir / "node.toml").read_text())
        assert written["link"] == HOME_LINK
        assert written["membership"]["ping_interval_ms"] == 1000  # the rest still merged
        config = load_config({"data_dir": str(data_dir)}, env={}, sections=sections)
        assert parse_link(config.link) == LinkSpec(rtt_s=0.06, up_bps=20e6)


def test_a_testnet_without_a_link_writes_none_and_a_bad_one_starts_nothing(
        tmp_path: Path) -> None:
    plain = LocalTestnet(tmp_path / "plain", config=FAST_MEMBERSHIP)
    assert "link" not in tomllib.loads((plain.write_config("a", {}) / "node.toml").read_text())
    with pytest.raises(LinkSpecError, match="'up=20'"):
        LocalTestnet(tmp_path / "bad", link="rtt=60ms,up=20")
    assert not (tmp_path / "bad").exists()


def test_testnet_refuses_a_bad_link_with_the_same_parameter_type() -> None:
    from node.cli.node import testnet

    with pytest.raises(click.BadParameter, match="'up=20'.*a rate needs a unit"):
        testnet.make_context("testnet", ["--link", "rtt=60ms,up=20"])
    with testnet.make_context("testnet", ["--link", HOME_LINK]) as ctx:
        assert ctx.params["link"] == HOME_LINK
