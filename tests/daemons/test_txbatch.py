"""Batched datagram send (sendmmsg) on loopback sockets (no root needed)."""

from __future__ import annotations

import socket
import time

import pytest

from mrcstack.daemons.mrcd.datapath.rxbatch import BatchReceiver
from mrcstack.daemons.mrcd.datapath.transport import open_plane_socket
from mrcstack.daemons.mrcd.datapath.txbatch import BatchSender, ControlMessage, Sockaddr
from mrcstack.wire import TCLASS_CONTROL, TCLASS_DATA

TCLASS = TCLASS_CONTROL


def _fill(batch: BatchSender, payloads: list[bytes], to: list[Sockaddr],
          control: ControlMessage | None = None) -> None:  # fmt: skip
    for i, payload in enumerate(payloads):
        batch.slots[batch.count][: len(payload)] = payload
        full = batch.add(len(payload), to[i % len(to)], control if i % 2 else None)
        assert full is (batch.count == batch.vlen)


def test_a_batch_reaches_each_destination_in_order_with_its_traffic_class() -> None:
    rx_socks = [open_plane_socket(("::1", 0)) for _ in range(2)]
    rx = BatchReceiver(16)
    tx_sock = open_plane_socket(("::1", 0))
    batch = BatchSender(4, slot=2048)
    try:
        to = [Sockaddr(s.getsockname()[:2]) for s in rx_socks]
        control = ControlMessage(
            socket.IPPROTO_IPV6, socket.IPV6_TCLASS, TCLASS.to_bytes(4, "little")
        )
        payloads = [bytes([i]) * (100 + i) for i in range(4)]
        _fill(batch, payloads, to, control)
        assert batch.datagram(2) == payloads[2]
        assert batch.addresses[1] == rx_socks[1].getsockname()[:2]
        assert batch.send(tx_sock.fileno(), 1) == 3  # from datagram 1 on
        batch.count = 0
        time.sleep(0.01)
        got = []
        for s in rx_socks:
            n = rx.recv(s.fileno())
            got += [(bytes(rx.datagram(i)), rx.tclass(i)) for i in range(n)]
        assert sorted(got) == sorted(
            [(payloads[1], TCLASS), (payloads[2], TCLASS_DATA), (payloads[3], TCLASS)]
        )
        assert [d for d, _ in got if d[0] in (1, 3)] == [payloads[1], payloads[3]]  # one socket
    finally:
        for s in [*rx_socks, tx_sock]:
            s.close()


def test_a_send_on_a_closed_socket_is_an_os_error() -> None:
    batch = BatchSender(2, slot=64)
    s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
    fd = s.fileno()
    s.close()
    _fill(batch, [b"x"], [Sockaddr(("::1", 9))])
    with pytest.raises(OSError):
        batch.send(fd)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError):
        BatchSender(0)
