"""What the publisher's daemon feeds the relay plan: uploads from the ledger's capability
records (node/relay/plan_inputs.py) and the upload a node measures and advertises
(node/relay/upload_meter.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import msgpack

from node.relay.plan_inputs import ledger_uploads, withheld_reports
from node.relay.upload_meter import UploadMeter
from protocol.codec import decode, encode, to_array
from protocol.ledger.records import AttestationKind, CapabilityRecord, HardwareSummary


def record(**extra: object) -> CapabilityRecord:
    return CapabilityRecord(
        network_id="n", peer_id="p", seq=1, issued_at_ms=1, expires_at_ms=2, listen_addrs=(),
        models=(), hardware=HardwareSummary(device_kind="cpu", device_name="x", memory_bytes=1,
                                            cpu_cores=2),
        price_per_1k_tokens=0.0, free_slots=1, max_slots=1, load=0.0, roles=(), tags=(),
        software_version="t", **extra)  # type: ignore[arg-type]


def test_capability_record_carries_upload_and_old_records_decode() -> None:
    assert decode(encode(record(upload_bps=12_500_000)), CapabilityRecord).upload_bps == 12_500_000
    fields = to_array(record())
    for older in (fields[:-1], fields[:-2]):  # before upload_bps; before blocks too
        got = decode(msgpack.packb(older, use_bin_type=True), CapabilityRecord)
        assert got.upload_bps == 0 and got.blocks == ()


class View:
    """A ledger view holding one live record per peer and some attestations."""

    def __init__(self, uploads: dict[str, int], withheld: list[tuple[str, str]]) -> None:
        self.uploads = uploads
        self.withheld = withheld
        self.asked_at: list[int] = []

    def capability(self, peer: str, now: int) -> SimpleNamespace | None:
        self.asked_at.append(now)
        if peer not in self.uploads:
            return None
        return SimpleNamespace(record=record(upload_bps=self.uploads[peer]))

    def attestations(self, *, kind: AttestationKind) -> list[SimpleNamespace]:
        assert kind is AttestationKind.RELAY_WITHHELD
        return [SimpleNamespace(attestation=SimpleNamespace(subject=s), observer=o)
                for s, o in self.withheld]


def test_uploads_and_free_rider_reports_come_from_the_ledger() -> None:
    view = View({"a": 5_000_000, "b": 0}, [("c", "a"), ("c", "b")])
    services = {"ledger": SimpleNamespace(machine=SimpleNamespace(view=view))}
    # b advertises nothing and d has no record: both unknown, left to the plan's default
    assert ledger_uploads(services, ["a", "b", "d"], 77) == {"a": 5_000_000}
    assert view.asked_at == [77, 77, 77]
    assert withheld_reports(services) == [("c", "a"), ("c", "b")]
    assert ledger_uploads({}, ["a"], 0) == {} and withheld_reports({}) == []


def test_the_meter_keeps_the_fastest_sustained_upload() -> None:
    meter = UploadMeter()
    for i in range(40):  # 1 MB every 0.1 s for 4 s: 10 MB/s
        meter.sent(1_000_000, i * 0.1)
    assert 9_000_000 < meter.best_bps <= 10_500_000
    best = meter.best_bps
    for i in range(100):  # slower later, after a pause: the best stays
        meter.sent(100_000, 10 + i * 0.1)
    assert meter.best_bps == best
    lone = UploadMeter()
    for i in range(10):  # bursts with pauses over GAP_S never make a busy window
        lone.sent(50_000_000, i * 1.0)
    assert lone.best_bps == 0


def test_the_relay_advertises_configured_then_measured_upload_within_its_cap(tmp_path: Path) -> None:
    from crypto.keys import Identity
    from node.relay.service import RelaySection, RelayService

    def service(**section: int) -> RelayService:
        ctx = SimpleNamespace(identity=Identity.from_seed(b"\x05" * 32), data_dir=tmp_path,
                              network_id="n",
                              config=SimpleNamespace(sections={"relay": RelaySection(**section)}))
        return RelayService(ctx)  # type: ignore[arg-type]

    assert service().advertised_upload_bps() == 0  # nothing configured, nothing measured
    assert service(upload_bps=7_000_000).advertised_upload_bps() == 7_000_000
    assert service(upload_limit_bps=4_000_000).advertised_upload_bps() == 4_000_000
    measured = service(upload_limit_bps=4_000_000)
    measured.streams.meter.best_bps = 3_000_000
    assert measured.advertised_upload_bps() == 3_000_000
    measured.streams.meter.best_bps = 9_000_000  # a burst over the cap counts as the cap
    assert measured.advertised_upload_bps() == 4_000_000


def test_the_manifest_caps_are_named_config_values(tmp_path: Path) -> None:
    import pytest

    from crypto.keys import Identity
    from node.relay.service import RelaySection, RelayService

    section = RelaySection(max_manifests_per_signer=3, max_manifests=40)
    ctx = SimpleNamespace(identity=Identity.from_seed(b"\x06" * 32), data_dir=tmp_path,
                          network_id="n", config=SimpleNamespace(sections={"relay": section}))
    book = RelayService(ctx).machine.book  # type: ignore[arg-type]
    assert (book.max_per_signer, book.max_total) == (3, 40)
    for bad in ({"max_manifests": 0}, {"max_manifests_per_signer": -1}):
        with pytest.raises(ValueError, match="max_manifests"):
            RelaySection(**bad)
