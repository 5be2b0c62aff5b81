"""The model-check bench shared by tests/models/test_checks.py and test_adapter_checks.py:
the task the tiny model answers, a backend on a GGUF, and an executor's committed result with
the StartCheck a verifier gets for it. Import it after ``pytest.importorskip("torch")``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from models.checks import CheckRunner
from models.commitments import CHUNK_TOKENS
from protocol.market.messages import Requirement, TaskSpec
from protocol.verification.rules import choose_chunks
from protocol.verification.verifier import StartCheck

TASK = TaskSpec(task_id=b"\x01" * 32, requester="rq", question="What is 6 * 7?",
                answer_type="text", choices=(), requirement=Requirement(model="", family="",
                                                                        min_context=0),
                k=1, max_price=1.0, max_tokens=80)


def backend(path: Path, kind: str) -> Any:
    from models.loader import load_backend

    if kind == "llama.cpp":
        pytest.importorskip("llama_cpp")
    return load_backend(str(path), backend=kind)


def layer_check(exec_backend: Any, verifier: CheckRunner, store: Any, seed: int = 0) -> Any:
    """An executor's committed result (fingerprints + layer states in ``store``) and the
    StartCheck a verifier gets for it, with the leaves it asks for already fetched."""
    from models.commitments import commitments_for
    from models.cot import Problem, solve

    sol = solve(exec_backend, Problem(TASK.question), max_tokens=80, seed=seed,
                temperature=0.8)
    ids = list(sol.token_ids)
    made = commitments_for(exec_backend, sol.prompt_token_ids, ids, store, TASK.task_id)
    chunks = choose_chunks(bytes([seed]) * 32, "e", len(made.fingerprints), 1)
    return StartCheck(check_id=b"\x03" * 32, task=TASK, model_hash=verifier.model_hash,
                      output_ids=tuple(ids), answer=sol.answer, cot=sol.cot_text,
                      chunk_tokens=CHUNK_TOKENS, chunk_indices=chunks,
                      fingerprints=tuple(made.fingerprints[i] for i in chunks),
                      deadline_at_ms=0, executor="e", states_root=made.states_root,
                      state_layers=made.state_layers, layers=(2,))


def fetched_from(store: Any, check: StartCheck, job: Any) -> dict[Any, Any]:
    from models.layer_states import decode_leaf, leaf_index, n_blocks

    blocks = n_blocks(job.plan.total_tokens)
    index = sorted(leaf_index(la, b, blocks) for la, b in job.wanted)
    out = {}
    for _, leaf, _ in store.leaves(TASK.task_id, check.states_root, index):
        layer, block, arr = decode_leaf(leaf)
        out[(layer, block)] = arr
    return out
