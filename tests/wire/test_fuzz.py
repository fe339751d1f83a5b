"""Fuzz the decoders: whatever arrives, ``decode`` and ``decode_plain`` return a valid packet
or raise DecodeError.

The acceptance run is 1,000,000 random and mutated datagrams (``MRC_FUZZ_COUNT``, default
1,000,000; it takes well under a minute here because each case mutates a small pre-encoded
packet), a quarter of them in the specification's own encoding (no mrcstack extension, the
EV and a trim's DSCP from the outer header).  ``MRC_FUZZ_SEED`` replays a run.  Inputs that
do decode must re-encode to exactly the same bytes, so the decoders accept only the codecs'
canonical forms.
"""

from __future__ import annotations

import os
import random
import struct
from collections import Counter

from mrcstack.wire import (
    ENDPOINT_QPN,
    MPR_UNIT,
    PSN_MASK,
    SWITCH_FLAGS,
    WRITE_OPCODES,
    AcknowledgePacket,
    AckPacket,
    AeadIntegrity,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    DecodeError,
    DecodeReason,
    Dscp,
    FeedbackFlags,
    Integrity,
    NackReason,
    Opcode,
    Packet,
    PortStatusPacket,
    ProbePacket,
    ProbeReplyPacket,
    ReliabilityProbePacket,
    crc32_header,
    decode,
    decode_plain,
    encode,
    encode_plain,
    encode_trimmed,
    header_length,
    peek_qpn,
    plain_header_length,
    traffic_class,
)
from tests.support.wire import XETH_FLAGS_FROM_END, icrc

FUZZ_COUNT = int(os.environ.get("MRC_FUZZ_COUNT", "1000000"))
FUZZ_SEED = int(os.environ.get("MRC_FUZZ_SEED", "20260522"))
CORPUS_PER_MODE = 48
MAX_FUZZ_PAYLOAD = 96  # small packets keep each mutation cheap
BIG_PAYLOAD = 4096
KEY = bytes(range(16))
OPCODES = [int(op) for op in Opcode]
NACKS = [0, *(int(r) for r in NackReason)]
_F, _L, _R, _A = DataFlags.FIRST, DataFlags.LAST, DataFlags.RETX, DataFlags.ACK_REQ
DATA_FLAGS = [0, _F, _L, _F | _L, _R, _R | _F, _R | _L, _R | _F | _L, _A | _F | _L]
FEEDBACK_FLAGS = [0, FeedbackFlags.ECN_ECHO, FeedbackFlags.DUPLICATE, 3, FeedbackFlags.RETX]
#: Traffic classes a plain datagram arrives in: data, control, and the two trimmed classes.
TCLASSES = [traffic_class(Dscp.DATA), traffic_class(Dscp.CONTROL), 0]
TRIM_TCLASSES = [traffic_class(Dscp.TRIMMED), traffic_class(Dscp.TRIMMED_LASTHOP)]


def random_packet(rng: random.Random, tx_seq: int, plain: bool = False) -> Packet:
    """A valid packet of any type with random fields (``plain``: one the specification's
    encoding carries: no feedback DUPLICATE flag, writes with or without a TSETH)."""
    kind = rng.randrange(5)
    r = rng.getrandbits
    if kind == 0:
        size = BIG_PAYLOAD if rng.random() < 0.05 else rng.randrange(MAX_FUZZ_PAYLOAD)
        flags = rng.choice(DATA_FLAGS)
        offset = 0 if flags & _F else r(20)
        ts = -1 if plain and rng.random() < 0.3 else r(64)
        return DataPacket(
            qpn=r(24), psn=r(24), va=r(64), rkey=r(32), payload=rng.randbytes(size), ev=r(32),
            port=r(8), tx_seq=tx_seq, ts_ns=ts, flags=flags,
            imm=r(32) if flags & DataFlags.LAST and rng.random() < 0.5 else None, msn=r(16),
            offset=offset, dma_len=offset + size + (0 if flags & _L else r(12)),
            rq_msn=r(16) if rng.random() < 0.2 else 0,
        )  # fmt: skip
    if kind == 1:
        cum = r(24)
        reason = rng.choice(NACKS)
        flags = rng.choice(FEEDBACK_FLAGS)
        if plain:
            flags &= ~FeedbackFlags.DUPLICATE
        if not reason and rng.random() < 0.2:
            flags |= FeedbackFlags.PROBE_RESPONSE
        return AckPacket(
            qpn=r(24), cum_psn=cum, msn=r(24), ev=r(32), port=r(8), tx_seq=tx_seq,
            echo_ev=r(32), echo_psn=(cum + rng.randrange(-40000, 40000) % 65536 - 32768) & PSN_MASK,
            echo_ts_ns=r(64), sack_base=(cum + r(16) - 32768) & PSN_MASK,
            sack_bitmap=r(64), port_state=r(16), flags=flags,
            nack_reason=reason, skip=rng.randrange(3), ooo_count=r(15),
            rcv_bytes=r(24), window=rng.randrange(0, 256) * MPR_UNIT, cc_type=r(4), scid=r(16),
        )  # fmt: skip
    if kind == 2 and rng.random() < 0.3:
        return ReliabilityProbePacket(
            qpn=r(24), probe_id=r(16), ev=r(32), port=r(8), tx_seq=tx_seq, ts_ns=r(64),
            scid=r(16),
        )  # fmt: skip
    if kind == 2:
        return ProbePacket(
            qpn=ENDPOINT_QPN, ev=r(32), port=r(8), tx_seq=tx_seq, ts_ns=r(64),
            port_state=r(32), probe_id=r(16),
        )  # fmt: skip
    if kind == 3 and rng.random() < 0.3:
        return PortStatusPacket(
            qpn=ENDPOINT_QPN, port_state=r(32), ev=r(32), port=r(8), tx_seq=tx_seq,
            ts_ns=r(64), probe_id=r(16),
        )  # fmt: skip
    if kind == 3:
        return ProbeReplyPacket(
            qpn=ENDPOINT_QPN, ev=r(32), port=r(8), tx_seq=tx_seq, probe_id=r(16),
            echo_ts_ns=r(64), port_state=r(16), op=rng.randrange(2),
        )  # fmt: skip
    return AcknowledgePacket(
        qpn=r(24), psn=r(24), syndrome=rng.choice([0, 5, 0x1F, 0x60, 0x61, 0x62]), msn=r(24)
    )


