"""`symphony rl eval`: the held-out prompts answered under the base model and an adapter, the
same seeds for both, each accuracy inside its 95% interval; bad adapters named, no traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from node.cli.main import main

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")

SPEC = "tests.node.test_rl_eval_cli:make"


class CountingEnv:
    """40 short prompts; a completion is correct when its length is even (deterministic, and
    it differs between the base model and a perturbed adapter)."""

    size = 40

    def prompt(self, index: int) -> list[dict[str, str]]:
        return [{"role": "user", "content": f"Count to {index}."}]

    def reward(self, prompt: int, completion: str) -> float:
        return float(len(completion) % 2 == 0)

    def correct(self, prompt: int, completion: str) -> bool:
        return len(completion) % 2 == 0


def make() -> CountingEnv:
    return CountingEnv()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from tests.models import rl_tiny, tiny

    d = tmp_path_factory.mktemp("eval")
    model = tiny.write_gguf(tiny.tiny_model(seed=0), d / "tiny.gguf")
    policy = rl_tiny.make_policy(model)
    rl_tiny.perturb(policy, scale=0.5)
    return model, rl_tiny.export_adapter(policy, d / "adapters", version=1).path


def _eval(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["rl", "eval", "--environment", SPEC, "--max-tokens", "6",
                                       *args])
    return result.exit_code, result.output


def test_base_and_adapter_are_scored_on_the_held_out_prompts(tiny: tuple[Path, Path]) -> None:
    from models.rl.env import load_heldout

    model, adapter = tiny
    code, out = _eval("--model", str(model), "--adapter", str(adapter), "--temperature", "1.0",
                      "--samples", "2", "--json")
    assert code == 0, out
    figures = json.loads(out.splitlines()[-1])
    held = load_heldout(SPEC).size
    assert figures["heldout_prompts"] == held and 0 < held < CountingEnv.size
    for name in ("base", "adapter"):
        score = figures[name]
        assert score["prompts"] == held and score["draws"] == 2
        low, high = score["ci95"]
        assert low <= score["accuracy"] <= high and score["half_width"] > 0
    assert figures["base"] != figures["adapter"]  # the adapter changes the answers
    # the same seeds: a second evaluation gives the very same figures
    again = json.loads(_eval("--model", str(model), "--adapter", str(adapter), "--temperature",
                             "1.0", "--samples", "2", "--json")[1].splitlines()[-1])
    assert again == figures


def test_an_adapter_llama_cpp_refuses_is_an_error_not_a_traceback(
        tiny: tuple[Path, Path], tmp_path: Path) -> None:
    model, _ = tiny
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"GGUF" + b"\0" * 64)
    code, out = _eval("--model", str(model), "--adapter", str(junk), "--prompts", "1")
    assert code != 0 and "Traceback" not in out
    assert "adapter" in out
