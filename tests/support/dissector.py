"""Shared by the dissector tests: run tshark with mrcstack's Lua dissector, and what it must
print for a packet the codec encoded (every field the codec wrote)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mrcstack.wire import (
    TS_UNIT_NS_SHIFT,
    AckPacket,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    write_opcode,
)
from tests.support import REPO

ROOT = REPO
LUA = ROOT / "wireshark" / "mrc.lua"
TSHARK = shutil.which("tshark")
TSHARK_TIMEOUT_S = 120


def ts16(ns: int) -> int:
    return (ns >> TS_UNIT_NS_SHIFT) & 0xFFFF


def expected(pkt: Packet, wire: bytes) -> dict[str, int | str]:
    """tshark field name -> the value the codec put there."""
    out: dict[str, int | str] = {  # in every packet: BTH, the extension's EV, tx_seq, port
        "mrc.bth.destqp": pkt.qpn,
        "mrc.bth.psn": 0,
        "mrc.bth.rtx": 0,
        "mrc.bth.ts": 0,
        "mrc.xeth.port": pkt.port,
        "mrc.xeth.ev": pkt.ev,
        "mrc.xeth.tx_seq": pkt.tx_seq,
        "mrc.icrc": int.from_bytes(wire[-4:], "little"),
    }
    if isinstance(pkt, DataPacket | ProbePacket | PortStatusPacket | ReliabilityProbePacket):
        lasthop = isinstance(pkt, DataPacket) and bool(pkt.flags & DataFlags.TRIM_LASTHOP)
        out |= {
            "mrc.xeth.ts_ns": pkt.ts_ns,
            "mrc.xeth.offset": 0,  # (a write's is below)
            "mrc.xeth.trimmed": int(isinstance(pkt, DataPacket) and pkt.trimmed),
            "mrc.xeth.trim_lasthop": int(lasthop),
        }
    else:  # an XFETH
        out |= {
            "mrc.xeth.ts_ns": pkt.echo_ts_ns,
            "mrc.xfeth.port_state": pkt.port_state,
            "mrc.xfeth.duplicate": int(
                isinstance(pkt, AckPacket) and bool(pkt.flags & FeedbackFlags.DUPLICATE)
            ),
            "mrc.xfeth.msn": pkt.msn if isinstance(pkt, AckPacket) else 0,
        }
    if isinstance(pkt, DataPacket):
        out |= {
            "mrc.bth.opcode": write_opcode(pkt.flags, pkt.imm),
            "mrc.bth.psn": pkt.psn,
            "mrc.bth.rtx": int(bool(pkt.flags & DataFlags.RETX)),
            "mrc.bth.ts": 1,
            "mrc.meth.msn": pkt.msn,
            "mrc.meth.rq_msn": 0,
            "mrc.tseth.tx_timestamp": ts16(pkt.ts_ns),
            "mrc.reth.va": pkt.va,
            "mrc.reth.r_key": pkt.rkey,
            "mrc.reth.dmalen": pkt.dma_len if pkt.dma_len >= 0 else len(pkt.payload),
            "mrc.xeth.offset": pkt.offset,
        }
        if pkt.imm is not None:
            out["mrc.immdt"] = pkt.imm
        if pkt.trimmed:
            del out["mrc.icrc"]  # a switch cut it off with the payload
        else:
            out["mrc.payload"] = bytes(pkt.payload).hex()
    elif isinstance(pkt, AckPacket):
        out |= {
            "mrc.bth.opcode": 0xDD if pkt.nack_reason else 0xDC,
            "mrc.bth.psn": pkt.cum_psn,
            "mrc.seth.m": pkt.skip,
            "mrc.seth.cack_psn": pkt.cum_psn,
            "mrc.seth.ack_psn": pkt.echo_psn,
            "mrc.seth.entropy": pkt.echo_ev,
            "mrc.seth.ecn": int(bool(pkt.flags & FeedbackFlags.ECN_ECHO)),
            "mrc.seth.mpr": pkt.window // 128,
            "mrc.seth.sack_base": pkt.sack_base,
            "mrc.seth.bitmap": pkt.sack_bitmap,
            "mrc.cc.ts_echo": ts16(pkt.echo_ts_ns),
            "mrc.cc.ooo_count": pkt.ooo_count,
            "mrc.cc.received_bytes": pkt.rcv_bytes,
        }
        if pkt.nack_reason:
            out |= {
                "mrc.neth.reason": pkt.nack_reason,
                "mrc.neth.entropy": pkt.echo_ev,
                "mrc.neth.psn": pkt.echo_psn,
                "mrc.neth.tx_timestamp": ts16(pkt.echo_ts_ns),
            }
    elif isinstance(pkt, ProbePacket | PortStatusPacket):  # ERTH: EV probe, port status
        out |= {
            "mrc.bth.opcode": 0xD8,
            "mrc.ep.op": int(isinstance(pkt, ProbePacket)),
            "mrc.ep.port_mask": pkt.port_state,
            "mrc.ep.tx_timestamp": ts16(pkt.ts_ns),
        }
    elif isinstance(pkt, ReliabilityProbePacket):
        out |= {
            "mrc.bth.opcode": 0xDE,
            "mrc.peth.probe_id": pkt.probe_id,
            "mrc.ep.tx_timestamp": ts16(pkt.ts_ns),
        }
    else:
        assert isinstance(pkt, ProbeReplyPacket)
        out |= {
            "mrc.bth.opcode": 0xD9,
            "mrc.ep.op": 1,
            "mrc.eeth.entropy": pkt.echo_ev,
            "mrc.ep.port_mask": pkt.port_state,
            "mrc.ep.tx_timestamp": ts16(pkt.echo_ts_ns),
        }
    return out


FIELDS = sorted(
    {
        "mrc.bth.opcode", "mrc.bth.destqp", "mrc.bth.psn", "mrc.bth.rtx", "mrc.bth.ts",
        "mrc.meth.msn", "mrc.meth.rq_msn", "mrc.tseth.tx_timestamp", "mrc.reth.va",
        "mrc.reth.r_key", "mrc.reth.dmalen", "mrc.immdt", "mrc.xeth.port", "mrc.xeth.ev",
        "mrc.xeth.tx_seq", "mrc.xeth.ts_ns", "mrc.xeth.offset", "mrc.xeth.trimmed",
        "mrc.xeth.trim_lasthop",
        "mrc.payload", "mrc.icrc", "mrc.seth.m", "mrc.seth.cack_psn", "mrc.seth.ack_psn",
        "mrc.seth.entropy", "mrc.seth.ecn", "mrc.seth.mpr", "mrc.seth.sack_base",
        "mrc.seth.bitmap", "mrc.cc.ts_echo", "mrc.cc.ooo_count", "mrc.cc.received_bytes",
        "mrc.xfeth.msn", "mrc.xfeth.port_state", "mrc.xfeth.duplicate", "mrc.neth.reason",
        "mrc.neth.entropy", "mrc.neth.psn", "mrc.neth.tx_timestamp", "mrc.ep.op",
        "mrc.ep.port_mask", "mrc.ep.tx_timestamp", "mrc.eeth.entropy", "mrc.peth.probe_id",
    }
)  # fmt: skip


def dissect(pcap: Path, extra: tuple[str, ...] = ()) -> list[dict[str, str]]:
    """tshark's value of every FIELDS entry (and ``extra``, and the UDP payload) per MRC
    packet in ``pcap``."""
    assert TSHARK is not None
    names = ["udp.payload", *extra, *FIELDS]
    cmd = [TSHARK, "-n", "-r", str(pcap), "-X", f"lua_script:{LUA}", "-Y", "mrc"]
    cmd += ["-T", "fields", "-E", "separator=/t"]
    for name in names:
        cmd += ["-e", name]
    out = subprocess.run(
        cmd, capture_output=True, text=True, check=True, timeout=TSHARK_TIMEOUT_S
    ).stdout
    rows = [line.split("\t") for line in out.splitlines() if line.strip()]
    return [dict(zip(names, row, strict=True)) for row in rows]


def mismatches(row: dict[str, str], want: dict[str, int | str]) -> list[str]:
    """Fields whose printed value differs from the codec's (empty when they all agree).

    A field printed twice (NETH and SETH both carry an entropy and cc flags) must agree in
    both places.  Fields the packet does not have must be empty."""
    bad = []
    for name in FIELDS:
        printed = row[name]
        if name not in want:
            if printed:
                bad.append(f"{name}: printed {printed!r}, the packet has no such field")
            continue
        value = want[name]
        for one in printed.split(","):
            got: int | str = one if isinstance(value, str) else int(one, 0) if one else ""
            if got != value:
                bad.append(f"{name}: tshark {one!r}, codec {value!r}")
    return bad
