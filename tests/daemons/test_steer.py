"""The reuseport steering program on loopback sockets (no root needed): every datagram
reaches the socket of the worker that owns its destination QP, and every answer to an EV
probe that of the worker whose probe it answers."""

from __future__ import annotations

import random
import socket
import time

import pytest

from mrcstack.daemons.mrcd.datapath.steer import attach, probe_owner, program, worker_for, worker_of


def _group(workers: int) -> list[socket.socket]:
    """``workers`` UDP sockets sharing one loopback port, in joining order."""
    socks: list[socket.socket] = []
    port = 0
    for _ in range(workers):
        s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        s.bind(("::1", port))
        port = s.getsockname()[1]
        s.setblocking(False)
        socks.append(s)
    attach(socks[0], workers)
    return socks


def _bth(qpn: int) -> bytes:
    """A write's BTH (opcode, flags, P_Key, reserved byte, destination QP, PSN) and some
    payload: only the destination QP steers."""
    return bytes([0x0A, 0x40, 0xFF, 0xFF, 0xA5]) + qpn.to_bytes(3, "big") + bytes(4) + b"x" * 64


def _drain(sock: socket.socket) -> list[bytes]:
    got = []
    while True:
        try:
            got.append(sock.recv(2048))
        except BlockingIOError:
            return got


@pytest.mark.parametrize("workers", [2, 3])
def test_every_datagram_reaches_the_worker_of_its_qp(workers: int) -> None:
    rng = random.Random(workers)
    qpns = [0, 1, 2, 3, 0xFFFFFF, 0xFFFFFE, 0x800000, *(rng.randrange(1 << 24) for _ in range(200))]
    socks = _group(workers)
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx:
            for qpn in qpns:
                tx.sendto(_bth(qpn), socks[0].getsockname()[:2])
            tx.sendto(b"\x0a\x40", socks[0].getsockname()[:2])  # no BTH: worker 0
        time.sleep(0.05)
        got = [_drain(s) for s in socks]
        wrong = [
            (index, int.from_bytes(d[5:8], "big"))
            for index, datagrams in enumerate(got)
            for d in datagrams
            if len(d) >= 8 and worker_of(int.from_bytes(d[5:8], "big"), workers) != index
        ]
        assert wrong == []
        assert sum(len(g) for g in got) == len(qpns) + 1
        assert b"\x0a\x40" in got[0]
        assert all(got)  # every worker got its share
    finally:
        for s in socks:
            s.close()


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_an_answer_to_a_probe_reaches_the_worker_that_sent_the_probe(workers: int) -> None:
    """ENDPOINT_RESPONSE datagrams (all to QP 2) go by their probe id: to its owner, the
    daemon's to worker 0; an ENDPOINT_REQUEST (a probe) by its QP like any other."""
    ids = [0, 1, 2, 3, 0xFFFF, *random.Random(workers).sample(range(1 << 16), 100)]
    answers = [
        bytes([0xD9, 0x40, 0xFF, 0xFF, 0, 0, 0, 2, 0, 0]) + i.to_bytes(2, "big") + bytes(72)
        for i in ids
    ]
    probe = bytes([0xD8, 0x40, 0xFF, 0xFF, 0, 0, 0, 2, 0, 0, 0, 7]) + bytes(48)
    short = bytes([0xD9, 0x40, 0xFF, 0xFF, 0, 0, 0, 2, 0, 1])  # no probe id: worker 0
    socks = _group(workers)
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as tx:
            for d in (*answers, probe, short):
                tx.sendto(d, socks[0].getsockname()[:2])
        time.sleep(0.05)
        got = [_drain(s) for s in socks]
        for index, datagrams in enumerate(got):
            for d in datagrams:
                assert worker_for(d, workers) == index, (index, d[:12].hex())
        assert sum(len(g) for g in got) == len(answers) + 2
        for d, ident in zip(answers, ids, strict=True):
            owner = probe_owner(ident, workers)
            assert d in got[owner if owner < workers else 0]
        assert probe in got[2 % workers] and short in got[0]
    finally:
        for s in socks:
            s.close()


def test_the_program_is_eleven_instructions_and_workers_are_bounded() -> None:
    assert len(program(4)) == 11 * 8
    with pytest.raises(ValueError, match="workers"):
        program(0)
