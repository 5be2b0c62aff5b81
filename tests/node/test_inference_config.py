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