def build_corpus(rng: random.Random, tx: Integrity, plain: bool = False) -> list[bytes]:
    """Valid encodings (plus trimmed data packets) to mutate."""
    corpus = []
    for seq in range(CORPUS_PER_MODE):
        pkt = random_packet(rng, seq, plain)
        if plain:
            corpus.append(encode_plain(pkt, tx))
            continue
        if type(pkt) is AcknowledgePacket and tx.trailer_len != 4:
            continue  # (no room for the extension: never authenticated)
        wire = encode(pkt, tx)
        corpus.append(wire)
        if wire[0] in WRITE_OPCODES:
            corpus.append(encode_trimmed(wire, lasthop=rng.random() < 0.5))
    return corpus


def reseal(buf: bytearray, trailer_len: int, plain: bool = False) -> bytes:
    """Recompute hdr_check (and an ICRC) after a header edit: reaches the field checks."""
    if not plain:
        try:
            hlen = header_length(buf[0])
        except ValueError:
            return bytes(buf)
        if len(buf) < hlen:
            return bytes(buf)
        if buf[0] != 0xD1:
            struct.pack_into(">I", buf, hlen - 4, crc32_header(buf[:hlen]))
    else:
        try:
            hlen = plain_header_length(buf[0], len(buf) > 8 and bool(buf[8] & 0x10))
        except ValueError:
            return bytes(buf)
    if trailer_len == 4 and len(buf) >= hlen + 4:
        body = bytes(buf[:-4])
        return body + icrc(body)
    return bytes(buf)


def mutate(rng: random.Random, wire: bytes, trailer_len: int, plain: bool = False) -> bytes:
    """One cheap mutation of a valid datagram."""
    choice = rng.randrange(10)
    n = len(wire)
    if choice == 0:  # pure random bytes
        return rng.randbytes(rng.randrange(160))
    if choice == 1:  # truncate
        return wire[: rng.randrange(n)]
    if choice == 2:  # extend
        return wire + rng.randbytes(rng.randrange(1, 16))
    buf = bytearray(wire)
    if choice == 3:  # random opcode, sometimes a valid one
        buf[0] = rng.choice(OPCODES) if rng.random() < 0.7 else rng.getrandbits(8)
        return bytes(buf)
    if choice == 4:  # random byte anywhere
        buf[rng.randrange(n)] = rng.getrandbits(8)
        return bytes(buf)
    if choice == 5:  # random header byte with valid hdr_check / ICRC: a buggy peer
        buf[rng.randrange(min(n, 108))] = rng.getrandbits(8)
        return reseal(buf, trailer_len, plain)
    if choice == 6:  # random length field (RETH DMA length) with valid checks
        at = 28 if plain and n > 8 and not buf[8] & 0x10 else 32  # (a plain write may lack TSETH)
        if n >= at + 4:
            struct.pack_into(">I", buf, at, rng.choice([0, 1, n, 1 << 31, rng.getrandbits(32)]))
        return reseal(buf, trailer_len, plain)
    if choice == 7 and not plain:  # switch bits flipped
        flags_at = header_length(buf[0]) - XETH_FLAGS_FROM_END if buf[0] in WRITE_OPCODES else 1
        buf[min(flags_at, n - 1)] ^= rng.choice([0x40, 0x80, 0xC0])
        return bytes(buf)
    for _ in range(rng.randrange(1, 4)):  # 1-3 bit flips
        buf[rng.randrange(n)] ^= 1 << rng.randrange(8)
    return bytes(buf)


