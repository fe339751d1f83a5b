"""The spec-only peer's own loss recovery (``tests/support/specpeer.py``), on a virtual clock.

The peer parses every packet in Python, so on a busy machine it reads its SACKs more slowly
than it sends.  Here its sender runs against a model of that: a receiver that SACKs every
packet it gets, a reader that takes longer per SACK than the sender per packet, and two of
its eight EVs dark for half a second.  Everything runs on one virtual clock, so the run is
the same every time and takes well under a second.
"""

from __future__ import annotations

import heapq
import json
from typing import Any

import pytest

from tests.support import specpeer

SEND, READ = 0.0012, 0.0025  # seconds the peer spends sending a packet, reading a SACK
DARK = (1.0, 1.5)  # when EVs 0 and 1 lose everything
PACKETS = 2048  # 16 MiB in 8 KiB packets


class Clock:
    """``time`` for the peer: sleeping moves the clock, and reading it delivers the SACKs
    the reader has finished by then."""

    def __init__(self) -> None:
        self.now = 0.0
        self.reader_free = 0.0
        self.sacks: list[tuple[float, int, int]] = []  # (read by, cumulative PSN, PSN)
        self.peer: specpeer.Peer | None = None

    def monotonic(self) -> float:
        while self.sacks and self.sacks[0][0] <= self.now:
            _, cack, psn = heapq.heappop(self.sacks)
            assert self.peer is not None
            self.peer.on_sack(cack, (psn - cack) % specpeer.PSN_MOD, 1)
        return self.now

    def monotonic_ns(self) -> int:
        return int(self.now * 1e9)

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class ModelPeer(specpeer.Peer):
    """The peer, its packets handed to a model receiver instead of a socket."""

    def __init__(self, clock: Clock) -> None:
        routes = [{"ev": ev, "dst": "::1"} for ev in range(8)]
        super().__init__({
            "qpn": 1, "mtu": 8192, "psn": 0xFFFC00, "buffer": {"va": 0, "rkey": 0, "size": 0},
            "planes": [{"plane": 0, "device": "lo", "local": "::1", "peer": "::1",
                        "routes": routes}],
        })  # fmt: skip
        self.clock = clock
        self.expected_in = self.next_psn  # the model receiver's next PSN in order
        self.arrived: set[int] = set()

    def build_write(self, psn: int, spec: tuple, rtx: bool) -> Any:
        return psn

    def send(self, mrc: Any, tclass: int, plane: int | None = None) -> int:
        clock, psn = self.clock, mrc
        _, route = self.route(plane)
        clock.now += SEND
        if route["ev"] < 2 and DARK[0] <= clock.now < DARK[1]:
            return int(route["ev"])
        self.arrived.add(psn)
        while self.expected_in in self.arrived:
            self.expected_in = (self.expected_in + 1) % specpeer.PSN_MOD
        clock.reader_free = max(clock.reader_free, clock.now) + READ
        cack = (self.expected_in - 1) % specpeer.PSN_MOD
        heapq.heappush(clock.sacks, (clock.reader_free, cack, psn))
        return int(route["ev"])


def test_resends_stay_few_when_sacks_are_read_slower_than_packets_are_sent(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = Clock()
    monkeypatch.setattr(specpeer, "time", clock)
    peer = ModelPeer(clock)
    clock.peer = peer
    peer.run_writes(0, 0, 1 << 20, 16, 7, 0xF00D)
    done: dict[str, Any] = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert done["event"] == "writes_done", done
    assert done["packets"] == PACKETS
    # The dark half second loses tens of packets; a timeout that stays below the SACK
    # backlog resends every packet many times over.
    assert done["retransmits"] <= 200, (done["stats"], done["timeline"])
