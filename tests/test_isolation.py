"""The harness's own loopback port draws: layouts meant to run side by side never share a
port (an mrcd's data ports and its probing agent's, drawn one after the other, once did and
failed a run with EADDRINUSE)."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from mrcstack.daemons.mrcd.node.addresses import PORT_STRIDE
from tests.support import isolation
from tests.support.isolation import free_bases, free_tcp_port


def _udp_ports(base: int, hosts: tuple[int, ...], planes: int) -> set[int]:
    return {base + PORT_STRIDE * h + p for h in hosts for p in range(planes)}


def test_a_second_draw_that_lands_on_the_first_layout_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    first, clear = free_bases(2, (0, 3), 4)  # two free layouts apart from each other
    # the random draw offers the first layout again, then one that overlaps it by a plane,
    # then the clear one: only the last may be handed out as the second base
    offers = iter([first, first, first + 1, clear])

    class Scripted:
        def randrange(self, *_: Any) -> int:
            return next(offers)

    monkeypatch.setattr(isolation.random, "Random", Scripted)
    bases = free_bases(2, (0, 3), 4)
    assert bases == (first, clear)
    assert not _udp_ports(bases[0], (0, 3), 4) & _udp_ports(bases[1], (0, 3), 4)


def test_the_drawn_ports_are_free_when_handed_out() -> None:
    hosts, planes = (0, 2, 3), 4
    for base in free_bases(3, hosts, planes):
        for port in _udp_ports(base, hosts, planes):
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as sock:
                sock.bind(("::1", port))
        for h in hosts:
            with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
                sock.bind(("::1", isolation.control_port(base, h)))


def test_a_tcp_port_is_free_and_not_one_the_kernel_hands_to_clients() -> None:
    port = free_tcp_port()
    assert isolation.LOWEST_BASE <= port < isolation._ephemeral_low()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
