"""The learner's ranks under ``torch.distributed``, as ``torchrun`` starts them.

``torchrun --nproc_per_node N ...`` starts N processes with ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK`` and the rendezvous address in their environment. :meth:`Ranks.from_env` joins
that group: NCCL with one GPU per process (``cuda:LOCAL_RANK``) when CUDA is there, gloo on the
CPU otherwise. It returns None for a single process (no ``WORLD_SIZE``, or 1), so the learner
runs exactly as before without torchrun.

What the ranks share:

* the policy's decoder wrapped in ``DistributedDataParallel`` (:meth:`Ranks.body`), used only
  for the update's forward passes with gradient (models/rl/update.py). Buffers are not
  broadcast on each forward (``broadcast_buffers=False``: the rotary tables are computed, not
  learned), so rank 0 may run forwards of its own without gradient (validation, evaluation)
  without the other ranks taking part;
* a batch, as bytes rank 0 broadcasts (:meth:`Ranks.broadcast_bytes`), and the sums of the
  update's figures (:meth:`Ranks.sum_floats`).
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

#: the largest batch rank 0 may broadcast (a length the other ranks allocate before receiving)
MAX_BROADCAST_BYTES = 1 << 30


@dataclass
class Ranks:
    rank: int
    world: int
    device: torch.device
    _body: Any = field(default=None, repr=False)  # the DDP wrapper, made on first use

    @classmethod
    def from_env(cls) -> Ranks | None:
        """Join torchrun's process group; None when this process runs alone."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return None
        local = int(os.environ.get("LOCAL_RANK", "0"))
        if torch.cuda.is_available():
            device = torch.device("cuda", local)
            torch.cuda.set_device(device)
            backend = "nccl"
        else:
            device, backend = torch.device("cpu"), "gloo"
        if not dist.is_initialized():
            dist.init_process_group(backend=backend)
        return cls(rank=dist.get_rank(), world=dist.get_world_size(), device=device)

    @property
    def leader(self) -> bool:
        return self.rank == 0

    def body(self, policy: Any) -> torch.nn.Module:
        """The policy's decoder (``policy.model.model``) under DDP; made once."""
        if self._body is None:
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.device.index] if self.device.type == "cuda" else None
            self._body = DistributedDataParallel(policy.model.model, device_ids=ids,
                                                 broadcast_buffers=False)
        return self._body  # type: ignore[no-any-return]

    def no_sync(self, body: torch.nn.Module, sync_now: bool) -> AbstractContextManager[Any]:
        """Accumulate this backward locally, unless it is the batch's last (then DDP
        averages the gradients over the ranks)."""
        return nullcontext() if sync_now else body.no_sync()  # type: ignore[operator]

    def sum_floats(self, values: list[float]) -> list[float]:
        t = torch.tensor(values, dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return [float(x) for x in t.tolist()]

    def broadcast_bytes(self, data: bytes | None) -> bytes:
        """Rank 0's ``data`` on every rank (the others pass None)."""
        size = torch.tensor([len(data) if data is not None else 0], dtype=torch.int64,
                            device=self.device)
        dist.broadcast(size, src=0)
        n = int(size.item())
        if not 0 <= n <= MAX_BROADCAST_BYTES:
            raise ValueError(f"a broadcast of {n} bytes (limit {MAX_BROADCAST_BYTES})")
        if n == 0:
            return b""
        if self.leader:
            assert data is not None
            buf = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(self.device)
        else:
            buf = torch.empty(n, dtype=torch.uint8, device=self.device)
        dist.broadcast(buf, src=0)
        return bytes(buf.cpu().numpy().tobytes())

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()
