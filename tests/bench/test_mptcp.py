"""The MPTCP baseline of bench/daemon_bench.py proves it used several subflows.

In a network namespace of its own (root; removed by exact name), the bench's own sender and
receiver roles run over loopback with two addresses: with the receiver announcing its second
address, two subflows carry the data; with no announcement, one subflow does, and against a
plain TCP receiver the connection falls back to TCP.  The last two fail the bench section
loudly instead of reporting kernel TCP's figure as MPTCP's.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from bench import daemon_bench, mptcp
from mrcstack.netns.run import call_in_netns, ip

NETNS = f"mrc-mptcp-{os.getpid()}"
ADDRESSES = ("fd00:a::1", "fd00:b::1")

pytestmark = [pytest.mark.requires_root, pytest.mark.requires_kernel("mptcp")]


@pytest.fixture
def netns() -> Iterator[str]:
    ip("netns", "add", NETNS)
    try:
        ip("link", "set", "lo", "up", netns=NETNS)
        for addr in ADDRESSES:
            ip("address", "add", f"{addr}/128", "dev", "lo", "nodad", netns=NETNS)
        ip("mptcp", "limits", "set", "subflow", "8", "add_addr_accepted", "8", netns=NETNS)
        yield NETNS
    finally:
        ip("netns", "del", NETNS)


def _flow(netns: str, recv_proto: int) -> dict[str, Any]:
    """The bench's tcp-recv (``recv_proto``) and MPTCP tcp-send roles for 0.5 s; what the
    sender reported."""
    recv = argparse.Namespace(proto=recv_proto, timeout=20.0)
    send = argparse.Namespace(proto=daemon_bench.IPPROTO_MPTCP, to=ADDRESSES[0],
                              seconds=0.5, timeout=20.0)  # fmt: skip
    got: list[dict[str, Any]] = []
    receiver = threading.Thread(
        target=lambda: got.append(call_in_netns(netns, lambda: daemon_bench.role_tcp_recv(recv)))
    )
    receiver.start()
    try:
        for _ in range(200):  # until the receiver listens
            try:
                return call_in_netns(netns, lambda: daemon_bench.role_tcp_send(send))
            except ConnectionRefusedError:
                time.sleep(0.01)
        raise AssertionError("the receiver never listened")
    finally:
        receiver.join(30)
        assert got and got[0]["bytes"] > 0


def test_mptcp_over_two_addresses_uses_two_subflows(netns: str) -> None:
    ip("mptcp", "endpoint", "add", ADDRESSES[1], "dev", "lo", "signal", netns=netns)
    sender = _flow(netns, daemon_bench.IPPROTO_MPTCP)
    assert len(sender["subflow_bytes"]) == 2, sender
    assert daemon_bench.mptcp_subflows(sender, planes=2) == 2


def test_one_subflow_fails_the_section(netns: str) -> None:
    sender = _flow(netns, daemon_bench.IPPROTO_MPTCP)  # nothing announced: one path
    assert mptcp.used_subflows(sender["subflow_bytes"]) == 1
    with pytest.raises(RuntimeError, match=r"1 subflow\(s\) carried the data"):
        daemon_bench.mptcp_subflows(sender, planes=2)


def test_fallback_to_plain_tcp_fails_the_section(netns: str) -> None:
    sender = _flow(netns, 0)  # a plain TCP receiver: MPTCP falls back
    assert "fell back to plain TCP" in sender["fallback"] and "subflow_bytes" not in sender
    with pytest.raises(RuntimeError, match="fell back to plain TCP"):
        daemon_bench.mptcp_subflows(sender, planes=2)
