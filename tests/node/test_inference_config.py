"""serve_blocks and the [inference] section: flag, environment and TOML, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.config import Config, ConfigError, load_config
from node.inference.service import InferenceSection


def _load(tmp_path: Path, flags: dict[str, object] | None = None,
          env: dict[str, str] | None = None, toml: str = "") -> Config:
    (tmp_path / "node.toml").write_text(toml)
    return load_config({"data_dir": str(tmp_path), **(flags or {})}, env=env or {},
                       sections={"inference": InferenceSection})


def test_serve_blocks_from_flag_env_and_file(tmp_path: Path) -> None:
    assert _load(tmp_path).serve_blocks == ""
    assert _load(tmp_path, toml='serve_blocks = "auto"\n').serve_blocks == "auto"
    assert _load(tmp_path, env={"SYMPHONY_SERVE_BLOCKS": "0:10"},
                 toml='serve_blocks = "auto"\n').serve_blocks == "0:10"
    assert _load(tmp_path, flags={"serve_blocks": "10:20"},
                 env={"SYMPHONY_SERVE_BLOCKS": "0:10"}).serve_blocks == "10:20"


def test_bad_serve_blocks_and_inference_values_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="serve_blocks.*'9:3'"):
        _load(tmp_path, flags={"serve_blocks": "9:3"})
    with pytest.raises((ConfigError, ValueError), match="precision"):
        _load(tmp_path, toml='[inference]\nprecision = "int8"\n')
    with pytest.raises(ConfigError, match="nonsense"):
        _load(tmp_path, toml='[inference]\nnonsense = 1\n')
    section = _load(tmp_path, toml='[inference]\nlink_delay_ms = 20.0\nprecision = "f32"\n'
                    ).section("inference")
    assert (section.link_delay_ms, section.precision) == (20.0, "f32")


@pytest.mark.parametrize("device", ["cpu", "auto", "cuda", "cuda:0", "cuda:3"])
def test_inference_device_names_are_accepted(tmp_path: Path, device: str) -> None:
    toml = f'[inference]\ndevice = "{device}"\n'
    assert _load(tmp_path, toml=toml).section("inference").device == device
    assert InferenceSection().device == "cpu"


@pytest.mark.parametrize("device", ["gpu", "cuda:x", "CUDA", "cuda:", "cuda:-1"])
def test_a_bad_inference_device_is_named(tmp_path: Path, device: str) -> None:
    with pytest.raises((ConfigError, ValueError), match=f"device must be .*{device!r}"):
        _load(tmp_path, toml=f'[inference]\ndevice = "{device}"\n')


def test_auto_picks_the_window_the_ledger_covers_worst(tmp_path: Path) -> None:
    """The daemon's side of ``--serve-blocks auto``: block offers read from the ledger's live
    records (our own left out), the window sized by [inference] auto_max_blocks."""
    pytest.importorskip("torch")
    from types import SimpleNamespace

    from node.inference.service import InferenceService
    from protocol.ledger.records import BlockOffer
    from tests.models import tiny

    path = tiny.write_gguf(tiny.tiny_model(), tmp_path / "t.gguf")

    def record(peer: str, start: int, end: int) -> object:
        offer = BlockOffer(model="t", start=start, end=end, n_blocks=tiny.LAYERS,
                           ms_per_block=1.0, free_sessions=4, max_sessions=4,
                           free_cache_bytes=1 << 20)
        return SimpleNamespace(record=SimpleNamespace(peer_id=peer, blocks=(offer,),
                                                      listen_addrs=()))

    held = [record("other", 0, 1), record("me", 1, 2)]
    state = SimpleNamespace(live_records=lambda now: list(held))
    ledger = SimpleNamespace(machine=SimpleNamespace(view=SimpleNamespace(state=state)),
                             now_ms=lambda: 0)
    config = SimpleNamespace(serve_blocks="auto",
                             section=lambda name: InferenceSection(auto_max_blocks=1))
    ctx = SimpleNamespace(config=config, services={"ledger": ledger}, clock=lambda: 0,
                          identity=SimpleNamespace(peer_id="me"))
    service = InferenceService(ctx)
    service.model_name, service.model_path, service.n_blocks = "t", path, tiny.LAYERS
    assert service.want == "auto"
    assert [(s.peer, s.start) for s in service.servers()] == [("other", 0)]
    assert service._auto_window(None) == (1, 2)  # block 1 has no other server
    assert service._auto_window((0, 1)) == (1, 2)  # a hole elsewhere: move
    held.append(record("third", 1, 2))
    assert service._auto_window((0, 1)) == (0, 1)  # equal coverage: stay
    service.failed_until["other"] = 10  # a server that failed us is left out of plans
    assert [s.peer for s in service.servers()] == ["third"]


def test_auto_precision_sends_f16_but_f32_for_models_whose_states_overflow_f16(
        tmp_path: Path) -> None:
    from node.inference.wire import wire_precision
    from protocol.inference.messages import Precision

    assert _load(tmp_path).section("inference").precision == "auto"
    assert wire_precision("auto", "llama") is Precision.FP16
    assert wire_precision("auto", "gemma3_text") is Precision.FP32
    assert wire_precision("f16", "gemma3_text") is Precision.FP16, "a setting is obeyed"
    assert wire_precision("f32", "llama") is Precision.FP32


def test_stage_check_settings(tmp_path: Path) -> None:
    section = _load(tmp_path, toml="[inference]\ncheck_rate = 0.25\ndishonest = \"replay\"\n"
                    ).section("inference")
    assert section.check_rate == 0.25 and section.dishonest == "replay"
    assert InferenceSection().check_rate == 0.1 and InferenceSection().dishonest == ""
    for bad in ('check_rate = 1.5', 'dishonest = "lazy"'):
        with pytest.raises(ConfigError, match=bad.split(" ")[0]):
            _load(tmp_path, toml=f"[inference]\n{bad}\n")
