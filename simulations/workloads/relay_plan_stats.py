"""Shape of the relay plan a manifest yields (depth, widest fan-out), for reports."""

from __future__ import annotations

from protocol.relay.manifest import Manifest
from protocol.relay.striping import manifest_plan


def plan_shape(manifest: Manifest, *, max_fanout: int, stripes: int = 1) -> dict[str, int]:
    plan = manifest_plan(manifest, stripes=stripes, max_fanout=max_fanout)
    return {"depth": plan.max_depth, "fanout": plan.max_fanout}
