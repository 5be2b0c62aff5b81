"""The ``[relay]`` config section of the daemon (node/relay/service.py reads it)."""

from __future__ import annotations

from dataclasses import dataclass

from protocol.relay.admission import MAX_MANIFESTS, MAX_MANIFESTS_PER_SIGNER
from protocol.relay.machine import DEFAULT_WINDOW, KEEP_VERSIONS, STALL_TIMEOUT_MS
from protocol.relay.manifest import MAX_CHUNK_SIZE, MIN_CHUNK_SIZE
from protocol.relay.striping import DEFAULT_STRIPES, MAX_STRIPES

DEFAULT_CHUNK_SIZE = 1 << 20


@dataclass(frozen=True)
class RelaySection:
    """``[relay]`` config (``SYMPHONY_RELAY__<KEY>``)."""

    #: chunk size of versions this node publishes
    chunk_size: int = DEFAULT_CHUNK_SIZE
    #: chunk requests in flight per version (the pipeline depth towards one source)
    window: int = DEFAULT_WINDOW
    #: complete versions kept per artifact; older ones are garbage-collected
    keep_versions: int = KEEP_VERSIONS
    #: a source with requests in flight and silent this long is dropped
    stall_timeout_ms: int = STALL_TIMEOUT_MS
    #: upload bandwidth this node advertises in manifests it publishes (0: unknown)
    upload_bps: int = 0
    #: cap on this node's total chunk upload, bytes/s (0: none); for benchmarks
    upload_limit_bps: int = 0
    #: stripes per version (each its own relay tree); every peer must use the same
    stripes: int = DEFAULT_STRIPES
    #: if set, only versions signed by these peer ids are accepted
    trusted_publishers: tuple[str, ...] = ()
    #: manifests of one other signer kept (planned or merely known); more is a flood
    max_manifests_per_signer: int = MAX_MANIFESTS_PER_SIGNER
    #: manifests of other signers kept in all
    max_manifests: int = MAX_MANIFESTS
    #: re-hash stored chunks of saved versions at start (resume after a crash)
    verify_on_start: bool = True
    #: models (registry names or .gguf paths) this node offers to peers over the relay: each
    #: is cut into its chunk store (its size on disk again) and named by its weights hash
    seed_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not MIN_CHUNK_SIZE <= self.chunk_size <= MAX_CHUNK_SIZE:
            raise ValueError(f"chunk_size must be within {MIN_CHUNK_SIZE}..{MAX_CHUNK_SIZE}")
        for name in (
            "window", "keep_versions", "stall_timeout_ms", "max_manifests_per_signer",
            "max_manifests",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if not 1 <= self.stripes <= MAX_STRIPES:
            raise ValueError(f"stripes must be within 1..{MAX_STRIPES}, got {self.stripes}")
        if self.upload_bps < 0 or self.upload_limit_bps < 0:
            raise ValueError("bandwidths must not be negative")
