"""A verifier re-checks an adapter agent's layer states with the agent's LoRA adapter merged
into its fp32 check model (models/adapter_weights.py, models/checks.py): an executor that ran
llama.cpp with the adapter passes; the same states checked on the base model, or a result
whose states came from another adapter than the one it names, fail; a file that is no adapter
fails the check without a traceback; the check model's base weights come back exactly."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs torch and gguf (pip install -e .[models])")
pytest.importorskip("gguf", reason="needs torch and gguf (pip install -e .[models])")
pytest.importorskip("llama_cpp")

import torch  # noqa: E402

from models.adapter_weights import merged, read_lora  # noqa: E402
from models.checks import CheckRunner, LayerJob  # noqa: E402
from tests.models import rl_tiny  # noqa: E402
from tests.models.checks_bench import backend, fetched_from, layer_check  # noqa: E402


@pytest.fixture(scope="module")
def adapters(tiny_ggufs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Two different adapters of the tiny model (files), and the first one's policy."""
    d = tmp_path_factory.mktemp("adapters")
    policy = rl_tiny.make_policy(tiny_ggufs["f32"])
    rl_tiny.perturb(policy, scale=0.5)
    first = rl_tiny.export_adapter(policy, d / "a", version=1).path
    other = rl_tiny.make_policy(tiny_ggufs["f32"], seed=3)
    rl_tiny.perturb(other, scale=0.5)
    with torch.no_grad():  # another B than the first's (perturb's draw is fixed)
        for _, m in rl_tiny.lora.lora_modules(other.model):
            m.lora_b.mul_(-1.0)
    second = rl_tiny.export_adapter(other, d / "b", version=1).path
    return policy, first, second


@pytest.fixture(scope="module")
def verifier(tiny_ggufs: dict[str, Path]) -> CheckRunner:
    return CheckRunner(backend(tiny_ggufs["f32"], "transformers"))


def test_read_lora_gives_back_the_policys_adapter(adapters: Any, verifier: CheckRunner) -> None:
    policy, first, _ = adapters
    config = verifier.backend.model.config
    lora = read_lora(first, config.num_attention_heads, config.num_key_value_heads)
    assert lora.scale == pytest.approx(policy.alpha / 4)
    state = policy.state()
    assert len(lora.pairs) * 2 == len(state)
    for (block, path), pair in lora.pairs.items():
        name = f"model.layers.{block}.{path}"
        # the Q/K rows come back in transformers' order (llama.cpp's permutation undone)
        assert torch.equal(torch.from_numpy(pair.a), state[f"{name}.lora_a"])
        assert torch.equal(torch.from_numpy(pair.b), state[f"{name}.lora_b"])


@pytest.fixture(scope="module")
def served(tiny_ggufs: dict[str, Path], adapters: Any, verifier: CheckRunner,
           tmp_path_factory: pytest.TempPathFactory) -> Any:
    """An executor serving on llama.cpp with the first adapter applied and its states captured
    as it generates (as models/solver.py does): its result's StartCheck, the verifier's job
    and the leaves it fetched."""
    from models.state_store import StateStore

    store = StateStore(tmp_path_factory.mktemp("states"))
    llama = backend(tiny_ggufs["f32"], "llama.cpp")
    llama.enable_state_capture()
    llama.use_adapter(llama.load_adapter(str(adapters[1])))  # after the capture's new context
    check = dataclasses.replace(layer_check(llama, verifier, store, seed=1), adapter=b"\xaa" * 32)
    job = verifier.prepare(check)
    assert isinstance(job, LayerJob)
    return check, job, fetched_from(store, check, job)


def test_an_adapter_agents_states_pass_with_its_adapter_and_fail_without(
        adapters: Any, verifier: CheckRunner, served: Any) -> None:
    _, first, second = adapters
    check, job, fetched = served
    weights = {k: v.clone() for k, v in verifier.backend.model.state_dict().items()}

    done = verifier.run_layers(check, job, fetched, adapter=first)
    assert done.passed, done.detail
    # the base weights came back exactly: the next check runs the base model
    after = verifier.backend.model.state_dict()
    assert all(torch.equal(after[k], v) for k, v in weights.items())
    # the same states checked on the base model: the adapter's work is not the base's
    base = verifier.run_layers(dataclasses.replace(check, adapter=b""), job, fetched)
    assert not base.passed and "layer 1" in base.detail
    # a result naming another adapter than the one it ran (a card's trained adapter claimed,
    # another one served): caught
    claimed = dataclasses.replace(check, adapter=b"\xbb" * 32)
    lied = verifier.run_layers(claimed, job, fetched, adapter=second)
    assert not lied.passed and "layer 1" in lied.detail
    with pytest.raises(ValueError, match="file is needed"):
        verifier.run_layers(check, job, fetched)


def test_a_file_that_is_no_adapter_fails_the_check(tiny_ggufs: dict[str, Path],
                                                   verifier: CheckRunner, served: Any,
                                                   tmp_path: Path) -> None:
    check, job, fetched = served
    model = tiny_ggufs["f32"].read_bytes()
    for i, junk in enumerate((b"GGUF" + b"\0" * 64, bytes(range(256)) * 8, model[:4096],
                              model)):  # the last: a whole GGUF, but a model, not an adapter
        path = tmp_path / f"junk{i}.gguf"
        path.write_bytes(junk)
        done = verifier.run_layers(dataclasses.replace(check, adapter=bytes([i]) * 32), job,
                                   fetched, adapter=path)
        assert not done.passed and done.detail.startswith("adapter: "), done.detail


def test_merging_is_a_no_op_without_an_adapter_and_refuses_a_misfit(
        adapters: Any, verifier: CheckRunner) -> None:
    _, first, _ = adapters
    config = verifier.backend.model.config
    lora = read_lora(first, config.num_attention_heads, config.num_key_value_heads)
    with merged(verifier.backend, None, [0]):
        pass
    block, path = next(iter(lora.pairs))
    pair = lora.pairs[(block, path)]
    misfit = dataclasses.replace(lora, pairs={(block, path): dataclasses.replace(
        pair, a=pair.a[:, :-1])})
    with pytest.raises(ValueError, match="weight"), merged(verifier.backend, misfit, [block]):
        pass
    beyond = dataclasses.replace(lora, pairs={(99, path): pair})
    with pytest.raises(ValueError, match="beyond"), merged(verifier.backend, beyond, [0]):
        pass