def run_fuzz(count: int, seed: int) -> Counter[str]:
    rng = random.Random(seed)
    modes: list[tuple[Integrity, Integrity, list[bytes]]] = []
    pairs: list[tuple[Integrity, Integrity]] = [
        (CrcIntegrity(), CrcIntegrity()),
        (AeadIntegrity(KEY, 1, 2), AeadIntegrity(KEY, 2, 1)),
        (AeadIntegrity(KEY, 1, 2, encrypt=True), AeadIntegrity(KEY, 2, 1, encrypt=True)),
    ]
    for tx, receiver in pairs:
        modes.append((tx, receiver, build_corpus(rng, tx)))
    crc_mode = modes[0][1]
    plain = CrcIntegrity()
    modes.append((plain, plain, build_corpus(rng, plain, plain=True)))
    outcomes: Counter[str] = Counter()
    for i in range(count):
        _, rx, corpus = modes[i % 4]
        if rx is plain:
            run_plain(rng, corpus, seed, outcomes)
            continue
        wire = mutate(rng, corpus[rng.randrange(len(corpus))], rx.trailer_len)
        try:
            pkt = decode(wire, rx)
        except DecodeError as exc:
            outcomes[exc.reason.value] += 1
        else:
            outcomes["valid"] += 1
            if rx is crc_mode:
                assert encode(pkt, crc_mode) == wire, f"seed {seed}: non-canonical {wire.hex()}"
        if i % 64 == 0:
            try:
                peek_qpn(wire)
            except DecodeError:
                outcomes["peek_short"] += 1
    return outcomes


def run_plain(rng: random.Random, corpus: list[bytes], seed: int, outcomes: Counter[str]) -> None:
    """One case in the specification's encoding: a mutated datagram, arriving with a random
    EV and port and (now and then) a trimmed traffic class."""
    crc = CrcIntegrity()
    wire = mutate(rng, corpus[rng.randrange(len(corpus))], 4, plain=True)
    trimmed = rng.random() < 0.1
    tclass = rng.choice(TRIM_TCLASSES if trimmed else TCLASSES)
    try:
        pkt = decode_plain(wire, crc, ev=rng.getrandbits(32), port=rng.randrange(4), tclass=tclass)
    except DecodeError as exc:
        outcomes[exc.reason.value] += 1
        outcomes["plain_rejected"] += 1
        return
    outcomes["valid"] += 1
    outcomes["plain_valid"] += 1
    again = encode_plain(pkt, crc)
    if type(pkt) is DataPacket and pkt.trimmed:
        assert wire.startswith(again), f"seed {seed}: trimmed {wire.hex()}"
    else:
        assert again == wire, f"seed {seed}: non-canonical plain {wire.hex()}"


def test_decode_raises_only_decode_error() -> None:
    """MRC_FUZZ_COUNT random+mutated datagrams (1,000,000 by default) in all integrity modes."""
    outcomes = run_fuzz(FUZZ_COUNT, FUZZ_SEED)
    counted = {"peek_short", "plain_valid", "plain_rejected"}
    assert sum(v for k, v in outcomes.items() if k not in counted) == FUZZ_COUNT
    if FUZZ_COUNT >= 100_000:  # enough cases to reach every check
        reached = {reason.value for reason in DecodeReason} | {"valid"}
        assert reached <= set(outcomes), f"never reached: {reached - set(outcomes)}"
        assert outcomes["plain_valid"] > 0 and outcomes["plain_rejected"] > 0


def test_small_fuzz_run_reaches_deep_checks() -> None:
    """A short run already gets past the header checks into the field and length checks."""
    outcomes = run_fuzz(20_000, FUZZ_SEED + 1)
    assert outcomes[DecodeReason.BAD_FIELD.value] > 0
    assert outcomes[DecodeReason.BAD_LENGTH.value] > 0
    assert outcomes["valid"] > 0


def test_flags_constant_matches_mutator() -> None:
    """XETH_FLAGS_FROM_END is the flags byte a switch writes: keep the mutator honest."""
    crc = CrcIntegrity()
    wire = encode_trimmed(encode(DataPacket(1, 2, 3, 4, b"x", 5, 6, 7, 8, _F | _L), crc), True)
    assert wire[header_length(wire[0]) - XETH_FLAGS_FROM_END] == SWITCH_FLAGS
