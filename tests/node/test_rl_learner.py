"""`symphony rl train` end to end on the tiny model: local worker processes, versions advancing,
adapters hot-swapped, a worker forging log-probabilities caught and excluded, restarts that
never reuse a version, and the config's errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from node.rl.learner_config import LearnerConfig, load_config

pytest.importorskip("torch")
pytest.importorskip("llama_cpp")


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import tiny

    return tiny.write_gguf(tiny.tiny_model(seed=0), tmp_path_factory.mktemp("rl") / "tiny.gguf")


def _config(model: Path, out: Path, **kw: object) -> LearnerConfig:
    base = LearnerConfig(model=str(model), environment="tests.node.rl_tiny_env:make", steps=3,
                         group_size=4, jobs_per_step=1, max_tokens=6, lora_rank=4, lora_alpha=8.0,
                         learning_rate=5e-2, workers=2, checkpoint_every=2, out_dir=str(out),
                         job_timeout_s=120.0)
    return replace(base, **kw)  # type: ignore[arg-type]


@pytest.mark.integration
def test_versions_advance_and_a_forging_worker_is_caught(tiny_gguf: Path, tmp_path: Path) -> None:
    from node.rl.learner import run_training, summary

    config = _config(tiny_gguf, tmp_path, cheaters=("fake-logprobs", ""))
    report = run_training(config)
    assert [s.version for s in report.steps] == [1, 2, 3]
    assert report.excluded == ["local-0"]
    assert report.counters["invalid"] >= 1 and report.counters["reissued"] >= 1
    assert report.counters["accepted"] >= 3
    assert report.swap_s, "the honest worker switched to a published adapter"
    adapters = list((tmp_path / "adapters").glob("*.gguf"))
    assert len(adapters) == 3  # versions 1..3; version 0 is the base model
    lines = (tmp_path / "steps.jsonl").read_text().splitlines()
    assert [json.loads(x)["version"] for x in lines] == [1, 2, 3]
    assert summary(report)["steps"] == 3


@pytest.mark.integration
def test_workers_cheating_otherwise_are_caught(tiny_gguf: Path, tmp_path: Path) -> None:
    """Another model's completions, fabricated fingerprints and a commitment that does not
    open are each caught on the worker's first group; the honest worker takes every job."""
    from node.rl.learner import run_training
    from tests.models import tiny

    other = tiny.write_gguf(tiny.tiny_model(seed=1), tmp_path / "other.gguf")
    config = _config(tiny_gguf, tmp_path / "run", steps=2, workers=4, jobs_per_step=4,
                     cheaters=(f"other-model:{other}", "fake-fingerprint", "bad-commitment", ""))
    report = run_training(config)
    assert [s.version for s in report.steps] == [1, 2]
    assert report.excluded == ["local-0", "local-1", "local-2"]
    assert report.counters["invalid"] == 3 and report.counters["accepted"] >= 8
    assert max(report.mismatch_kls) < config.mismatch_kl_max  # only honest groups got this far


@pytest.mark.integration
def test_a_restart_resumes_without_reusing_a_version(tiny_gguf: Path, tmp_path: Path) -> None:
    from node.rl.learner import run_training

    first = run_training(_config(tiny_gguf, tmp_path, steps=3, staleness=1))
    assert first.last_version == 3
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.iterdir()) == ["ckpt-2.pt", "ckpt-3.pt"]
    # killed after publishing version 3 but before its checkpoint: version 2 is the last one
    (ckpts / "ckpt-3.pt").unlink()
    second = run_training(_config(tiny_gguf, tmp_path, steps=2, staleness=1))
    assert second.resumed_from == 2
    assert [s.version for s in second.steps] == [4, 5]
    assert json.loads((tmp_path / "versions.json").read_text())["published"] == 5


def test_the_config_names_what_is_wrong(tmp_path: Path) -> None:
    path = tmp_path / "rl.toml"
    path.write_text("steps = 5\nstaleness = 2\nlearning_rate = 1\n")
    config = load_config(path, workers=3)
    assert (config.steps, config.staleness, config.workers, config.learning_rate) == (5, 2, 3, 1.0)
    path.write_text("[rl]\nstepz = 5\n")
    with pytest.raises(ValueError, match="unknown key 'stepz'"):
        load_config(path)
    path.write_text("steps = 'five'\n")
    with pytest.raises(ValueError, match="steps must be of type int"):
        load_config(path)
    with pytest.raises(ValueError, match="staleness"):
        LearnerConfig(staleness=-1)
    with pytest.raises(ValueError, match="cheaters"):
        LearnerConfig(cheaters=("lazy",))
    assert LearnerConfig(jobs_per_step=2, group_size=8).batch == 16
