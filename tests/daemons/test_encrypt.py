"""mrcd's ``encrypt = true``: payloads travel AES-GCM encrypted, and still land intact.

Two mrcds in loopback data mode (tests/support/apiharness.py) move random bytes with a
write-with-immediate; the receiver's memory is compared byte for byte.  Meanwhile a raw
IPv6 socket (CAP_NET_RAW: root) copies every UDP datagram sent to the receiver's plane
ports off the loopback interface: with encryption no 64 bytes of any captured data packet
appear in the plaintext, and without it (the same run, ``encrypt = false``) they do, which
shows the capture sees what the daemons really send.
"""

from __future__ import annotations

import os
import socket
import struct
from dataclasses import replace
from pathlib import Path

import pytest

from mrcstack.api import QpAttr, WcStatus, WriteWr
from mrcstack.wire import AeadIntegrity, CrcIntegrity, DataPacket, DecodeError, decode
from tests.support.apiharness import Daemons, connect, drain

SIZE = 1 << 18
MTU = 4096
UDP = struct.Struct("!HHHH")  # source port, destination port, length, checksum
WINDOW = 64

pytestmark = pytest.mark.requires_root  # a raw socket to see the datagrams


def _drain(raw: socket.socket, ports: set[int]) -> list[bytes]:
    """UDP payloads to ``ports`` the raw socket holds (IPv6 raw sockets start at UDP)."""
    out = []
    while True:
        try:
            data = raw.recv(1 << 16)
        except BlockingIOError:
            return out
        _src, dst, _length, _sum = UDP.unpack_from(data)
        if dst in ports:
            out.append(data[UDP.size :])


def _transfer(tmp: Path, encrypt: bool) -> list[bytes]:
    """One verified write h0 -> h3; the datagrams h3's plane sockets were sent meanwhile."""
    tmp.mkdir()
    d = Daemons(tmp, encrypt=encrypt)
    raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    try:
        d.start()
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        raw.bind(("::1", 0))
        raw.setblocking(False)
        node = d.nodes[3]
        ports = {node.data_address(3, plane)[1] for plane in range(node.fabric.planes)}
        assert d.nodes[0].cfg.encrypt is encrypt
        a, b = connect(d, SIZE, attr=QpAttr(mtu_payload=MTU))
        plaintext = os.urandom(SIZE)
        a.mr.buf[:] = plaintext
        _drain(raw, ports)  # connection setup is over: only the write from here on
        a.qp.post_send(WriteWr(1, (a.mr, 0, SIZE), b.mr.addr, b.mr.rkey, imm=7))
        assert drain(a.cq, 1)[0].status is WcStatus.SUCCESS
        wc = drain(b.cq, 1)[0]
        assert (wc.status, wc.imm, wc.byte_len) == (WcStatus.SUCCESS, 7, SIZE)
        assert bytes(b.mr.buf) == plaintext  # every byte, decrypted where it landed
        data = [p for p in _drain(raw, ports) if len(p) > MTU]
        assert len(data) >= SIZE // MTU, f"captured {len(data)} data packets"
        return [p for p in data if _shows(p, plaintext)]
    finally:
        raw.close()
        d.stop()


def _shows(packet: bytes, plaintext: bytes) -> bool:
    """Does the packet carry some of the plaintext as it is (64 bytes from its middle)?"""
    middle = len(packet) // 2
    return packet[middle : middle + WINDOW] in plaintext


def test_encrypted_payloads_land_intact_and_never_cross_the_wire_in_clear(
    tmp_path: Path,
) -> None:
    clear = _transfer(tmp_path / "clear", encrypt=False)
    assert len(clear) >= SIZE // MTU  # without encryption the capture sees the payloads
    assert _transfer(tmp_path / "encrypted", encrypt=True) == []


@pytest.mark.parametrize(("src_auth", "dst_auth"), [(True, True), (True, False), (False, True)])
def test_packet_auth_is_agreed_per_qp(tmp_path: Path, src_auth: bool, dst_auth: bool) -> None:
    """AES-GCM packets only when both ends want them; otherwise OCP's plain ICRC, which the
    captured datagrams carry over the real (loopback) addresses and ports."""
    d = Daemons(tmp_path)
    raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_UDP)
    try:
        d.start()
        src, dst = d.nodes[0], d.nodes[3]
        for node, auth in ((src, src_auth), (dst, dst_auth)):
            d.on_loop(lambda n=node, a=auth: setattr(n, "cfg", replace(n.cfg, packet_auth=a)))
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 << 20)
        raw.bind(("::1", 0))
        raw.setblocking(False)
        ports = {dst.data_address(3, plane)[1] for plane in range(dst.fabric.planes)}
        a, b = connect(d, SIZE, attr=QpAttr(mtu_payload=MTU))
        _drain(raw, ports)
        a.mr.buf[:] = os.urandom(SIZE)
        a.qp.post_send(WriteWr(1, (a.mr, 0, SIZE), b.mr.addr, b.mr.rkey, imm=7))
        assert drain(a.cq, 1)[0].status is WcStatus.SUCCESS
        assert drain(b.cq, 1)[0].byte_len == SIZE
        assert bytes(b.mr.buf) == bytes(a.mr.buf)
        kinds = {
            d.on_loop(lambda n=node, q=qpn: type(n.qps[q].conn.integrity))  # type: ignore[union-attr]
            for node, qpn in ((src, a.qp.qpn), (dst, b.qp.qpn))
        }
        agreed = src_auth and dst_auth
        assert kinds == {AeadIntegrity if agreed else CrcIntegrity}
        data = [p for p in _drain(raw, ports) if len(p) > MTU]
        assert len(data) >= SIZE // MTU
        icrc = CrcIntegrity(dst.icrc_paths(0))  # as h3 checks what h0 sent it
        for datagram in data:
            if agreed:
                with pytest.raises(DecodeError):  # a 16-byte tag, not an ICRC
                    decode(datagram, icrc)
            else:
                assert isinstance(decode(datagram, icrc), DataPacket)
    finally:
        raw.close()
        d.stop()
