"""`symphony rl plan`: the capacity rule's figures, as a table and as JSON; bad input named."""

from __future__ import annotations

import json

from click.testing import CliRunner

from node.cli.main import main


def _plan(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["rl", "plan", *args])
    return result.exit_code, result.output


def test_json_figures_follow_the_rule() -> None:
    code, out = _plan("--workers", "16", "--rollouts-per-s", "0.5", "--batch", "32",
                      "--step-s", "4", "--dissemination-s", "2", "--generation-s", "6",
                      "--staleness", "2", "--json")
    assert code == 0, out
    figures = json.loads(out)
    assert figures["supply_per_s"] == 8.0 and figures["demand_per_s"] == 8.0
    assert figures["min_staleness"] == 2 and figures["holds"] is True


def test_table_says_plainly_when_the_swarm_is_too_small() -> None:
    code, out = _plan("--workers", "8", "--rollouts-per-s", "0.5", "--batch", "32",
                      "--step-s", "4", "--dissemination-s", "3")
    assert code == 0, out
    assert "NO" in out and "16" in out and "The learner will wait" in out
    # the default generation time is group / rate = 8 / 0.5 = 16 s
    assert "ceil((3 + 16) / 4) = 5" in out


def test_bad_input_names_the_value() -> None:
    code, out = _plan("--workers", "4", "--rollouts-per-s", "1", "--batch", "8",
                      "--step-s", "nan")
    assert code != 0 and "step_s" in out
    code, out = _plan("--workers", "4", "--rollouts-per-s", "0", "--batch", "8", "--step-s", "1")
    assert code != 0 and "--rollouts-per-s" in out
