"""node/p2p/multiaddrs.py: multiaddrs taken apart by py-multiaddr, bad ones a clear AddrError."""

from __future__ import annotations

import ipaddress

import multiaddr
import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.p2p.multiaddrs import (
    AddrError,
    TcpEndpoint,
    direct_tcp,
    direct_tcp_endpoints,
    ip_of,
    is_multiaddr,
    is_relayed,
    parse,
    split_circuit,
    tcp_endpoint,
    with_ip,
)

R = "12D3KooWB8sCGZCrwr79HtabLAn95qyPQx6RYHXjEbiD6QKou7ww"
A = "12D3KooWSrKnMZUcSxK8G7wmBbXdU8nFEfWGhLu6H8xjn8LmCSJb"
RELAYED = f"/ip4/1.2.3.4/tcp/4001/p2p/{R}/p2p-circuit/p2p/{A}"


@pytest.mark.parametrize(("addr", "problem"), [
    ("", "'' is not a multiaddr: its text does not start with /"),
    ("tcp/1", "'tcp/1' is not a multiaddr: its text does not start with /"),
    ("/ip4/1.2.3.4/tcp/65536", "is not a multiaddr: integer not in range"),
    ("/ip4/1.2.3/tcp/1", "'/ip4/1.2.3/tcp/1' is not a multiaddr"),
    ("/ip4/1.2.3.4/tcp", "missing value for protocol: tcp"),
    (f"/ip4/1.2.3.4/tcp/1/p2p/{R}/nonsense", "unknown protocol: nonsense"),
    ("/ip4/1.2.3.4/tcp/1/p2p/" + "x" * 300, "is longer than 256"),
    (b"\xff" * 10, "is not a multiaddr"),
    (7, "7 is not a multiaddr: a int"),
])
def test_what_is_no_multiaddr_is_an_addr_error_saying_why(addr: object, problem: str) -> None:
    with pytest.raises(AddrError) as caught:
        parse(addr)  # type: ignore[arg-type]
    assert problem in str(caught.value)
    assert not is_multiaddr(addr)  # type: ignore[arg-type]


def test_bytes_are_the_binary_form_or_its_text() -> None:
    text = f"/ip4/1.2.3.4/tcp/4001/p2p/{R}"
    assert str(parse(multiaddr.Multiaddr(text).to_bytes())) == text
    assert str(parse(text.encode())) == text


@pytest.mark.parametrize(("addr", "endpoint", "direct"), [
    ("/ip4/1.2.3.4/tcp/4001", TcpEndpoint("ip4", "1.2.3.4", 4001), True),
    (f"/ip6/::1/tcp/5/p2p/{A}", TcpEndpoint("ip6", "::1", 5), True),
    ("/dns4/example.org/tcp/80", TcpEndpoint("dns4", "example.org", 80), False),
    (RELAYED, TcpEndpoint("ip4", "1.2.3.4", 4001), False),
])
def test_a_tcp_endpoint_and_whether_it_is_dialled_directly(
        addr: str, endpoint: TcpEndpoint, direct: bool) -> None:
    assert tcp_endpoint(addr) == endpoint
    assert direct_tcp(addr) == (endpoint if direct else None)
    assert is_relayed(addr) == (addr == RELAYED)


def test_an_address_that_is_not_tcp_names_what_was_expected() -> None:
    with pytest.raises(AddrError, match=r"'/ip4/1.2.3.4/udp/9' is not a /ip4\|ip6\|dns"):
        tcp_endpoint("/ip4/1.2.3.4/udp/9")
    assert direct_tcp("/ip4/1.2.3.4/udp/9") is None
    assert str(TcpEndpoint("ip6", "::1", 5)) == "/ip6/::1/tcp/5"


def test_direct_endpoints_skip_what_a_peer_sent_that_is_not_one() -> None:
    offered: list[str | bytes] = [
        b"junk", multiaddr.Multiaddr("/ip4/10.0.0.2/tcp/4001").to_bytes(), RELAYED,
        "/ip4/1.1.1.1/udp/4", "/dns/x.org/tcp/1", "/ip4/10.0.0.2/tcp/4001", "/ip6/::/tcp/7"]
    assert [str(e) for e in direct_tcp_endpoints(offered)] == [
        "/ip4/10.0.0.2/tcp/4001", "/ip6/::/tcp/7"]


def test_the_ip_an_address_starts_with_and_putting_another_there() -> None:
    assert ip_of("/ip4/0.0.0.0/tcp/1") == ipaddress.ip_address("0.0.0.0")
    assert ip_of("/dns/x.org/tcp/1") is None and ip_of("garbage") is None
    assert with_ip(f"/ip4/0.0.0.0/tcp/5/p2p/{A}", "10.0.0.2") == f"/ip4/10.0.0.2/tcp/5/p2p/{A}"
    assert with_ip("/ip4/0.0.0.0/tcp/5", "::1") == "/ip6/::1/tcp/5"
    with pytest.raises(AddrError, match="does not start with an IP address"):
        with_ip("/dns/x.org/tcp/1", "10.0.0.2")


def test_a_relayed_address_splits_into_relay_address_relay_and_target() -> None:
    assert split_circuit(RELAYED) == (f"/ip4/1.2.3.4/tcp/4001/p2p/{R}", R, A)
    for bad in (f"/ip4/1.2.3.4/tcp/4001/p2p/{R}", f"/ip4/1.2.3.4/tcp/4001/p2p-circuit/p2p/{A}",
                f"/p2p/{R}/p2p-circuit", f"/p2p/{R}/p2p-circuit/p2p/{A}/tcp/1"):
        with pytest.raises(AddrError, match="is not a relayed address"):
            split_circuit(bad)


@given(st.one_of(st.binary(max_size=80), st.text(max_size=80),
                 st.text(alphabet="/ip4tcp6:.0123456789p2-circuitdns", max_size=60)))
def test_any_input_parses_or_is_an_addr_error(data: str | bytes) -> None:
    for question in (parse, tcp_endpoint, direct_tcp, is_relayed, split_circuit):
        try:
            question(data)
        except AddrError:
            pass
    assert isinstance(is_multiaddr(data), bool) and isinstance(direct_tcp_endpoints([data]), list)
