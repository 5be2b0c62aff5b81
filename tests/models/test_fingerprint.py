import numpy as np
import pytest

from models import fingerprint as fp
from models.backend import SamplingParams
from models.loader import load_backend

PROMPT = "<|im_start|>user\nhello the world, tell a story<|im_end|>\n<|im_start|>assistant\n"
CHUNK = 8  # small chunks keep the tiny-model tests fast; the encoding is the same


def _run(backend, seed):
    g = backend.generate(PROMPT, SamplingParams(max_tokens=24, temperature=1.0, seed=seed, ignore_eos=True))
    return list(g.prompt_token_ids), list(g.token_ids)


@pytest.fixture(scope="module")
def backends(tiny_ggufs, tiny_hf):
    return {"f32": tiny_hf,
            "q8": load_backend(str(tiny_ggufs["q8"]), backend="transformers"),
            "other": load_backend(str(tiny_ggufs["other"]), backend="transformers")}


def test_encoding_is_compact_plain_bytes():
    h = np.random.default_rng(0).standard_normal((32, 576)).astype(np.float32)
    blob = fp.encode_chunk(h, fp.DEFAULT_K)
    assert isinstance(blob, bytes) and len(blob) == 2 + 4 * 32 * fp.DEFAULT_K == 258  # TOPLOC's
    assert fp.blob_positions(blob) == 32 and fp.blob_positions(blob[:-1]) == 0
    idx, vals = fp.decode_chunk(blob)
    assert np.array_equal(idx[:, 0], np.abs(h).argmax(axis=1))
    np.testing.assert_allclose(vals, np.take_along_axis(h, idx, 1), rtol=1e-3)
    for bad in (b"", blob[:-1], bytes([9]) + blob[1:]):
        with pytest.raises(ValueError):
            fp.decode_chunk(bad)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("threads", [1, 2])
def test_honest_rerun_passes(backends, seed, threads):
    prompt, out = _run(backends["f32"], seed)
    blobs = fp.fingerprint(backends["f32"], prompt, out, chunk=CHUNK)
    assert len(blobs) == 3
    import torch  # the backends fixture has skipped already where torch is missing

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        result = fp.check_fingerprint(backends["f32"], prompt, out, blobs, chunk=CHUNK)
    finally:
        torch.set_num_threads(before)
    assert result.ok, result
    assert all(c.mean_rel_err < fp.MEAN_REL_TOL / 2 for c in result.chunks)  # real margin


def test_honest_rerun_in_padded_batch_passes(backends):
    prompt, out = _run(backends["f32"], 3)
    blobs = fp.fingerprint(backends["f32"], prompt, out, chunk=CHUNK)
    longer, _ = _run(backends["f32"], 4)
    h = backends["f32"].hidden_states([prompt + out, longer + [5] * 40, prompt[:3]])[0]
    for c in range(3):
        start = len(prompt) + c * CHUNK
        assert fp.compare_chunk(h[start:start + CHUNK], blobs[c], c).ok


@pytest.mark.parametrize("tamper", ["other_model", "other_quantization", "prompt", "output"])
def test_tampering_fails(backends, tamper):
    prompt, out = _run(backends["f32"], 5)
    claimed = fp.fingerprint(backends["f32"], prompt, out, chunk=CHUNK)
    verifier, p, o = backends["f32"], list(prompt), list(out)
    if tamper == "other_model":  # the executor really ran another model: its fingerprints
        claimed = fp.fingerprint(backends["other"], prompt, out, chunk=CHUNK)
    elif tamper == "other_quantization":
        claimed = fp.fingerprint(backends["q8"], prompt, out, chunk=CHUNK)
    elif tamper == "prompt":
        p[len(p) // 2] = (p[len(p) // 2] + 1) % 256
    else:
        o[CHUNK + 2] = (o[CHUNK + 2] + 1) % 256
    result = fp.check_fingerprint(verifier, p, o, claimed, chunk=CHUNK)
    assert not result.ok
    if tamper == "output":  # chunks before the altered token still match; that one and after fail
        assert [c.ok for c in result.chunks] == [True, False, False]


def test_check_prefills_only_up_to_last_requested_chunk(backends):
    prompt, out = _run(backends["f32"], 6)
    blobs = fp.fingerprint(backends["f32"], prompt, out, chunk=CHUNK)
    seen = []

    class Spy:
        def hidden_states(self, batch):
            seen.append([len(s) for s in batch])
            return backends["f32"].hidden_states(batch)

    assert fp.check_fingerprint(Spy(), prompt, out, blobs, chunks=[0], chunk=CHUNK).ok
    assert seen == [[len(prompt) + CHUNK]]


def test_wrong_count_or_chunk_index_fails(backends):
    prompt, out = _run(backends["f32"], 7)
    blobs = fp.fingerprint(backends["f32"], prompt, out, chunk=CHUNK)
    assert not fp.check_fingerprint(backends["f32"], prompt, out, blobs[:-1], chunk=CHUNK).ok
    assert not fp.check_fingerprint(backends["f32"], prompt, out, blobs, chunks=[3], chunk=CHUNK).ok
    swapped = [blobs[1], blobs[0], blobs[2]]
    assert not fp.check_fingerprint(backends["f32"], prompt, out, swapped, chunk=CHUNK).ok
