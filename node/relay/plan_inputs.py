"""What the publisher's daemon reads from its ledger to write a manifest's recipients.

* ``ledger_uploads``: each recipient's upload bandwidth from its live capability record
  (``CapabilityRecord.upload_bps``: what that node measured or was configured with; 0 or no
  record: unknown, and the plan assumes links like the publisher's);
* ``withheld_reports``: ``(subject, observer)`` of every ``RELAY_WITHHELD`` attestation held,
  so free riders become leaves in the next plan (protocol/relay/recipients.py).

Without a ledger service both are empty. The rule that turns them into recipients lives in
protocol/relay/recipients.py (``plan_recipients``), shared with the simulator.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from protocol.ledger.records import AttestationKind


def _view(services: Mapping[str, Any]) -> Any:
    return getattr(getattr(services.get("ledger"), "machine", None), "view", None)


def ledger_uploads(services: Mapping[str, Any], peers: Iterable[str], now: int) -> dict[str, int]:
    """Peer -> upload bytes/s advertised in its live capability record (known ones only)."""
    view = _view(services)
    if view is None:
        return {}
    out = {}
    for peer in peers:
        held = view.capability(peer, now)
        upload = getattr(getattr(held, "record", None), "upload_bps", 0)
        if upload > 0:
            out[peer] = int(upload)
    return out


def withheld_reports(services: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(subject, observer) of every RELAY_WITHHELD attestation the ledger holds."""
    view = _view(services)
    if view is None:
        return []
    held = view.attestations(kind=AttestationKind.RELAY_WITHHELD)
    return [(a.attestation.subject, a.observer) for a in held]
