"""The host's endpoint (QP 2): EV probes, their answers and port status updates.

OCP MRC 1.0 sends endpoint operations to QP 2 with a probe id in the PSN.  The node's own
probes (the controller API's EV_PROBE, the peer watch's confirmations) test one path to a
peer without a QP: the probe goes to the path's uSID address, the peer's endpoint answers
with the probe id and the probe's timestamp echoed, and the RTT is that timestamp's age.
The same endpoint answers every probe that arrives, a QP's as well (the transport gives an
answer to one of our QPs' probes to that QP, by its probe id, and the rest to this module).

A peer that runs mrcd sends and gets them with mrcstack's extension (its XETH/XFETH): sealed
with the key the control channel's credentials give the pair of hosts
(:meth:`Credentials.probe_key`) when there is one, the answer then carrying our port bitmap;
otherwise with the ICRC, the answer without the bitmap (a QP's own EV probes are these).  A
peer without mrcstack (no key, no extension) gets the specification's encoding, with the
ICRC.  Every answer is counted in :attr:`Prober.answers` by how its probe was authenticated
(:class:`ProbeAuth`).  Each source may send ``PROBE_RATE`` probes a second (bursts of
``PROBE_BURST``).  Everything refused is counted by reason: the decode reason,
``probe_source`` (no host's NIC on that plane), ``probe_rate`` (over its rate),
``probe_unexpected`` (a well-formed packet that is neither a probe nor an answer nor a port
status update), ``port_status_unauthenticated`` (a port status update not sealed by a host
we share a key with: not applied).

With data-path workers, each worker has a prober of its own that answers the EV probes with
the ICRC it receives (the bulk: a QP's) and relays everything else to the daemon's
(:attr:`Prober.relay`); the daemon adds the workers' counts to its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from enum import StrEnum

from mrcstack import addrplan
from mrcstack.core.endpoint import ProbeIds
from mrcstack.core.plainrx import widen
from mrcstack.daemons.mrcd.datapath.transport import PROBE_QPN, Address
from mrcstack.wire import (
    AeadIntegrity,
    CrcIntegrity,
    DecodeError,
    IcrcPath,
    Integrity,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    WireUsageError,
    decode,
    decode_plain,
    encode,
    encode_plain,
    ev_from_outer,
    flags_aead_tag,
    has_extension,
)

#: Rejection reasons of this module besides the decode reasons (bounded: a fixed set).
PROBE_SOURCE = "probe_source"
PROBE_UNEXPECTED = "probe_unexpected"
PROBE_RATE_LIMITED = "probe_rate"
PORT_STATUS_UNAUTHENTICATED = "port_status_unauthenticated"
REASONS = (PROBE_SOURCE, PROBE_UNEXPECTED, PROBE_RATE_LIMITED, PORT_STATUS_UNAUTHENTICATED)


class ProbeAuth(StrEnum):
    """How an answered probe proved where it came from (``mrc_probe_answers_total{auth}``)."""

    SEALED = "sealed"  # with the pair's key: answered with our port bitmap
    ICRC = "icrc"  # the ICRC only, from a host we share a key with (a QP's own EV probes)
    ICRC_NO_KEY = "icrc_no_key"  # the ICRC, from a host we share no key with


#: Probes a second one source may send (token bucket), and the burst it may save up: a QP's
#: own EV probes (a few per path that went bad, every RTT) come here too.
PROBE_RATE = 2000.0
PROBE_BURST = 200.0
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
#: host -> each plane's ICRC endpoints with that host (none: the unspecified address).
IcrcPaths = Callable[[int], tuple[IcrcPath, ...]]
#: (datagram, source, plane, flow): where a worker's prober hands what it does not answer.
Relay = Callable[[memoryview, Address, int, int], None]
#: EVs (T1 indices) per plane a port-status update is sent on: two paths, in case one fails.
PORT_STATUS_PATHS = 2


class Prober:
    """Sends EV probes, answers the peers' probes and matches the answers."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        resolve: Resolver,
        host_of: HostOf,
        send: Sender,
        port_bits: Callable[[], int],
        on_port_status: PortStatusHook | None = None,
        icrc_paths: IcrcPaths | None = None,
        relay: Relay | None = None,
    ) -> None:
        self.loop = loop
        #: A data-path worker's prober answers only EV probes with the ICRC and hands
        #: everything else here as it came (the daemon's prober does the rest).
        self.relay = relay
        self.on_port_status = on_port_status
        self._port_ts: dict[int, int] = {}  # host -> timestamp of its newest update applied
        self.resolve = resolve
        self.host_of = host_of
        self.send = send
        self.port_bits = port_bits
        self.icrc_paths = icrc_paths
        #: The host's probe ids (the transport's, shared with its QPs, once it runs).
        self.probe_ids = ProbeIds()
        #: Datagrams for QP 2 rejected, by reason (the node adds them to its rejections).
        self.rejected: dict[str, int] = {}
        #: Probes answered, by how they were authenticated (every one, so always present).
        self.answers: dict[ProbeAuth, int] = dict.fromkeys(ProbeAuth, 0)
        self._waiting: dict[int, tuple[asyncio.Future[float], bool]] = {}  # probe id -> ...
        self._seq = 0  # tx_seq of every probe and reply this daemon seals (never reused)
        self._keys: dict[int, AeadIntegrity] = {}
        self._crcs: dict[tuple[int | None, int | None], CrcIntegrity] = {}  # (host, port) ->
        self._buckets: dict[Address, tuple[float, float]] = {}  # source -> (tokens, when)
        # host_of and resolve are pure functions of the configuration, and slow (address
        # parsing): what they said, kept per (source, plane) and per (host, plane, EV).
        self._hosts: dict[tuple[Address, int], int | None] = {}
        self._dsts: dict[tuple[int, int, int], Address] = {}

    def set_keys(self, local: int, keys: dict[int, bytes]) -> None:
        """The probe key for each peer host we have one for (``local``: our host index)."""
        self._keys = {host: AeadIntegrity(key, local + 1, host + 1) for host, key in keys.items()}

    def _crc(self, host: int | None, peer_port: int | None = None) -> CrcIntegrity:
        """The ICRC with ``host``, over the addresses the packets carry; ``peer_port``: the
        UDP source port its datagram came from (a peer without mrcstack's extension stripes
        its EV there), else its plane socket's."""
        crc = self._crcs.get((host, peer_port))
        if crc is None:
            if len(self._crcs) >= MAX_SOURCES:
                self._crcs.clear()  # (a peer striping many EVs over its source ports)
            paths: tuple[IcrcPath, ...] = ()
            if host is not None and self.icrc_paths is not None:
                paths = tuple(
                    p if peer_port is None else IcrcPath(p.local, p.peer, p.local_port, peer_port)
                    for p in self.icrc_paths(host)
                )
            crc = self._crcs[(host, peer_port)] = CrcIntegrity(paths)
        return crc

    def _seal(self, pkt: Packet, host: int | None, plain: bool = False) -> bytes:
        if plain:
            return encode_plain(pkt, self._crc(host))
        aead = self._keys.get(host) if host is not None else None
        return encode(pkt, aead if aead is not None else self._crc(host))

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
        self,
        plane: int,
        ev: int,
        dst: Address,
        timeout: float,
        host: int | None = None,
        plain: bool = False,
    ) -> float:
        """Send one probe on ``plane`` along ``ev`` to ``dst`` (host ``host``, whose key
        seals it when we have one; ``plain``: a peer without mrcstack's extension); the RTT
        in seconds.

        Raises TimeoutError if nothing comes back (the path, or the peer, is down)."""
        self._seq += 1
        ts_ns = time.monotonic_ns()
        ident = self.probe_ids.allocate(PROBE_QPN)
        pkt = ProbePacket(PROBE_QPN, ev, plane, self._seq, ts_ns, 0, ident)
        fut: asyncio.Future[float] = self.loop.create_future()
        self._waiting[ident] = (fut, plain)
        try:
            if not self.send(plane, self._seal(pkt, host, plain), dst):
                raise TimeoutError(f"plane {plane} refused the probe")
            return await asyncio.wait_for(fut, timeout)
        finally:
            self._waiting.pop(ident, None)
            self.probe_ids.release(ident)

    def on_datagram(self, data: memoryview, source: Address, plane: int, flow: int = 0) -> None:
        """A datagram for QP 2 that is not a QP's (the transport's hook; ``flow``: its traffic
        class and flow label).  Never raises."""
        key = (source, plane)
        try:
            host = self._hosts[key]
        except KeyError:
            if len(self._hosts) >= MAX_SOURCES:
                self._hosts.clear()  # (spoofed sources cannot grow it)
            host = self._hosts[key] = self.host_of(source, plane)
        ext = has_extension(data)
        # Sealed with the pair's key only if its extension flags an AES-GCM tag (a QP's
        # probes carry the ICRC): opened with the one integrity that can pass.
        sealed = ext and flags_aead_tag(data)
        if sealed and self.relay is not None:
            self.relay(data, source, plane, flow)
            return
        aead = self._keys.get(host) if host is not None and sealed else None
        authenticated = aead is not None
        crc = self._crc(host, source[1])
        try:
            if not ext:
                pkt = decode_plain(
                    data, crc, ev=ev_from_outer(source[1], flow), port=plane, tclass=flow >> 20
                )
            else:
                pkt = decode(data, aead if aead is not None else crc)
        except DecodeError as exc:
            self._reject(exc.reason.value)
            return
        if type(pkt) is ProbePacket:
            self._answer(pkt, source, plane, host, authenticated, ext)
        elif self.relay is not None:
            # Decoded here although the daemon decodes it again: what carries the ICRC
            # crosses the channel only if it verifies, so junk for QP 2 stops in the worker
            # (the repeat is an answer to the node's own probes or a port update: rare).
            # What flags a tag goes undecoded: the worker holds no probe keys.
            self.relay(data, source, plane, flow)
        elif type(pkt) is PortStatusPacket:
            self._port_status(pkt, host, authenticated, ext)
        elif type(pkt) is ProbeReplyPacket:
            waiting = self._waiting.get(pkt.probe_id)
            if waiting is not None and not waiting[0].done():  # else: late, after its timeout
                sent = pkt.echo_ts_ns if ext else widen(pkt.echo_ts_ns, time.monotonic())
                waiting[0].set_result(max(0, time.monotonic_ns() - sent) / 1e9)
        else:
            self._reject(PROBE_UNEXPECTED)

    def _port_status(
        self, pkt: PortStatusPacket, host: int | None, authenticated: bool, ext: bool
    ) -> None:
        """A peer's PORT_STATUS_UPDATE: applied once (it comes on several planes and paths),
        only the newest, and only sealed with the pair's key when we have one.  A peer
        without the extension has no key and no full timestamp: its update is applied as
        it comes."""
        if host is None:
            self._reject(PROBE_SOURCE)
            return
        if host in self._keys and not authenticated:
            self._reject(PORT_STATUS_UNAUTHENTICATED)
            return
        if ext:
            if pkt.ts_ns <= self._port_ts.get(host, -1):
                return  # a copy from another plane, or older than one applied
            self._port_ts[host] = pkt.ts_ns
        if self.on_port_status is not None:
            self.on_port_status(host, pkt.port_state)

    def send_port_status(
        self, host: int, bitmap: int, planes: list[int], t1s: int, plain: bool = False
    ) -> int:
        """PORT_STATUS_UPDATE to ``host`` over the fabric: on every plane of ``planes`` (ours
        that are up), along the paths of the first ``PORT_STATUS_PATHS`` T1s; sealed with
        the pair's key when we have one (``plain``: in the specification's encoding, for a
        peer without mrcstack).  How many datagrams the ports took."""
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
                ident = self.probe_ids.allocate(PROBE_QPN)
                self.probe_ids.release(ident)  # (no answer is waited for)
                pkt = PortStatusPacket(PROBE_QPN, bitmap, ev, plane, self._seq, ts_ns, ident)
                try:
                    data = self._seal(pkt, host, plain)
                except WireUsageError:
                    continue
                sent += self.send(plane, data, dst)
        return sent

    def _answer(
        self,
        pkt: ProbePacket,
        source: Address,
        plane: int,
        host: int | None,
        authenticated: bool,
        ext: bool,
    ) -> None:
        if host is None:
            self._reject(PROBE_SOURCE)
            return
        if not self._allow(source):
            self._reject(PROBE_RATE_LIMITED)
            return
        dst = self._dsts.get((host, plane, pkt.ev))
        if dst is None:
            try:
                dst = self.resolve(host, plane, pkt.ev)
            except ValueError:
                self._reject(PROBE_SOURCE)  # an EV that is no path from here to the prober
                return
            if len(self._dsts) >= MAX_SOURCES:
                self._dsts.clear()
            self._dsts[host, plane, pkt.ev] = dst
        self._seq += 1
        bits = 0  # the port bitmap is for hosts that prove who they are
        integrity: Integrity
        if authenticated:
            bits = self.port_bits()
            integrity = self._keys[host]
            auth = ProbeAuth.SEALED
        else:
            integrity = self._crc(host)
            auth = ProbeAuth.ICRC if host in self._keys else ProbeAuth.ICRC_NO_KEY
        reply = ProbeReplyPacket(
            PROBE_QPN, pkt.ev, plane, self._seq, pkt.probe_id, pkt.ts_ns, bits
        )  # fmt: skip
        try:
            data = encode(reply, integrity) if ext else encode_plain(reply, integrity)
        except WireUsageError:
            return  # cannot happen with a fresh tx_seq; never let a probe crash the daemon
        self.answers[auth] += 1
        self.send(plane, data, dst)

    def _reject(self, reason: str) -> None:
        self.rejected[reason] = self.rejected.get(reason, 0) + 1
