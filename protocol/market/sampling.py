"""Sampling rules of a task: the requester's defaults and each executor's seed.

The requester fixes a task's sampling (``TaskSpec.temperature``, ``top_p``, ``seed``,
``stop``); executors follow it. Two rules live here, used by the daemon and the simulator:

* :func:`default_temperature`: with one executor an unset temperature is greedy (0: the
  model's most likely answer); with k > 1 it is :data:`VOTING_TEMPERATURE`, because k greedy
  executors of one model return k copies of one chain of thought and the vote over them is
  no vote. Measured on the embedded SmolLM2-135M (Q4_1, llama.cpp), the first 60 questions of
  the shipped evaluation set, chain of thought in 128 tokens, k = 3 seeds from
  :func:`executor_seed`, plain majority: greedy (= three identical chains) 38.3% right;
  T = 0.3: one chain 36.7%, voted 41.7%, two or more distinct chains on 92% of questions;
  T = 0.5: one chain 35.0%, voted 38.3%, distinct on 98%; T = 0.7: one chain 15.0%, voted
  28.3%, distinct on 100%; T = 1.0: 3.3% and 21.7%. Voting repairs much of what sampling
  costs one chain (+13 points at 0.7), but above 0.5 this small model's chains degrade
  faster than three votes recover; 0.5 keeps greedy's accuracy and makes the chains differ.
* :func:`executor_seed`: the sampler seed of one attempt, a hash of the task id, the
  requester's seed base and the attempt number. Attempts are unique per task, so every
  executor samples its own chain; and anyone holding the task (a verifier, an auditor) can
  recompute the seed an executor had to use.
"""

from __future__ import annotations

from crypto.hashing import digest_parts

#: the temperature of a task with k > 1 executors whose requester set none
VOTING_TEMPERATURE = 0.5
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
