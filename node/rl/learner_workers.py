"""Local rollout workers for `symphony rl train`: one process per worker, llama.cpp in each.

Each worker runs the very function a network worker runs for an assigned rollout job
(models.rl.rollout.RolloutWorker.generate_group). Jobs and results cross the process boundary
as the wire codec's bytes (protocol/rl/messages.py), never pickled objects; the adapter of the
job's version is named by path and SHA-256 (a local stand-in for the weight relay: the worker
checks the hash, loads it beside the base model and switches to it without reloading).

A worker process reports ``("ready", i)``, then per job ``("result", i, bytes, swap_s,
generate_s, switch_s)`` where ``swap_s`` is the time from the learner publishing the version
to the worker serving it (it includes finishing the job in hand and waiting for the next one)
and ``switch_s`` the adapter load and switch alone (both None when the worker already served
that version), or ``("error", i, text)``.

Cheating workers, for tests and demos (``cheat``); the learner's checks must catch each:

* ``"fake-logprobs"``: invented log-probabilities (every token at -0.05, a confident forgery);
* ``"other-model:<spec>"``: completions, log-probs and fingerprints of another model;
* ``"fake-fingerprint"``: fingerprints scaled by 1.5 and committed to (the commitment opens,
  the activations do not match);
* ``"bad-commitment"``: a commitment that is not the root of the fingerprints sent.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from dataclasses import dataclass, replace
from typing import Any

#: what a job message carries beside the job: (version, adapter path, adapter sha256, published
#: at, in time.monotonic() seconds: CLOCK_MONOTONIC is one clock for every process on a host)
JobMessage = tuple[bytes, int, str, str, float]


def worker_main(index: int, spec: str, env_spec: str, n_threads: int, cheat: str,
                jobs: Any, results: Any) -> None:
    """Body of a worker process: serve jobs from ``jobs`` until it yields None."""
    os.environ.setdefault("OMP_NUM_THREADS", str(n_threads))
    from pathlib import Path

    from models.rl.env import load_environment
    from models.rl.rollout import RolloutWorker
    from protocol.codec import decode as decode_message
    from protocol.codec import encode
    from protocol.rl.messages import RolloutJob

    if cheat.startswith("other-model:"):
        spec = cheat.partition(":")[2]
    try:
        worker = RolloutWorker(spec or None, n_threads=n_threads)
        env = load_environment(env_spec)
    except Exception as exc:  # reported to the learner, which stops with this text
        results.put(("error", index, f"worker {index} failed to start: {exc}"))
        return
    results.put(("ready", index))
    name = f"local-{index}"
    while (msg := jobs.get()) is not None:
        job_bytes, version, adapter_path, sha, published_at = msg
        try:
            job = decode_message(job_bytes, RolloutJob)
            swap_s = switch_s = None
            if version != worker.version:
                load_s = worker.add_adapter(version, Path(adapter_path), sha) if version else 0.0
                switch_s = load_s + worker.use(version)
                swap_s = time.monotonic() - published_at
            t = time.perf_counter()
            result = _cheat(cheat, worker.generate_group(job, env, worker=name))
            results.put(("result", index, encode(result), swap_s, time.perf_counter() - t,
                         switch_s))
        except Exception as exc:  # a job this worker cannot run: the learner reissues it
            results.put(("error", index, f"job failed on worker {index}: {exc}"))
    worker.close()


def _cheat(cheat: str, result: Any) -> Any:
    """``result`` (a RolloutResultBody) as the cheat named sends it."""
    import numpy as np

    from models.fingerprint import decode_chunk
    from protocol.rl.validation import rollout_commitment

    if cheat == "fake-logprobs":
        fake = tuple(replace(c, logprobs=(-0.05,) * len(c.token_ids)) for c in result.completions)
        return replace(result, completions=fake)
    if cheat == "fake-fingerprint":
        def scaled(blob: bytes) -> bytes:
            idx, vals = decode_chunk(blob)
            return blob[:2] + idx.astype("<u2").tobytes() + (vals * 1.5).astype("<f2").tobytes()

        fake = tuple(replace(c, fingerprint=scaled(c.fingerprint)) for c in result.completions)
        return replace(result, completions=fake, commitment=rollout_commitment(fake))
    if cheat == "bad-commitment":
        return replace(result, commitment=bytes(np.full(32, 7, dtype=np.uint8)))
    return result


@dataclass
class WorkerPool:
    """Worker processes, a job queue each and one shared result queue."""

    procs: list[Any]
    queues: list[Any]
    results: Any

    @classmethod
    def start(cls, n: int, spec: str, env_spec: str, n_threads: int,
              cheaters: tuple[str, ...] = (), ready_timeout_s: float = 300.0) -> WorkerPool:
        ctx = mp.get_context("spawn")  # no fork of a process holding torch threads
        results = ctx.Queue()
        procs, queues = [], []
        for i in range(n):
            q = ctx.Queue()
            cheat = cheaters[i] if i < len(cheaters) else ""
            p = ctx.Process(target=worker_main, name=f"rl-worker-{i}", daemon=True,
                            args=(i, spec, env_spec, n_threads, cheat, q, results))
            p.start()
            procs.append(p)
            queues.append(q)
        pool = cls(procs, queues, results)
        pool._wait_ready(n, ready_timeout_s)
        return pool

    def _wait_ready(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        ready = 0
        while ready < n:
            try:
                msg = self.results.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                self.stop()
                raise RuntimeError(f"{n - ready} rollout workers did not start in {timeout_s:.0f} s") from None
            if msg[0] == "error":
                self.stop()
                raise RuntimeError(msg[2])
            ready += 1

    def send(self, index: int, msg: JobMessage) -> None:
        self.queues[index].put(msg)

    def get(self, timeout_s: float) -> tuple[Any, ...] | None:
        try:
            msg: tuple[Any, ...] = self.results.get(timeout=max(0.0, timeout_s))
            return msg
        except queue.Empty:
            return None

    def alive(self, index: int) -> bool:
        return bool(self.procs[index].is_alive())

    def stop(self) -> None:
        for q, p in zip(self.queues, self.procs, strict=True):
            if p.is_alive():
                q.put(None)
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join()
