"""Link probes on the fabric: a socket per plane, sealed probes out, sealed loops back.

A probe is an MRC EV probe packet (QPN 0, ERTH EV_PROBE) whose EV field names the loop and
whose port field its plane, sent in the control class (DSCP 46) to the loop's uSID address
and the probe port; the switches bring it back to the same socket.  It is sealed with
AES-GCM under a key drawn at start that only this mrcd holds, so nobody else can make a
probe it accepts, and each comes back once: a reply that does not open (forged), that is
on another plane or loop than the one it was sent for, or whose sequence number was
already answered (replayed), is refused and counted by reason.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Callable, Sequence

from mrcstack import addrplan
from mrcstack.daemons.mrcd.config import MapperAgentConfig
from mrcstack.daemons.mrcd.datapath.transport import Address, open_plane_socket
from mrcstack.fabric import Fabric
from mrcstack.mapper.agent import Probe, ProbeAgent, Reply
from mrcstack.wire import (
    ENDPOINT_QPN,
    TCLASS_CONTROL,
    AeadIntegrity,
    DecodeError,
    ProbePacket,
    WireUsageError,
    decode,
    encode,
)

#: Why a datagram on a probe socket was refused (bounded: these and Reply's values).
FORGED = "link_probe_forged"  # does not open with our key, or is no probe
REASONS = (FORGED, *(f"link_probe_{r.value}" for r in Reply if r is not Reply.OK))
MISROUTED = f"link_probe_{Reply.MISROUTED.value}"  # opened, but another plane's or loop's
#: Datagrams read per socket per call (the probes of a round come back within it).
READ_BATCH = 256
#: Loopback data mode: probe sockets on ::1 at probe_port + host * PORT_STRIDE + plane.
PORT_STRIDE = 16
_KEY_BYTES = 32


class LinkProbes:
    """The probe sockets of one host and the seal that only they can open."""

    def __init__(
        self,
        fabric: Fabric,
        host: int,
        cfg: MapperAgentConfig,
        *,
        loopback: bool,
        devices: Sequence[str | None] = (),
        clock: Callable[[], int],
    ) -> None:
        key = os.urandom(_KEY_BYTES)
        self._seal = AeadIntegrity(key, 1, 2)
        self._open = AeadIntegrity(key, 2, 1)
        self.fabric = fabric
        self.host = host
        self.loopback = loopback
        self.port = cfg.probe_port
        self.clock = clock
        #: Refused datagrams, by reason; probes the kernel would not send.
        self.refused: dict[str, int] = {}
        self.send_errors = 0
        self._owned: dict[int, dict[int, int]] = {}  # id(agent) -> its loops' planes
        self.sockets: list[socket.socket] = []
        try:
            for plane in range(fabric.planes):
                device = devices[plane] if plane < len(devices) else None
                sock = open_plane_socket(self.address(plane), device=device)
                self.sockets.append(sock)
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_TCLASS, TCLASS_CONTROL)
        except OSError:
            self.close()
            raise

    def address(self, plane: int) -> Address:
        """Where plane ``plane``'s probe socket listens."""
        if self.loopback:
            return ("::1", self.port + self.host * PORT_STRIDE + plane)
        return (str(addrplan.nic_sid(self.fabric, plane, self.host)), self.port)

    def send(self, probes: Sequence[Probe]) -> int:
        """Seal and send one round; how many the kernel took."""
        sent = 0
        for probe in probes:
            path = probe.path
            pkt = ProbePacket(
                ENDPOINT_QPN, path.ident, path.plane, probe.seq, self.clock(),
                probe_id=probe.seq & 0xFFFF,
            )  # fmt: skip
            try:
                data = encode(pkt, self._seal)
            except WireUsageError:
                continue  # a sequence number reused: cannot happen, never crash on it
            dst = self.address(path.plane) if self.loopback else (str(path.address), self.port)
            try:
                self.sockets[path.plane].sendto(data, dst)
                sent += 1
            except OSError:
                self.send_errors += 1
        return sent

    def drain(self, agent: ProbeAgent, now: float, only: int | None = None) -> int:
        """Read every socket (or plane ``only``'s) dry: each probe back to ``agent``, the
        rest refused; how many came back."""
        back = 0
        owned = self._owned.get(id(agent))
        if owned is None:
            owned = self._owned[id(agent)] = {p.ident: p.plane for p in agent.paths}
        chosen = enumerate(self.sockets) if only is None else ((only, self.sockets[only]),)
        for plane, sock in chosen:
            for _ in range(READ_BATCH):
                try:
                    data = sock.recv(2048)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError:
                    continue  # an ICMP error queued on the socket: read on
                try:
                    pkt = decode(data, self._open)
                except DecodeError:
                    self._refuse(FORGED)
                    continue
                if type(pkt) is not ProbePacket:
                    self._refuse(FORGED)
                    continue
                if pkt.port != plane or owned.get(pkt.ev) != plane:
                    self._refuse(MISROUTED)
                    continue
                reply = agent.delivered(pkt.tx_seq, now, pkt.ev)
                if reply is Reply.OK:
                    back += 1
                else:
                    self._refuse(f"link_probe_{reply.value}")
        return back

    def _refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def filenos(self) -> list[int]:
        return [s.fileno() for s in self.sockets]

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        self.sockets.clear()
