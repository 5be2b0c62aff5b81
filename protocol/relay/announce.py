"""When a publisher gossips a version's manifest: after its recipients have the version.

Contract
--------
A manifest that names recipients reaches them down the plan, not by gossip: the publisher
sends it to its plan children, every node that accepts it sends it on to its own
(protocol/relay/machine.py), and every chunk stream opens with it. Gossiping it at once as
well would have every node of the mesh forward about ``degree`` copies of a frame that grows
with the recipients (90 KB at 1,000 of them, 0.9 MB at 10,000) on the very uplinks the
relay needs at that moment. So the publisher gossips it, for peers outside the plan that may
ask for the artifact (``FetchVersion``), only once every recipient has reported the version
complete (their last ``RelayProgress`` goes to the publisher), or
``ANNOUNCE_AFTER_ESTIMATES`` times the plan's estimated time after publishing if some never
do (one left, say). A manifest that names no recipients is gossiped at once: gossip is then
the only way anyone learns of it. Peers outside the plan thus hear of a version after the
relay, and fetch it from relay nodes whose uplinks are then free.
"""

from __future__ import annotations

from protocol.machine import Effect, Publish
from protocol.relay.manifest import RELAY_TOPIC
from protocol.relay.transfer import Transfer, manifest_event

#: a publisher gossips a manifest at the latest this many plan estimates after publishing
ANNOUNCE_AFTER_ESTIMATES = 2


def schedule_announcement(t: Transfer, now: int, out: list[Effect]) -> None:
    """Just published: gossip now if nobody is named, else when ``announce_at_ms`` is due
    or every recipient reported completion (``count_completion``)."""
    recipients = len(t.plan.trees[0].order) - 1
    if recipients == 0:
        announce(t, out)
    else:
        t.announce_at_ms = now + ANNOUNCE_AFTER_ESTIMATES * t.plan.estimated_ms


def count_completion(t: Transfer, out: list[Effect]) -> None:
    """A recipient's report says it holds the whole version (first time for that peer)."""
    t.completed_reports += 1
    if t.announce_at_ms is not None and t.completed_reports >= len(t.plan.trees[0].order) - 1:
        announce(t, out)


def announce(t: Transfer, out: list[Effect]) -> None:
    t.announce_at_ms = None
    out.append(Publish(RELAY_TOPIC, t.manifest.message))
    out.append(manifest_event("announced", t.manifest, completed=t.completed_reports))
