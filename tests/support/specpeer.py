"""An OCP MRC 1.0 endpoint that knows nothing of mrcstack's code: a test's spec-only peer.

It is built on the Scapy layers of ``mrcstack/wire/scapy_layers.py`` alone, loaded from that
file (which imports nothing of mrcstack), and Scapy's RoCEv2 BTH, which computes the ICRC.
Nothing of ``mrcstack.wire`` or ``mrcstack.core`` is imported: it is a second, independent
implementation of the packets, the way a NIC that speaks only the specification would send
them.  Run it in a host's namespace instead of mrcd, one QP, with a JSON configuration::

    python tests/support/specpeer.py '{"qpn": 4660, "psn": 100, "mtu": 8192, ...}'

It answers RDMA writes into its buffer with a SACK per packet (a NACK for a trimmed one),
sends writes of its own and retransmits what its peer's SACKs and NACKs say is missing (or
what stays unacknowledged for a while, on another EV), answers EV probes at QP 2 and
reliability probes.  Every packet's EV is striped over the UDP source port (``EV[31:16]``)
and the flow label (``EV[15:0]``); the outer destination is the path's (uSID) or the peer's
address (STEV), given per EV in the configuration.  It reads commands as JSON lines on stdin
and says what happened as JSON lines on stdout.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import random
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from scapy.contrib.roce import BTH
from scapy.layers.inet import UDP
from scapy.layers.inet6 import IPv6
from scapy.packet import Raw


def _load_layers() -> Any:
    path = Path(__file__).resolve().parents[2] / "mrcstack" / "wire" / "scapy_layers.py"
    spec = importlib.util.spec_from_file_location("mrc_scapy_layers", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


L = _load_layers()
PORT = 4791
ENDPOINT_QPN = 2
PSN_MOD = 1 << 24
TC_DATA, TC_CONTROL = 4 << 2 | 2, 46 << 2 | 2  # DSCP 4 and 46, ECT(0)
DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP = 12, 16
IPV6_RECVPKTINFO, IPV6_PKTINFO, IPV6_FLOWINFO, IPV6_RECVTCLASS, IPV6_TCLASS = 49, 50, 11, 66, 67
UDP_NO_CHECK6_TX, UDP_NO_CHECK6_RX = 101, 102
WINDOW = 256  # packets in flight
# Bounds of the time before an unacknowledged packet is sent again, on another EV.
RTO_MIN, RTO_MAX = 0.25, 4.0


def ts16() -> int:
    return (time.monotonic_ns() >> 10) & 0xFFFF


def psn_after(a: int, b: int) -> bool:
    """a comes after b in the 24-bit PSN circle."""
    return 0 < (a - b) % PSN_MOD < PSN_MOD // 2


def icrc(src: str, dst: str, sport: int, body: bytes) -> bytes:
    """The RoCEv2 ICRC of ``body`` (BTH onwards, no trailer) as it arrives, Scapy's."""
    pkt = IPv6(src=src, dst=dst, nh=17) / UDP(sport=sport, dport=PORT, chksum=0)
    pkt = pkt / BTH(body[:12] + bytes(4))
    pkt[BTH].remove_payload()
    pkt[BTH].add_payload(Raw(body[12:]))
    pkt[BTH].icrc = None
    return bytes(pkt)[-4:]


def say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


