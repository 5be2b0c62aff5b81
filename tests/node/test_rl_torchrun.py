"""The learner's update under torch.distributed: two ranks started by ``torchrun`` (gloo, on
loopback) take the same steps over the same batch as one process, to ``RANKS_TOLERANCE``; and
the batch rank 0 broadcasts decodes to what it encoded, or refuses bytes it did not make."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from models.rl.update import decode_groups, encode_groups  # noqa: E402
from node.rl.learner_trainer import Trainer  # noqa: E402
from tests.node.rl_batch import learner_config, make_batch  # noqa: E402
from tests.node.rl_tiny_env import TinyEnv  # noqa: E402

#: largest difference between an adapter weight after the two-rank and the one-process steps
RANKS_TOLERANCE = 1e-6
#: steps taken: the first moves only the B matrices (they start at zero, so A gets no
#: gradient), the second both
STEPS = 2
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.models import tiny

    return tiny.write_gguf(tiny.tiny_model(seed=0), tmp_path_factory.mktemp("ranks") / "tiny.gguf")


def _torchrun(model: Path, batch: Path, out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo",
           "PYTHONPATH": str(ROOT)}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
           "--nproc_per_node", "2", str(ROOT / "tests" / "node" / "rl_ranks_step.py"),
           str(model), str(batch), str(out), str(STEPS)]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_torchrun_two_ranks_take_the_single_process_update(tiny_gguf: Path, tmp_path: Path) -> None:
    single = Trainer(learner_config(tiny_gguf, tmp_path / "one"), TinyEnv())
    groups = make_batch(single.policy)
    batch = tmp_path / "batch.bin"
    batch.write_bytes(encode_groups(1, groups))
    start = single.policy.state()
    stats = [single.step(groups, single.next_version()) for _ in range(STEPS)]
    (tmp_path / "two").mkdir()
    _torchrun(tiny_gguf, batch, tmp_path / "two")

    two = torch.load(tmp_path / "two" / "state.pt", weights_only=True)["state"]
    one = single.policy.state()
    assert two.keys() == one.keys()
    moved = max(float((one[k] - start[k]).abs().max()) for k in one)
    assert moved > 1000 * RANKS_TOLERANCE, "the steps must move the adapter for the test to mean anything"
    worst = max(float((one[k] - two[k]).abs().max()) for k in one)
    assert worst <= RANKS_TOLERANCE, f"two ranks differ from one process by {worst:g}"
    figures = json.loads((tmp_path / "two" / "stats.json").read_text())
    for mine, theirs in zip(stats, figures, strict=True):
        assert (theirs["tokens"], theirs["masked"], theirs["skipped"]) == (mine.tokens, mine.masked, mine.skipped)
        for key in ("loss", "kl", "entropy"):
            assert theirs[key] == pytest.approx(getattr(mine, key), rel=1e-5, abs=1e-7)
    assert stats[0].skipped == 1 and stats[0].masked > 0  # the batch exercises both paths


def test_a_batch_round_trips_and_foreign_bytes_are_refused(tiny_gguf: Path, tmp_path: Path) -> None:
    from tests.node.rl_batch import make_batch as batch_of
    trainer = Trainer(learner_config(tiny_gguf, tmp_path), TinyEnv())
    groups = batch_of(trainer.policy)
    assert decode_groups(encode_groups(7, groups)) == (7, groups)
    for junk in (b"", b"\xc1", encode_groups(1, groups)[:-3], b"\x92\x01\x91\x93\x01\x02\x03"):
        with pytest.raises(ValueError, match="does not decode"):
            decode_groups(junk)
