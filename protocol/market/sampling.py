"""Sampling rules of a task: the requester's defaults and each executor's seed.

The requester fixes a task's sampling (``TaskSpec.temperature``, ``top_p``, ``seed``,
``stop``); executors follow it. Two rules live here, used by the daemon and the simulator:

* :func:`default_temperature`: with one executor an unset temperature is greedy (0: the
  model's most likely answer); with k > 1 it is :data:`VOTING_TEMPERATURE`, because k greedy
  executors of one model return k copies of one chain of thought and the vote over them is
  no vote. 0.7 is where the measured voting gain of SmolLM2-135M at k = 3 sits (see the
  README's voting figures: self-consistency needs diverse chains, and higher temperatures
  make each chain worse faster than voting repairs it).
* :func:`executor_seed`: the sampler seed of one attempt, a hash of the task id, the
  requester's seed base and the attempt number. Attempts are unique per task, so every
  executor samples its own chain; and anyone holding the task (a verifier, an auditor) can
  recompute the seed an executor had to use.
"""

from __future__ import annotations

from crypto.hashing import digest_parts

#: the temperature of a task with k > 1 executors whose requester set none
VOTING_TEMPERATURE = 0.7
#: seeds are non-negative 63-bit integers (numpy's PCG64 and msgpack take them as they are)
SEED_BITS = 63
_SEED_PERSON = b"symphony-seed"


def default_temperature(k: int) -> float:
    """The temperature of a task of ``k`` executors when the requester sets none."""
    return VOTING_TEMPERATURE if k > 1 else 0.0


def executor_seed(task_id: bytes, seed_base: int, attempt: int) -> int:
    """The sampler seed the executor of ``attempt`` uses for the task ``task_id``."""
    if seed_base < 0 or attempt < 0:
        raise ValueError("seed base and attempt must not be negative")
    raw = digest_parts([task_id, seed_base.to_bytes(8, "big"), attempt.to_bytes(8, "big")],
                       person=_SEED_PERSON)
    return int.from_bytes(raw[:8], "big") >> (64 - SEED_BITS)
