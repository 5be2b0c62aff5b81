"""Learner checkpoints and the version counter, both written atomically.

A checkpoint holds the adapter weights of policy version ``v``, the optimizer state and the
learner's counters. It is written to a temporary file in the same directory, fsynced and
renamed over ``ckpt-<v>.pt`` (a crash leaves either the old file set or the new one, never a
torn file); older checkpoints beyond the last ``keep`` are then removed.

Versions are never reused for different weights. A version is published (its adapter exported
and handed to workers) after every step, but a checkpoint is written only every m steps, so a
learner killed between two checkpoints has published versions it cannot restore. The
:class:`VersionCounter` file records the highest version ever published, *before* it is
published; on restart the learner reloads the last checkpoint's weights (still its old version,
the same weights) and its next step takes ``max(published, checkpoint) + 1``: versions can
skip, never repeat.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

_CKPT_RE = re.compile(r"^ckpt-(\d+)\.pt$")
#: checkpoints kept on disk (the newest ones)
DEFAULT_KEEP = 2


def _atomic_write(path: Path, write: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)  # the rename itself survives a power cut
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class Checkpoint:
    version: int
    adapter: dict[str, torch.Tensor]
    optimizer: dict[str, Any]
    counters: dict[str, float]


def save_checkpoint(directory: Path, ckpt: Checkpoint, keep: int = DEFAULT_KEEP) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"ckpt-{ckpt.version}.pt"
    payload = {"version": ckpt.version, "adapter": ckpt.adapter, "optimizer": ckpt.optimizer,
               "counters": dict(ckpt.counters)}
    _atomic_write(path, lambda f: torch.save(payload, f))
    for old in sorted(_versions(directory))[:-keep]:
        (directory / f"ckpt-{old}.pt").unlink(missing_ok=True)
    return path


def _versions(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return [int(m.group(1)) for p in directory.iterdir() if (m := _CKPT_RE.match(p.name))]


def latest_checkpoint(directory: Path) -> Checkpoint | None:
    """The newest checkpoint in ``directory``, or None when there is none."""
    versions = sorted(_versions(directory))
    if not versions:
        return None
    path = directory / f"ckpt-{versions[-1]}.pt"
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # a file we did not write (ours are renamed whole)
        raise ValueError(f"checkpoint {path} cannot be read: {exc}") from None
    if data.get("version") != versions[-1]:
        raise ValueError(f"checkpoint {path} holds version {data.get('version')!r}")
    return Checkpoint(version=int(data["version"]), adapter=data["adapter"],
                      optimizer=data["optimizer"], counters=dict(data["counters"]))


class VersionCounter:
    """The highest policy version ever published from this run directory (a JSON file)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.published = -1
        if path.exists():
            try:
                self.published = int(json.loads(path.read_text())["published"])
            except (ValueError, KeyError, TypeError) as exc:
                raise ValueError(f"version counter {path} is unreadable: {exc}") from None

    def claim(self, version: int) -> None:
        """Record ``version`` as published (call before anyone can see it)."""
        if version <= self.published:
            raise ValueError(f"version {version} was already published (highest {self.published})")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = json.dumps({"published": version}).encode()
        _atomic_write(self.path, lambda f: f.write(data))
        self.published = version

    def next_after(self, checkpoint_version: int) -> int:
        """The version the next step must take, resuming from ``checkpoint_version``."""
        return max(self.published, checkpoint_version) + 1
