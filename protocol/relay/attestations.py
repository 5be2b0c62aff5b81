"""Which ledger attestations a relay yields: one tally shared by daemon and simulator.

A relay node tells the ledger what its sources did for it, so reputation rewards the peers
that forward weights and punishes the ones that corrupt them. The driver feeds
:class:`RelayAttestations` what the ``RelayMachine``'s effects say happened and submits the
``protocol.ledger.events.Attest`` s it returns to its ledger. Promises:

* every chunk stored here (``StoreChunk`` performed) counts for the peer it came from; when
  the version completes (``VersionComplete``) each such peer gets one ``RELAY_SERVED``
  attestation about the manifest, ``amount`` = the chunks it served, in peer order; the
  version's tally is then forgotten, as it is when the version is dropped;
* every ``AttestBadChunk`` yields one ``RELAY_BAD_CHUNK`` about the sender, with the digest
  of the bytes it sent as evidence and the chunk index as ``amount``;
* every ``AttestWithheld`` yields one ``RELAY_WITHHELD`` about the stalled parent, once per
  parent and version (how free riders are found, protocol/relay/recipients.py);
* a node never attests about itself (a publisher's own chunks count for nobody).
"""

from __future__ import annotations

from protocol.ledger.events import Attest as LedgerAttest
from protocol.ledger.records import AttestationKind
from protocol.relay.events import AttestBadChunk, AttestWithheld


class RelayAttestations:
    """The RELAY_SERVED tally of one node and its RELAY_BAD_CHUNK attestations."""

    def __init__(self, own_peer: str) -> None:
        self.own_peer = own_peer
        #: manifest id -> source peer -> chunks it served us
        self.served: dict[bytes, dict[str, int]] = {}
        #: (manifest id, peer) already attested as withholding
        self.withheld_sent: set[tuple[bytes, str]] = set()

    def stored(self, manifest_id: bytes, peer: str) -> None:
        """A chunk of ``manifest_id`` from ``peer`` is stored here."""
        if peer == self.own_peer:
            return
        tally = self.served.setdefault(manifest_id, {})
        tally[peer] = tally.get(peer, 0) + 1

    def completed(self, manifest_id: bytes) -> list[LedgerAttest]:
        """The version is complete here: a RELAY_SERVED attestation per source."""
        tally = self.served.pop(manifest_id, {})
        self.withheld_sent = {k for k in self.withheld_sent if k[0] != manifest_id}
        return [LedgerAttest(subject=peer, object_id=manifest_id,
                             kind=AttestationKind.RELAY_SERVED, amount=count)
                for peer, count in sorted(tally.items())]

    def dropped(self, manifest_id: bytes) -> None:
        """The version was dropped before completing: nothing to attest."""
        self.served.pop(manifest_id, None)
        self.withheld_sent = {k for k in self.withheld_sent if k[0] != manifest_id}

    def bad_chunk(self, effect: AttestBadChunk) -> list[LedgerAttest]:
        """A RELAY_BAD_CHUNK attestation about the sender of a corrupt chunk."""
        if effect.peer == self.own_peer:
            return []
        return [LedgerAttest(subject=effect.peer, object_id=effect.manifest_id,
                             kind=AttestationKind.RELAY_BAD_CHUNK, evidence_hash=effect.got,
                             amount=effect.index)]

    def withheld(self, effect: AttestWithheld) -> list[LedgerAttest]:
        """A RELAY_WITHHELD attestation about a plan parent that sent nothing, once per version."""
        key = (effect.manifest_id, effect.peer)
        if effect.peer == self.own_peer or key in self.withheld_sent:
            return []
        self.withheld_sent.add(key)
        return [LedgerAttest(subject=effect.peer, object_id=effect.manifest_id,
                             kind=AttestationKind.RELAY_WITHHELD)]