class Peer:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.qpn, self.mtu = cfg["qpn"], cfg["mtu"]
        self.next_psn = cfg["psn"]
        buf = cfg["buffer"]
        self.buf_va, self.rkey, self.buf = buf["va"], buf["rkey"], bytearray(buf["size"])
        self.planes = cfg["planes"]  # [{plane, local, peer, device, routes: [{ev, dst}]}]
        self.remote_qpn = 0
        self.expected = 0  # the next PSN in order from the peer
        self.received: set[int] = set()  # PSNs beyond ``expected`` that arrived
        self.rcvd_bytes = 0
        self.imms: list[tuple[int, int]] = []  # (PSN, immediate) of writes not yet whole
        self.stats = {"icrc_bad": 0, "sacks": 0, "nacks_sent": 0, "retransmits": 0,
                      "probes_answered": 0, "writes_in": 0, "placed": 0, "refused": 0,
                      "rx": 0, "nacks_in": 0, "bad": 0, "sacks_in": 0, "rtx_nack": 0,
                      "rtx_rto": 0}  # fmt: skip
        self.lock = threading.Lock()
        self.acked: set[int] = set()  # PSNs of ours a SACK's bitmap acknowledged
        self.cack = (self.next_psn - 1) % PSN_MOD  # the highest cumulative PSN acknowledged
        self.nacked: list[int] = []
        self.by_local = {p["local"]: p for p in self.planes}
        self.rr = 0
        self.bad_evs: dict[int, float] = {}

    def bind(self) -> None:
        """Open the receiving socket and a raw sending socket per plane's device."""
        self.rx = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.rx.setsockopt(socket.IPPROTO_UDP, UDP_NO_CHECK6_RX, 1)
        self.rx.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVPKTINFO, 1)
        self.rx.setsockopt(socket.IPPROTO_IPV6, IPV6_FLOWINFO, 1)
        self.rx.setsockopt(socket.IPPROTO_IPV6, IPV6_RECVTCLASS, 1)
        self.rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 24)
        self.rx.bind(("::", PORT))
        self.tx: dict[int, socket.socket] = {}
        for p in self.planes:
            raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, p["device"].encode())
            self.tx[p["plane"]] = raw

    # Sending -------------------------------------------------------------------------------
    def route(self, plane: int | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
        """The next (plane, route) round robin, skipping EVs that timed out lately."""
        now = time.monotonic()
        choices = [(p, r) for p in self.planes for r in p["routes"]
                   if (plane is None or p["plane"] == plane)
                   and self.bad_evs.get(r["ev"], 0) < now]  # fmt: skip
        if not choices:
            choices = [(p, r) for p in self.planes for r in p["routes"]]
        self.rr += 1
        return choices[self.rr % len(choices)]

    def send(self, mrc: Any, tclass: int, plane: int | None = None) -> int:
        """``mrc`` (BTH and the rest) to the peer along the next EV; returns the EV."""
        p, r = self.route(plane)
        ev = r["ev"]
        sport, label = ev >> 16 & 0xFFFF, ev & 0xFFFF
        # The ICRC covers the addresses as the packet arrives: the peer's own.
        pkt = (
            IPv6(src=p["local"], dst=p["peer"], tc=tclass, fl=label, hlim=64)
            / UDP(sport=sport, dport=PORT, chksum=0)
            / mrc
        )
        wire = bytearray(bytes(pkt))
        wire[24:40] = socket.inet_pton(socket.AF_INET6, r["dst"])
        self.tx[p["plane"]].sendto(bytes(wire), (r["dst"], 0))
        return ev

    def bth(self, opcode: int, qpn: int, psn: int, resv7: int = 0) -> Any:
        return BTH(opcode=opcode, pkey=0xFFFF, dqpn=qpn, psn=psn, resv7=resv7)

    def write_packets(self, va: int, rkey: int, data: bytes, msn: int, imm: int | None) -> list:
        """The packets of one write: a RETH on each, the whole length in every DMA length."""
        out = []
        chunks = [data[i : i + self.mtu] for i in range(0, len(data), self.mtu)] or [b""]
        for i, chunk in enumerate(chunks):
            first, last = i == 0, i == len(chunks) - 1
            if first and last:
                op = 0xCA if imm is None else 0xCB
            elif first:
                op = 0xC6
            elif last:
                op = 0xC8 if imm is None else 0xC9
            else:
                op = 0xC7
            psn = self.next_psn
            self.next_psn = (self.next_psn + 1) % PSN_MOD
            out.append((psn, op, va + i * self.mtu, chunk, last and imm))
        return [(psn, (op, pva, rkey, len(data), msn, chunk, im)) for psn, op, pva, chunk, im
                in out]  # fmt: skip

    def build_write(self, psn: int, spec: tuple, rtx: bool) -> Any:
        op, va, rkey, dmalen, msn, chunk, imm = spec
        pkt = self.bth(op, self.remote_qpn, psn, L.RESV7_TS | (L.RESV7_RTX if rtx else 0))
        pkt = pkt / L.METH(msn=msn & 0xFFFF) / L.TSETH(tx_timestamp=ts16())
        pkt = pkt / L.RETH(va=va, rkey=rkey, dmalen=dmalen)
        if op in L.WRITES_WITH_IMM:
            pkt = pkt / L.ImmDt(imm=imm)
        return pkt / Raw(chunk)

    def run_writes(self, va: int, rkey: int, size: int, count: int, seed: int, imm: int) -> None:
        """``count`` writes of ``size`` bytes of a seeded pattern to the peer's region; the
        last with an immediate.  Reports the SHA-256 of what it sent."""
        data = random.Random(seed).randbytes(size * count)
        pending: dict[int, tuple] = {}
        order: list[int] = []
        for n in range(count):
            last = n == count - 1
            for psn, spec in self.write_packets(va + n * size, rkey, data[n * size:(n + 1) * size],
                                                n, imm if last else None):  # fmt: skip
                pending[psn] = spec
                order.append(psn)
        # Loss recovery as a reasonable sender does it.  This process is CPU-bound (Scapy
        # builds and parses every packet) and its SACKs are read by another thread, so the
        # time until a SACK is *read* grows with the backlog of SACKs not yet read.  A fixed
        # timeout shorter than that backlog makes every packet time out, each resend draws
        # one more SACK to read, and the backlog never drains: a metastable collapse (once
        # 27,285 resends and 208 s for 2048 packets).  So the timeout follows the measured
        # time to a SACK, as TCP's does (RFC 6298 with Linux's floor on the variation:
        # SRTT + max(0.25 s, 4 RTTVAR); Karn's rule: no sample from a resent packet), and
        # doubles on each expiry until a packet sent once is acknowledged.
        sent_at: dict[int, tuple[float, int, bool]] = {}  # psn: (when, EV, resent)
        srtt, rttvar, backoff, backoff_at = 0.0, 0.0, 0, 0.0
        rto = RTO_MIN
        nxt = una = 0
        start = tick = time.monotonic()
        timeline: list[list[float]] = []  # what the sender did, for a failing test to show
        while pending:
            now = time.monotonic()
            if now - tick >= 0.5:
                tick = now
                timeline.append([round(now - start, 2), una, nxt, len(sent_at),
                                 self.stats["rtx_nack"], self.stats["rtx_rto"],
                                 self.stats["sacks_in"], round(rto, 3)])  # fmt: skip
            with self.lock:
                acked, self.acked = self.acked, set()
                nacked, self.nacked = self.nacked, []
                cack = self.cack
            while una < nxt and not psn_after(order[una], cack):
                acked.add(order[una])
                una += 1
            for psn in acked:
                if pending.pop(psn, None) is None:
                    continue
                when, _, resent = sent_at.pop(psn, (0.0, 0, True))
                if not resent:  # an unambiguous sample
                    sample = now - when
                    if srtt == 0.0:
                        srtt, rttvar = sample, sample / 2
                    else:
                        rttvar = 0.75 * rttvar + 0.25 * abs(srtt - sample)
                        srtt = 0.875 * srtt + 0.125 * sample
                    backoff = 0
            rto = min(RTO_MAX, (srtt + max(RTO_MIN, 4 * rttvar)) * (1 << backoff))
            for psn in nacked:
                if psn in pending:
                    self.stats["retransmits"] += 1
                    self.stats["rtx_nack"] += 1
                    ev = self.send(self.build_write(psn, pending[psn], True), TC_DATA)
                    sent_at[psn] = (time.monotonic(), ev, True)
            now = time.monotonic()
            expired = [psn for psn, (when, _, _) in sent_at.items() if now - when > rto]
            for psn in expired:
                self.bad_evs[sent_at[psn][1]] = now + 1.0
                self.stats["retransmits"] += 1
                self.stats["rtx_rto"] += 1
                ev = self.send(self.build_write(psn, pending[psn], True), TC_DATA)
                sent_at[psn] = (time.monotonic(), ev, True)
            if expired and now >= backoff_at:  # once per timeout period, not per packet
                backoff = min(backoff + 1, 6)
                backoff_at = now + rto
            while nxt < len(order) and len(sent_at) < WINDOW:
                psn = order[nxt]
                nxt += 1
                if psn in pending:
                    ev = self.send(self.build_write(psn, pending[psn], False), TC_DATA)
                    sent_at[psn] = (time.monotonic(), ev, False)
            if time.monotonic() - start > 300:
                say(event="error", error=f"{len(pending)} packets never acknowledged",
                    stats=self.stats, timeline=timeline)  # fmt: skip
                return
            time.sleep(0.0005 if len(sent_at) >= WINDOW or nxt >= len(order) else 0)
        say(
            event="writes_done",
            sha256=hashlib.sha256(data).hexdigest(),
            bytes=len(data),
            packets=len(order),
            retransmits=self.stats["retransmits"],
            seconds=round(time.monotonic() - start, 3),
            stats=self.stats,
            timeline=timeline,
        )

    # Receiving -----------------------------------------------------------------------------
    def receive_loop(self) -> None:
        while True:
            try:
                data, anc, _, src = self.rx.recvmsg(1 << 16, 256)
            except OSError:
                return
            dst, tclass, flow = "", 0, 0
            for level, kind, value in anc:
                if level == socket.IPPROTO_IPV6 and kind == IPV6_PKTINFO:
                    dst = socket.inet_ntop(socket.AF_INET6, value[:16])
                elif level == socket.IPPROTO_IPV6 and kind == IPV6_TCLASS:
                    tclass = int.from_bytes(value[:4], sys.byteorder)
                elif level == socket.IPPROTO_IPV6 and kind == IPV6_FLOWINFO:
                    flow = int.from_bytes(value[:4], "big")
            try:
                self.handle(data, src, dst, tclass, flow)
            except Exception as exc:  # a packet we cannot read: counted, never fatal
                self.stats["bad"] += 1
                say(event="bad_packet", error=repr(exc))

    def handle(self, data: bytes, src: tuple, dst: str, tclass: int, flow: int) -> None:
        self.stats["rx"] += 1
        sport = src[1]
        label = flow & 0xFFFFF
        ev = sport << 16 | (label & 0xFFFF)
        dscp = tclass >> 2
        pkt = IPv6(src=src[0], dst=dst, nh=17) / UDP(sport=sport, dport=PORT, chksum=0) / Raw(data)
        pkt = IPv6(bytes(pkt))
        bth = pkt[BTH]
        trimmed = bth.opcode in L.WRITES and dscp in (DSCP_TRIMMED, DSCP_TRIMMED_LASTHOP)
        if not trimmed and icrc(src[0], dst, sport, data[:-4]) != data[-4:]:
            self.stats["icrc_bad"] += 1  # the ICRC as the specification computes it
            return
        plane = self.by_local.get(dst, self.planes[0])["plane"]
        if bth.opcode in L.WRITES:
            self.on_write(pkt, bth, ev, plane, dscp if trimmed else 0)
        elif bth.opcode == 0xDC:
            seth = pkt[L.SETH]
            self.on_sack(seth.cack_psn, seth.sack_offset, seth.sack_bitmap)
        elif bth.opcode == 0xDD:
            self.stats["nacks_in"] += 1
            with self.lock:
                self.nacked.append(pkt[L.NETH].nack_psn)
        elif bth.opcode == 0xD8 and bth.dqpn == ENDPOINT_QPN:
            erth = pkt[L.ERTH]
            if erth.op == 1:  # EV_PROBE: answered at the prober's endpoint, same probe id
                reply = self.bth(0xD9, ENDPOINT_QPN, bth.psn & 0xFFFF) / L.EETH(
                    op=1, tx_timestamp=erth.tx_timestamp
                )
                self.send(reply, TC_CONTROL, plane)
                self.stats["probes_answered"] += 1
        elif bth.opcode == 0xDE:  # a reliability probe: our state now, pr set
            ts = pkt[L.PETH].tx_timestamp
            self.sack(ev, self.expected_minus_one(), ts, plane, pr=True)

    def on_sack(self, cack: int, sack_offset: int, bitmap: int) -> None:
        """A SACK for our writes: everything up to ``cack``, and the bitmap's PSNs from
        ``cack + sack_offset`` on."""
        self.stats["sacks_in"] += 1
        base = (cack + sack_offset) % PSN_MOD
        with self.lock:
            if psn_after(cack, self.cack):
                self.cack = cack
            for i in range(64):
                if bitmap >> i & 1:
                    self.acked.add((base + i) % PSN_MOD)

    def expected_minus_one(self) -> int:
        return (self.expected - 1) % PSN_MOD

    def on_write(self, pkt: Any, bth: Any, ev: int, plane: int, trimmed_dscp: int) -> None:
        psn = bth.psn
        ts = pkt[L.TSETH].tx_timestamp if pkt.haslayer(L.TSETH) else 0
        if trimmed_dscp:
            reason = 2 if trimmed_dscp == DSCP_TRIMMED_LASTHOP else 1
            nack = self.bth(0xDD, self.remote_qpn, psn) / L.NETH(
                nack_reason=reason, entropy=ev, spdcid=self.qpn & 0xFFFF,
                dpdcid=self.remote_qpn & 0xFFFF, nack_psn=psn, tx_timestamp=ts,
            )  # fmt: skip
            self.send(nack, TC_CONTROL, plane)
            self.stats["nacks_sent"] += 1
            return
        self.stats["writes_in"] += 1
        reth = pkt[L.RETH]
        payload = bytes(pkt[L.ImmDt].payload if pkt.haslayer(L.ImmDt) else reth.payload)
        new = psn == self.expected or (psn_after(psn, self.expected) and psn not in self.received)
        if new:
            at = reth.va - self.buf_va
            if reth.rkey != self.rkey or at < 0 or at + len(payload) > len(self.buf):
                self.stats["refused"] += 1
                return
            self.buf[at : at + len(payload)] = payload
            self.stats["placed"] += len(payload)
            self.rcvd_bytes += len(payload)
            if pkt.haslayer(L.ImmDt):
                self.imms.append((psn, pkt[L.ImmDt].imm))
            if psn == self.expected:
                self.expected = (self.expected + 1) % PSN_MOD
                while self.expected in self.received:
                    self.received.discard(self.expected)
                    self.expected = (self.expected + 1) % PSN_MOD
            else:
                self.received.add(psn)
        for imm_psn, imm in list(self.imms):
            if psn_after(self.expected, imm_psn):
                self.imms.remove((imm_psn, imm))
                say(event="imm", imm=imm, bytes=self.rcvd_bytes)
        self.sack(ev, psn, ts, plane)

    def sack(self, ev: int, psn: int, ts: int, plane: int, pr: bool = False) -> None:
        cack = self.expected_minus_one()
        base = (cack + 1) % PSN_MOD
        bitmap = 0
        for i in range(64):
            if (base + i) % PSN_MOD in self.received:
                bitmap |= 1 << i
        offset = (psn - cack) % PSN_MOD
        if offset >= PSN_MOD // 2:
            offset -= PSN_MOD
        offset = max(-(1 << 15), min((1 << 15) - 1, offset))
        sack = self.bth(0xDC, self.remote_qpn, cack) / L.SETH(
            pr=int(pr), ack_psn_offset=offset, entropy=ev, spdcid=self.qpn & 0xFFFF,
            dpdcid=self.remote_qpn & 0xFFFF, cack_psn=cack, mpr=64, sack_offset=1,
            sack_bitmap=bitmap,
        ) / L.CC_STATE(tx_timestamp=ts, ooo_count=min(len(self.received), 0x7FFF),
                       rcvd_bytes=(self.rcvd_bytes + 255) // 256 % (1 << 24))  # fmt: skip
        self.send(sack, TC_CONTROL, plane)
        self.stats["sacks"] += 1


def main() -> int:
    peer = Peer(json.loads(sys.argv[1]))
    peer.bind()
    threading.Thread(target=peer.receive_loop, daemon=True).start()
    say(event="ready", qpn=peer.qpn, psn=peer.next_psn)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["cmd"] == "connect":
            peer.remote_qpn = cmd["remote_qpn"]
            peer.expected = cmd["remote_psn"]
            say(event="connected")
        elif cmd["cmd"] == "write":
            peer.run_writes(cmd["va"], cmd["rkey"], cmd["size"], cmd["count"], cmd["seed"],
                            cmd["imm"])  # fmt: skip
        elif cmd["cmd"] == "sha256":
            region = peer.buf[cmd["offset"] : cmd["offset"] + cmd["length"]]
            say(event="sha256", sha256=hashlib.sha256(region).hexdigest(), stats=peer.stats)
        elif cmd["cmd"] == "quit":
            say(event="stats", stats=peer.stats)
            return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
