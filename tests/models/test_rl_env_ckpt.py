"""The shipped environment's reward, the plug-in loader, checkpoints and the version counter."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import pytest

from models.rl.env import (
    ANSWER_REWARD,
    FORMAT_REWARD,
    Environment,
    EvalsetEnvironment,
    load_full_environment,
)


def test_the_evalset_environment_rewards_format_and_the_exact_number() -> None:
    env = EvalsetEnvironment()
    assert env.size == 50 and isinstance(env, Environment)
    i = 0
    right = env.items[i].answer
    wrong = str(int(right) + 1)
    assert env.reward(i, f"Final answer: {right}") == pytest.approx(FORMAT_REWARD + ANSWER_REWARD)
    assert env.reward(i, f"Final answer: {wrong}") == pytest.approx(FORMAT_REWARD)
    assert env.reward(i, f"I think it is {right}.") == pytest.approx(ANSWER_REWARD)
    assert env.reward(i, "no idea") == 0.0
    assert "Final answer" in env.prompt(i)[-1]["content"]
    with pytest.raises(IndexError):
        env.prompt(env.size)


def test_a_plugin_environment_loads_by_module_and_factory(monkeypatch: pytest.MonkeyPatch) -> None:
    mod = types.ModuleType("rl_plugin_env")

    class Env:
        size = 2

        def prompt(self, index: int) -> list[dict[str, str]]:
            return [{"role": "user", "content": str(index)}]

        def reward(self, prompt: int, completion: str) -> float:
            return float(completion == str(prompt))

    mod.make = Env  # type: ignore[attr-defined]
    mod.broken = lambda: object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "rl_plugin_env", mod)
    env = load_full_environment("rl_plugin_env:make")
    assert env.size == 2 and env.reward(1, "1") == 1.0
    with pytest.raises(ValueError, match="must return"):
        load_full_environment("rl_plugin_env:broken")
    with pytest.raises(ValueError, match="cannot be loaded"):
        load_full_environment("rl_plugin_env:missing")
    with pytest.raises(ValueError, match="expected"):
        load_full_environment("nonsense")


def _checkpoint() -> types.ModuleType:
    """models/rl/checkpoint.py (it stores torch tensors), or a skip where torch is missing."""
    pytest.importorskip("torch", reason="needs torch (pip install -e .[models])")
    from models.rl import checkpoint

    return checkpoint


def test_checkpoints_are_atomic_and_the_newest_ones_are_kept(tmp_path: Path) -> None:
    ck = _checkpoint()
    import torch

    assert ck.latest_checkpoint(tmp_path) is None
    for v in (2, 4, 6):
        ckpt = ck.Checkpoint(version=v, adapter={"a": torch.full((2,), float(v))},
                             optimizer={"step": v}, counters={"steps": float(v)})
        ck.save_checkpoint(tmp_path, ckpt, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt-4.pt", "ckpt-6.pt"]
    latest = ck.latest_checkpoint(tmp_path)
    assert latest is not None and latest.version == 6
    assert torch.equal(latest.adapter["a"], torch.full((2,), 6.0))
    (tmp_path / "ckpt-8.pt").write_bytes(b"torn")  # not one of ours: a clear error
    with pytest.raises(ValueError, match="cannot be read"):
        ck.latest_checkpoint(tmp_path)


def test_a_version_is_never_published_twice_across_restarts(tmp_path: Path) -> None:
    ck = _checkpoint()
    path = tmp_path / "versions.json"
    counter = ck.VersionCounter(path)
    for v in (1, 2, 3):
        counter.claim(v)
    with pytest.raises(ValueError, match="already published"):
        counter.claim(3)
    # killed after publishing 3, last checkpoint at 2: the next step is 4, not 3
    restarted = ck.VersionCounter(path)
    assert restarted.published == 3 and restarted.next_after(2) == 4
    assert ck.VersionCounter(tmp_path / "fresh.json").next_after(0) == 1
    path.write_text("{")
    with pytest.raises(ValueError, match="unreadable"):
        ck.VersionCounter(path)
