"""Shape of the relay plan a manifest yields (depth, widest fan-out), for reports."""

from __future__ import annotations

from protocol.relay.manifest import Manifest
from protocol.relay.striping import build_striped_plan


def plan_shape(manifest: Manifest, *, max_fanout: int, stripes: int = 1) -> dict[str, int]:
    body = manifest.body
    plan = build_striped_plan(
        manifest.signer,
        body.publisher_upload_bps,
        ((r.peer_id, r.upload_bps) for r in body.recipients),
        total_size=body.total_size,
        chunk_size=body.chunk_size,
        seed=manifest.id,
        stripes=stripes,
        max_fanout=max_fanout,
    )
    return {"depth": plan.max_depth, "fanout": plan.max_fanout}
