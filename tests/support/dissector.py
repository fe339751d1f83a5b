"""Shared by the dissector tests: run tshark with mrcstack's Lua dissector, and what it must
print for a packet the codec encoded (every field the codec wrote)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from mrcstack.wire import (
    AEAD_TAG_FLAG,
    TS_UNIT_NS_SHIFT,
    XETH_LEN,
    XFETH_LEN,
    AcknowledgePacket,
    AckPacket,
    DataFlags,
    DataPacket,
    FeedbackFlags,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    header_length,
    write_opcode,
)
from tests.support import REPO

ROOT = REPO
LUA = ROOT / "wireshark" / "mrc.lua"
TSHARK = shutil.which("tshark")
TSHARK_TIMEOUT_S = 120


def ts16(ns: int) -> int:
    return (ns >> TS_UNIT_NS_SHIFT) & 0xFFFF


def expected(pkt: Packet, wire: bytes, ext: bool = True) -> dict[str, int | str]:
    """tshark field name -> the value the codec put there (``ext``: encoded with mrcstack's
    extension, by ``encode``; else by ``encode_plain``)."""
    aead = ext and len(wire) > 16 and _tag_flag(pkt, wire)
    out: dict[str, int | str] = {  # in every packet: the BTH, the extension or not
        "mrc.bth.destqp": pkt.qpn,
        "mrc.bth.psn": 0,
        "mrc.bth.rtx": 0,
        "mrc.bth.ts": 0,
        "mrc.ext": int(ext and not isinstance(pkt, AcknowledgePacket)),
    }
    if aead:
        out["mrc.aead_tag"] = wire[-16:].hex()
    else:
        out["mrc.icrc"] = int.from_bytes(wire[-4:], "little")
    if ext and not isinstance(pkt, AcknowledgePacket):
        out |= {
            "mrc.xeth.port": pkt.port,
            "mrc.xeth.ev": pkt.ev,
            "mrc.xeth.tx_seq": pkt.tx_seq,
            "mrc.xeth.aead_tag": int(aead),
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
            "mrc.bth.ts": int(ext or pkt.ts_ns >= 0),
            "mrc.meth.msn": pkt.msn,
            "mrc.meth.rq_msn": pkt.rq_msn,
            "mrc.reth.va": pkt.va,
            "mrc.reth.r_key": pkt.rkey,
            "mrc.reth.dmalen": pkt.dma_len if pkt.dma_len >= 0 else len(pkt.payload),
        }
        if out["mrc.bth.ts"]:
            out["mrc.tseth.tx_timestamp"] = ts16(pkt.ts_ns)
        if ext:
            out["mrc.xeth.offset"] = pkt.offset
        if pkt.imm is not None:
            out["mrc.immdt"] = pkt.imm
        if pkt.trimmed:
            out.pop("mrc.icrc", None)  # a switch cut the trailer off with the payload
            out.pop("mrc.aead_tag", None)
        else:
            out["mrc.payload"] = bytes(pkt.payload).hex()
    elif isinstance(pkt, AckPacket) and not pkt.nack_reason:
        out |= {
            "mrc.bth.opcode": 0xDC,
            "mrc.bth.psn": pkt.cum_psn,
            "mrc.bth.rtx": int(bool(pkt.flags & FeedbackFlags.RETX)),
            "mrc.seth.m": pkt.skip,
            "mrc.seth.pr": int(bool(pkt.flags & FeedbackFlags.PROBE_RESPONSE)),
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
    elif isinstance(pkt, AckPacket):  # a NACK: BTH + NETH
        out |= {
            "mrc.bth.opcode": 0xDD,
            "mrc.bth.psn": pkt.echo_psn,
            "mrc.bth.rtx": int(bool(pkt.flags & FeedbackFlags.RETX)),
            "mrc.seth.ecn": int(bool(pkt.flags & FeedbackFlags.ECN_ECHO)),
            "mrc.neth.reason": pkt.nack_reason,
            "mrc.neth.entropy": pkt.echo_ev,
            "mrc.neth.psn": pkt.echo_psn,
            "mrc.neth.tx_timestamp": ts16(pkt.echo_ts_ns),
        }
    elif isinstance(pkt, ProbePacket | PortStatusPacket):  # ERTH: EV probe, port status
        out |= {
            "mrc.bth.opcode": 0xD8,
            "mrc.bth.psn": pkt.probe_id,
            "mrc.ep.probe_id": pkt.probe_id,
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
    elif isinstance(pkt, AcknowledgePacket):
        out |= {
            "mrc.bth.opcode": 0xD1,
            "mrc.bth.psn": pkt.psn,
            "mrc.aeth.syndrome": pkt.syndrome,
            "mrc.aeth.msn": pkt.msn,
        }
    else:
        assert isinstance(pkt, ProbeReplyPacket)
        out |= {
            "mrc.bth.opcode": 0xD9,
            "mrc.bth.psn": pkt.probe_id,
            "mrc.ep.probe_id": pkt.probe_id,
            "mrc.eeth.op": pkt.op,
            "mrc.ep.tx_timestamp": ts16(pkt.echo_ts_ns),
        }
    return out


def _tag_flag(pkt: Packet, wire: bytes) -> bool:
    """Whether the extension's flags byte of an encoded packet has AEAD_TAG_FLAG."""
    hlen = header_length(wire[0])
    ext_len = XFETH_LEN if isinstance(pkt, AckPacket | ProbeReplyPacket) else XETH_LEN
    return bool(wire[hlen - ext_len + 1] & AEAD_TAG_FLAG)


FIELDS = sorted(
    {
        "mrc.bth.opcode", "mrc.bth.destqp", "mrc.bth.psn", "mrc.bth.rtx", "mrc.bth.ts",
        "mrc.meth.msn", "mrc.meth.rq_msn", "mrc.tseth.tx_timestamp", "mrc.reth.va",
        "mrc.reth.r_key", "mrc.reth.dmalen", "mrc.immdt", "mrc.xeth.port", "mrc.xeth.ev",
        "mrc.xeth.tx_seq", "mrc.xeth.ts_ns", "mrc.xeth.offset", "mrc.xeth.trimmed",
        "mrc.xeth.trim_lasthop", "mrc.xeth.aead_tag", "mrc.ext", "mrc.aead_tag",
        "mrc.payload", "mrc.icrc", "mrc.seth.m", "mrc.seth.pr", "mrc.seth.cack_psn",
        "mrc.seth.ack_psn", "mrc.seth.entropy", "mrc.seth.ecn", "mrc.seth.mpr",
        "mrc.seth.sack_base", "mrc.seth.bitmap", "mrc.cc.ts_echo", "mrc.cc.ooo_count",
        "mrc.cc.received_bytes", "mrc.xfeth.msn", "mrc.xfeth.port_state", "mrc.xfeth.duplicate",
        "mrc.neth.reason", "mrc.neth.entropy", "mrc.neth.psn", "mrc.neth.tx_timestamp",
        "mrc.ep.op", "mrc.eeth.op", "mrc.ep.probe_id", "mrc.ep.port_mask",
        "mrc.ep.tx_timestamp", "mrc.peth.probe_id", "mrc.aeth.syndrome", "mrc.aeth.msn",
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
            if one in ("True", "False"):  # a boolean field
                one = str(int(one == "True"))
            got: int | str = one if isinstance(value, str) else int(one, 0) if one else ""
            if got != value:
                bad.append(f"{name}: tshark {one!r}, codec {value!r}")
    return bad
