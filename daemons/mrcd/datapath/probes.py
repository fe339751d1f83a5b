"""Connectionless EV probes (the controller API's EV_PROBE): MRC probe packets on QPN 0.

A probe tests one path to a peer's mrcd without a QP: it goes to the path's uSID address,
the peer answers along the reverse path through the same T1 with a probe reply carrying its
port bitmap, and the RTT is the probe's own timestamp echoed back.

A probe is answered only for a host the daemon has a key for (the control channel's
credentials give one per pair of hosts, :meth:`Credentials.probe_key`): sealed with that key
(AES-GCM), it gets a sealed reply with the port bitmap; with a CRC only, a reply without it
(the bitmap field is 0, counted as ``probe_unauthenticated``).  Each source may send
``PROBE_RATE`` probes a second (bursts of ``PROBE_BURST``).  Everything refused is counted
by reason: the decode reason, ``probe_source`` (no host's NIC on that plane), ``probe_no_key``
(a host we have no key for), ``probe_rate`` (over its rate), ``probe_unexpected`` (a
well-formed packet that is neither a probe nor a reply).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from mrcstack import addrplan
from mrcstack.daemons.mrcd.datapath.transport import PROBE_QPN, Address
from mrcstack.wire import (
    AeadIntegrity,
    CrcIntegrity,
    DecodeError,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    WireUsageError,
    decode,
    encode,
)

_CRC = CrcIntegrity()
#: Rejection reasons of this module besides the decode reasons (bounded: a fixed set).
PROBE_SOURCE = "probe_source"
PROBE_UNEXPECTED = "probe_unexpected"
PROBE_NO_KEY = "probe_no_key"
PROBE_RATE_LIMITED = "probe_rate"
PROBE_UNAUTHENTICATED = "probe_unauthenticated"  # answered, but without the port bitmap
REASONS = (PROBE_SOURCE, PROBE_UNEXPECTED, PROBE_NO_KEY, PROBE_RATE_LIMITED, PROBE_UNAUTHENTICATED)
#: Probes a second one source may send (token bucket), and the burst it may save up.
PROBE_RATE = 200.0
PROBE_BURST = 50.0
#: Sources tracked at once; past this the table starts over (a flood of spoofed sources
#: cannot grow it, and a real prober loses at most one burst).
MAX_SOURCES = 4096

#: (remote host, plane, EV) -> the path's destination address.
Resolver = Callable[[int, int, int], Address]
#: (source address, plane) -> the host that sent it, or None.
HostOf = Callable[[Address, int], int | None]
#: (plane, datagram, destination) -> False if the port refused it.
Sender = Callable[[int, bytes, Address], bool]
#: (host, port bitmap): a peer's PORT_STATUS_UPDATE, authenticated.
PortStatusHook = Callable[[int, int], None]
#: EVs (T1 indices) per plane a port-status update is sent on: two paths, in case one fails.
PORT_STATUS_PATHS = 2


class Prober:
    """Sends EV probes, answers the peers' probes and matches the replies."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        resolve: Resolver,
        host_of: HostOf,
        send: Sender,
        port_bits: Callable[[], int],
        on_port_status: PortStatusHook | None = None,
    ) -> None:
        self.loop = loop
        self.on_port_status = on_port_status
        self._port_ts: dict[int, int] = {}  # host -> timestamp of its newest update applied
        self.resolve = resolve
        self.host_of = host_of
        self.send = send
        self.port_bits = port_bits
        #: Datagrams for QPN 0 rejected, by reason (the node adds them to its rejections).
        self.rejected: dict[str, int] = {}
        self._waiting: dict[tuple[int, int], asyncio.Future[float]] = {}
        self._seq = 0  # tx_seq of every probe and reply this daemon seals (never reused)
        self._keys: dict[int, AeadIntegrity] = {}
        self._buckets: dict[Address, tuple[float, float]] = {}  # source -> (tokens, when)

    def set_keys(self, local: int, keys: dict[int, bytes]) -> None:
        """The probe key for each peer host we have one for (``local``: our host index)."""
        self._keys = {host: AeadIntegrity(key, local + 1, host + 1) for host, key in keys.items()}

    def _seal(
        self, pkt: ProbePacket | ProbeReplyPacket | PortStatusPacket, host: int | None
    ) -> bytes:
        aead = self._keys.get(host) if host is not None else None
        return encode(pkt, aead if aead is not None else _CRC)

    def _allow(self, source: Address) -> bool:
        """The source's token bucket has a probe left."""
        now = time.monotonic()
        tokens, then = self._buckets.get(source, (PROBE_BURST, now))
        tokens = min(PROBE_BURST, tokens + (now - then) * PROBE_RATE)
        if len(self._buckets) >= MAX_SOURCES and source not in self._buckets:
            self._buckets.clear()
        if tokens < 1.0:
            self._buckets[source] = (tokens, now)
            return False
        self._buckets[source] = (tokens - 1.0, now)
        return True

    async def probe(
        self, plane: int, ev: int, dst: Address, timeout: float, host: int | None = None
    ) -> float:
        """Send one probe on ``plane`` along ``ev`` to ``dst`` (host ``host``, whose key
        seals it when we have one); the RTT in seconds.

        Raises TimeoutError if nothing comes back (the path, or the peer, is down)."""
        self._seq += 1
        ts_ns = time.monotonic_ns()
        pkt = ProbePacket(PROBE_QPN, ev, plane, self._seq, ts_ns)
        fut: asyncio.Future[float] = self.loop.create_future()
        self._waiting[(ev, ts_ns)] = fut
        try:
            if not self.send(plane, self._seal(pkt, host), dst):
                raise TimeoutError(f"plane {plane} refused the probe")
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._waiting.pop((ev, ts_ns), None)

    def on_datagram(self, data: memoryview, source: Address, plane: int) -> None:
        """A datagram for QPN 0 (the transport's connectionless hook).  Never raises."""
        host = self.host_of(source, plane)
        aead = self._keys.get(host) if host is not None else None
        authenticated = False
        try:
            if aead is not None:
                try:
                    pkt = decode(data, aead)
                    authenticated = True
                except DecodeError:
                    pkt = decode(data, _CRC)  # not sealed: a CRC-only probe, or garbage
            else:
                pkt = decode(data, _CRC)
        except DecodeError as exc:
            self._reject(exc.reason.value)
            return
        if type(pkt) is ProbePacket:
            self._answer(pkt, source, plane, host, authenticated)
        elif type(pkt) is PortStatusPacket:
            self._port_status(pkt, host, authenticated)
        elif type(pkt) is ProbeReplyPacket:
            fut = self._waiting.get((pkt.echo_ev, pkt.echo_ts_ns))
            if fut is not None and not fut.done():  # else: late, after its probe timed out
                fut.set_result((time.monotonic_ns() - pkt.echo_ts_ns) / 1e9)
        else:
            self._reject(PROBE_UNEXPECTED)

    def _port_status(self, pkt: PortStatusPacket, host: int | None, authenticated: bool) -> None:
        """A peer's PORT_STATUS_UPDATE: applied once (it comes on several planes and paths),
        only the newest, and only sealed with the pair's key when we have one."""
        if host is None:
            self._reject(PROBE_SOURCE)
            return
        if host in self._keys and not authenticated:
            self._reject(PROBE_UNAUTHENTICATED)
            return
        if pkt.ts_ns <= self._port_ts.get(host, -1):
            return  # a copy from another plane, or older than one applied
        self._port_ts[host] = pkt.ts_ns
        if self.on_port_status is not None:
            self.on_port_status(host, pkt.port_state)

    def send_port_status(self, host: int, bitmap: int, planes: list[int], t1s: int) -> int:
        """PORT_STATUS_UPDATE to ``host`` over the fabric: on every plane of ``planes`` (ours
        that are up), along the paths of the first ``PORT_STATUS_PATHS`` T1s; sealed with
        the pair's key when we have one.  How many datagrams the ports took."""
        ts_ns = time.monotonic_ns()  # one update: the peer applies the first copy only
        sent = 0
        for plane in planes:
            for t1 in range(min(PORT_STATUS_PATHS, t1s)):
                ev = addrplan.ev_value(plane, t1)
                try:
                    dst = self.resolve(host, plane, ev)
                except ValueError:
                    continue
                self._seq += 1
                pkt = PortStatusPacket(PROBE_QPN, bitmap, ev, plane, self._seq, ts_ns)
                try:
                    data = self._seal(pkt, host)
                except WireUsageError:
                    continue
                sent += self.send(plane, data, dst)
        return sent

    def _answer(
        self, pkt: ProbePacket, source: Address, plane: int, host: int | None, authenticated: bool
    ) -> None:
        if host is None:
            self._reject(PROBE_SOURCE)
            return
        if host not in self._keys:
            self._reject(PROBE_NO_KEY)
            return
        if not self._allow(source):
            self._reject(PROBE_RATE_LIMITED)
            return
        try:
            dst = self.resolve(host, plane, pkt.ev)
        except ValueError:
            self._reject(PROBE_SOURCE)  # an EV that is no path from here to the prober
            return
        self._seq += 1
        if authenticated:
            bits = self.port_bits()
        else:
            bits = 0  # the port bitmap is for hosts that prove who they are
            self._reject(PROBE_UNAUTHENTICATED)
        reply = ProbeReplyPacket(PROBE_QPN, pkt.ev, plane, self._seq, pkt.ev, pkt.ts_ns, bits)
        try:
            data = self._seal(reply, host if authenticated else None)
        except WireUsageError:
            return  # cannot happen with a fresh tx_seq; never let a probe crash the daemon
        self.send(plane, data, dst)

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
