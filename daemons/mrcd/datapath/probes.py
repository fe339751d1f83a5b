"""Connectionless EV probes (the controller API's EV_PROBE): MRC probe packets on QPN 0.

A probe tests one path to a peer's mrcd without a QP: it goes to the path's uSID address,
the peer answers along the reverse path through the same T1 with a probe reply carrying its
port bitmap, and the RTT is the probe's own timestamp echoed back.  Probes carry no data and
touch no memory, so they are checked by CRC only; everything else that arrives for QPN 0 is
rejected and counted by reason (the decode reason, or ``probe_source`` for a probe from an
address that is no host's NIC on that plane, ``probe_unexpected`` for a well-formed packet
that is neither a probe nor a reply).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from mrcstack.daemons.mrcd.datapath.transport import PROBE_QPN, Address
from mrcstack.wire import (
    CrcIntegrity,
    DecodeError,
    ProbePacket,
    ProbeReplyPacket,
    decode,
    encode,
)

_CRC = CrcIntegrity()
#: Rejection reasons of this module besides the decode reasons (bounded: a fixed set).
PROBE_SOURCE = "probe_source"
PROBE_UNEXPECTED = "probe_unexpected"

#: (remote host, plane, EV) -> the path's destination address.
Resolver = Callable[[int, int, int], Address]
#: (source address, plane) -> the host that sent it, or None.
HostOf = Callable[[Address, int], int | None]
#: (plane, datagram, destination) -> False if the port refused it.
Sender = Callable[[int, bytes, Address], bool]


class Prober:
    """Sends EV probes, answers the peers' probes and matches the replies."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        resolve: Resolver,
        host_of: HostOf,
        send: Sender,
        port_bits: Callable[[], int],
    ) -> None:
        self.loop = loop
        self.resolve = resolve
        self.host_of = host_of
        self.send = send
        self.port_bits = port_bits
        #: Datagrams for QPN 0 rejected, by reason (the node adds them to its rejections).
        self.rejected: dict[str, int] = {}
        self._waiting: dict[tuple[int, int], asyncio.Future[float]] = {}
        self._seq = 0

    async def probe(self, plane: int, ev: int, dst: Address, timeout: float) -> float:
        """Send one probe on ``plane`` along ``ev`` to ``dst``; the RTT in seconds.

        Raises TimeoutError if nothing comes back (the path, or the peer, is down)."""
        self._seq += 1
        ts_ns = time.monotonic_ns()
        pkt = ProbePacket(PROBE_QPN, ev, plane, self._seq, ts_ns)
        fut: asyncio.Future[float] = self.loop.create_future()
        self._waiting[(ev, ts_ns)] = fut
        try:
            if not self.send(plane, encode(pkt, _CRC), dst):
                raise TimeoutError(f"plane {plane} refused the probe")
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._waiting.pop((ev, ts_ns), None)

    def on_datagram(self, data: memoryview, source: Address, plane: int) -> None:
        """A datagram for QPN 0 (the transport's connectionless hook).  Never raises."""
        try:
            pkt = decode(data, _CRC)
        except DecodeError as exc:
            self._reject(exc.reason.value)
            return
        if type(pkt) is ProbePacket:
            prober = self.host_of(source, plane)
            if prober is None:
                self._reject(PROBE_SOURCE)
                return
            reply = ProbeReplyPacket(
                PROBE_QPN, pkt.ev, plane, pkt.tx_seq, pkt.ev, pkt.ts_ns, self.port_bits()
            )
            try:
                dst = self.resolve(prober, plane, pkt.ev)
            except ValueError:
                self._reject(PROBE_SOURCE)  # an EV that is no path from here to the prober
                return
            self.send(plane, encode(reply, _CRC), dst)
        elif type(pkt) is ProbeReplyPacket:
            fut = self._waiting.get((pkt.echo_ev, pkt.echo_ts_ns))
            if fut is not None and not fut.done():  # else: late, after its probe timed out
                fut.set_result((time.monotonic_ns() - pkt.echo_ts_ns) / 1e9)
        else:
            self._reject(PROBE_UNEXPECTED)

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
