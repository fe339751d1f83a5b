"""Wire codec throughput: encode + decode of 4 KiB RDMA WRITE packets in each integrity mode.

``run()`` returns packets/s and payload MB/s per mode; ``make bench`` prints them.  Packets
are built before the clock starts (building the dataclass is the sender's cost, about 1.3 us,
not the codec's); each has its own tx_seq, as AES-GCM requires.
"""

from __future__ import annotations

import time

from mrcstack.wire import (
    PSN_MASK,
    AeadIntegrity,
    CrcIntegrity,
    DataPacket,
    Integrity,
    decode,
    encode,
)

PAYLOAD_BYTES = 4096
LAP = 1024  # distinct prebuilt packets; the clock is read once per lap
KEY = bytes(range(16))
MODES = ("crc", "aead", "aead_encrypt")
BYTES_PER_MB = 1e6


def _integrity_pair(mode: str) -> tuple[Integrity, Integrity]:
    if mode == "crc":
        return CrcIntegrity(), CrcIntegrity()
    encrypt = mode == "aead_encrypt"
    return AeadIntegrity(KEY, 1, 2, encrypt), AeadIntegrity(KEY, 2, 1, encrypt)


def _rate(mode: str, seconds: float) -> float:
    """Encode+decode round trips per second for one mode."""
    payload = bytes(range(256)) * (PAYLOAD_BYTES // 256)
    packets = [
        DataPacket(7, seq & PSN_MASK, 0x10000 + PAYLOAD_BYTES * seq, 42, payload, 3, 1, seq, seq)
        for seq in range(LAP)
    ]
    done = 0
    elapsed = 0.0
    while elapsed < seconds:
        tx, rx = _integrity_pair(mode)  # fresh sender per lap: tx_seq restarts (bench only)
        start = time.perf_counter()
        for pkt in packets:
            decode(encode(pkt, tx), rx)
        elapsed += time.perf_counter() - start
        done += LAP
    return done / elapsed


def run(seconds: float = 2.0) -> dict[str, float]:
    """Packets/s and payload MB/s of encode+decode per mode, ``seconds`` split over the modes."""
    if seconds <= 0:
        raise ValueError(f"seconds must be positive, got {seconds}")
    results: dict[str, float] = {}
    for mode in MODES:
        pps = _rate(mode, seconds / len(MODES))
        results[f"{mode} 4KiB encode+decode pkts/s"] = pps
        results[f"{mode} 4KiB encode+decode MB/s"] = pps * PAYLOAD_BYTES / BYTES_PER_MB
    return results


if __name__ == "__main__":
    for name, value in run().items():
        print(f"{name:<40} {value:14,.1f}")
