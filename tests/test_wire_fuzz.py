"""Fuzz the decoder: whatever arrives, ``decode`` returns a valid packet or raises DecodeError.

The acceptance run is 1,000,000 random and mutated datagrams (``MRC_FUZZ_COUNT``, default
1,000,000; it takes well under a minute here because each case mutates a small pre-encoded
packet).  ``MRC_FUZZ_SEED`` replays a run.  Inputs that do decode must re-encode to exactly
the same bytes, so the decoder accepts only the codec's canonical form.
"""

from __future__ import annotations

import os
import random
import struct
import zlib
from collections import Counter

from mrcstack.wire import (
    AckPacket,
    AeadIntegrity,
    CrcIntegrity,
    DataFlags,
    DataPacket,
    DecodeError,
    DecodeReason,
    FeedbackFlags,
    Integrity,
    NackReason,
    Opcode,
    Packet,
    ProbePacket,
    ProbeReplyPacket,
    crc32_header,
    decode,
    encode,
    encode_trimmed,
    header_length,
    peek_qpn,
)

FUZZ_COUNT = int(os.environ.get("MRC_FUZZ_COUNT", "1000000"))
FUZZ_SEED = int(os.environ.get("MRC_FUZZ_SEED", "20260522"))
CORPUS_PER_MODE = 48
MAX_FUZZ_PAYLOAD = 96  # small packets keep each mutation cheap
BIG_PAYLOAD = 4096
KEY = bytes(range(16))
OPCODES = [int(op) for op in Opcode]
NACKS = [0, *(int(r) for r in NackReason)]


def random_packet(rng: random.Random, tx_seq: int) -> Packet:
    """A valid packet of any type with random fields."""
    kind = rng.randrange(4)
    r = rng.getrandbits
    if kind == 0:
        size = BIG_PAYLOAD if rng.random() < 0.05 else rng.randrange(MAX_FUZZ_PAYLOAD)
        return DataPacket(
            qpn=r(24), psn=r(24), va=r(64), rkey=r(32), payload=rng.randbytes(size), ev=r(32),
            port=r(8), tx_seq=tx_seq, ts_ns=r(64), flags=rng.choice([0, 1, 2, 3]),
            imm=r(32) if rng.random() < 0.5 else None,
        )  # fmt: skip
    if kind == 1:
        return AckPacket(
            qpn=r(24), cum_psn=r(24), msn=r(24), ev=r(32), port=r(8), tx_seq=tx_seq,
            echo_ev=r(32), echo_psn=r(24), echo_ts_ns=r(64), sack_base=r(24),
            sack_bitmap=r(64), port_state=r(16), flags=rng.choice([0, FeedbackFlags.ECN_ECHO]),
            nack_reason=rng.choice(NACKS),
        )  # fmt: skip
    if kind == 2:
        return ProbePacket(qpn=r(24), ev=r(32), port=r(8), tx_seq=tx_seq, ts_ns=r(64))
    return ProbeReplyPacket(
        qpn=r(24), ev=r(32), port=r(8), tx_seq=tx_seq, echo_ev=r(32), echo_ts_ns=r(64),
        port_state=r(16),
    )  # fmt: skip


def build_corpus(rng: random.Random, tx: Integrity) -> list[bytes]:
    """Valid encodings (plus trimmed data packets) to mutate."""
    corpus = []
    for seq in range(CORPUS_PER_MODE):
        wire = encode(random_packet(rng, seq), tx)
        corpus.append(wire)
        if wire[0] in (Opcode.RDMA_WRITE_ONLY, Opcode.RDMA_WRITE_ONLY_WITH_IMMEDIATE):
            corpus.append(encode_trimmed(wire, lasthop=rng.random() < 0.5))
    return corpus


def reseal(buf: bytearray, trailer_len: int) -> bytes:
    """Recompute hdr_check (and a CRC trailer) after a header edit: reaches the field checks."""
    try:
        hlen = header_length(buf[0])
    except ValueError:
        return bytes(buf)
    if len(buf) < hlen:
        return bytes(buf)
    struct.pack_into(">I", buf, hlen - 4, crc32_header(buf[:hlen]))
    if trailer_len == 4 and len(buf) >= hlen + 4:
        body = bytes(buf[:-4])
        return body + struct.pack(">I", zlib.crc32(body))
    return bytes(buf)


def mutate(rng: random.Random, wire: bytes, trailer_len: int) -> bytes:
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
    if choice == 5:  # random header byte with valid hdr_check / CRC: a buggy peer
        buf[rng.randrange(min(n, 72))] = rng.getrandbits(8)
        return reseal(buf, trailer_len)
    if choice == 6:  # random length field (RETH DMA length) with valid checks
        if n >= 28:
            struct.pack_into(">I", buf, 24, rng.choice([0, 1, n, 1 << 31, rng.getrandbits(32)]))
        return reseal(buf, trailer_len)
    if choice == 7:  # switch bits flipped
        flags_at = header_length(buf[0]) - 27 if buf[0] in (10, 11) else 1
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
    outcomes: Counter[str] = Counter()
    for i in range(count):
        _, rx, corpus = modes[i % 3]
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


def test_decode_raises_only_decode_error() -> None:
    """MRC_FUZZ_COUNT random+mutated datagrams (1,000,000 by default) in all integrity modes."""
    outcomes = run_fuzz(FUZZ_COUNT, FUZZ_SEED)
    assert sum(v for k, v in outcomes.items() if k != "peek_short") == FUZZ_COUNT
    if FUZZ_COUNT >= 100_000:  # enough cases to reach every check
        reached = {reason.value for reason in DecodeReason} | {"valid"}
        assert reached <= set(outcomes), f"never reached: {reached - set(outcomes)}"


def test_small_fuzz_run_reaches_deep_checks() -> None:
    """A short run already gets past the header checks into the field and length checks."""
    outcomes = run_fuzz(20_000, FUZZ_SEED + 1)
    assert outcomes[DecodeReason.BAD_FIELD.value] > 0
    assert outcomes[DecodeReason.BAD_LENGTH.value] > 0
    assert outcomes["valid"] > 0


def test_flags_constant_matches_mutator() -> None:
    """The mutator's 27 is the data extension's flags byte: keep it honest."""
    wire = encode(DataPacket(1, 2, 3, 4, b"", 5, 6, 7, 8, flags=DataFlags.LAST), CrcIntegrity())
    assert wire[header_length(wire[0]) - 27] == DataFlags.LAST
