"""Who a publisher names in a manifest, and at what upload bandwidth: the relay plan's inputs.

Contract
--------
The plan (protocol/relay/striping.py) is computed from the manifest alone, so what the
publisher writes for each recipient decides where it sits. ``plan_recipients`` writes:

* a peer that at least ``min_reports`` distinct other peers attested as ``RELAY_WITHHELD``
  (it was their plan parent, held the version, was asked for chunks and sent none: a free
  rider) at ``FREE_RIDER_UPLOAD_BPS``, so it gets no slot and is a leaf in every tree;
* every other peer at its measured upload bandwidth in bytes/s, 0 where none is known (the
  plan then assumes links like the publisher's).

``withholders`` counts the distinct reporters per subject from ``(subject, observer)`` pairs
of ``RELAY_WITHHELD`` attestations (the daemon reads them from its ledger view; the simulator
from what its nodes attest). A peer never counts as its own reporter. Pure and deterministic:
recipients come out sorted by peer id.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

#: upload advertised for a detected free rider: no slot at any stripe rate, so always a leaf
FREE_RIDER_UPLOAD_BPS = 1
#: distinct reporters that make a peer a free rider in the next plan
MIN_WITHHELD_REPORTS = 1


def withholders(reports: Iterable[tuple[str, str]]) -> dict[str, set[str]]:
    """Subject -> the distinct peers that attested it withheld chunks from them."""
    out: dict[str, set[str]] = {}
    for subject, observer in reports:
        if subject != observer:
            out.setdefault(subject, set()).add(observer)
    return out


def plan_recipients(
    peers: Iterable[str],
    uploads: Mapping[str, int],
    withheld_by: Mapping[str, set[str]],
    *,
    min_reports: int = MIN_WITHHELD_REPORTS,
) -> list[tuple[str, int]]:
    """``(peer, advertised upload bps)`` for a manifest; see the module docstring."""
    if min_reports < 1:
        raise ValueError(f"min_reports must be >= 1, got {min_reports}")
    out = []
    for peer in sorted(set(peers)):
        if len(withheld_by.get(peer, ())) >= min_reports:
            out.append((peer, FREE_RIDER_UPLOAD_BPS))
        else:
            upload = uploads.get(peer, 0)
            if upload < 0:
                raise ValueError(f"upload of {peer} is negative: {upload}")
            out.append((peer, upload))
    return out
