"""mrcd's per-packet data path without sockets: CPU microseconds per data packet, per side.

Two core ``Connection`` objects configured as mrcd configures a QP (4 planes, the address
plan's EV profile h0 -> h3, 8 KiB payloads, an AES-GCM tag on every packet, ACK coalescing
16, NSCC) exchange ``WRITE``-byte RDMA writes in memory, ``OUTSTANDING`` of them in flight,
through the same calls mrcd's transport makes (``daemons/mrcd/datapath/transport.py``):
``packets_to_send`` in batches of ``SEND_BATCH``, each packet encoded into its own
``sendmmsg`` slot (``encode_into``; a revision without it: ``datagrams_to_send`` and each
datagram copied into its slot, as its transport did), ``receive_datagram`` of a view of each
slot (as of the ``recvmmsg`` buffer) in turns of ``READ_TURN``, the events drained after
each batch.  The clock is a fake one that
advances ``TICK`` seconds per datagram, so every run takes the same path through the core.

Three phases are timed by process CPU time (``time.process_time_ns``), each per data packet:

- **sender**: the writer's packets into the slots (``packets_to_send`` + encode + seal);
- **receiver**: ``receive_datagram`` of each data packet (decode, verify, place, ACK
  coalescing), its events, and the ACKs built and sealed into the slots;
- **ack**: ``receive_datagram`` of each ACK on the writer and its completions.

``python -m bench.datapath_bench`` runs it once here; ``--against REV`` exports revision
``REV`` with git, then runs it in a fresh interpreter in each tree, alternately, for
``--rounds`` rounds, and prints each phase's median before and after, the spread
(min..max), the after/before ratio of the medians and that of the best rounds.  Only APIs
both trees have are used: the measurement itself (:func:`measure`) imports nothing but
mrcstack, and the exported tree needs no copy of this file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import mrcstack
from mrcstack import addrplan
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.memory import MemoryTable
from mrcstack.fabric import Fabric

PACKETS = 20_000
MTU_PAYLOAD = 8192  # mrcd's default QpAttrs.mtu_payload
WRITE = 1 << 20
OUTSTANDING = 16
SEND_BATCH = 256  # transport.SEND_BATCH
READ_TURN = 16  # transport.READ_TURN
ACK_COALESCE = 16  # mrcd.ack_coalesce's default
TIMEOUT = 10e-3  # QpAttrs.timeout's default
#: Writes before the clock starts: code paths, the congestion window, every page of the
#: regions warm.
WARMUP_WRITES = OUTSTANDING
SLOT = 9216  # txbatch.SLOT
TICK = 1e-6  # fake seconds per datagram handled
KEY = bytes(range(16))
PHASES = ("sender", "receiver", "ack")
ROUNDS = 5
REPO = Path(__file__).resolve().parent.parent


def _slots() -> list[memoryview]:
    """``SEND_BATCH`` send slots in one buffer, as ``txbatch.BatchSender`` has them."""
    data = memoryview(bytearray(SEND_BATCH * SLOT))
    return [data[i * SLOT : (i + 1) * SLOT] for i in range(SEND_BATCH)]


def _send(conn: Connection, now: float, slots: list[memoryview]) -> list[tuple[memoryview, int]]:
    """One transmit: each packet encoded into its slot, as the transport does; (a view of
    each datagram, its port)."""
    out = []
    for slot, (pkt, _) in zip(slots, conn.packets_to_send(now, SEND_BATCH), strict=False):
        out.append((slot[: conn.encode_into(pkt, slot)], pkt.port))
    return out


def _send_copied(
    conn: Connection, now: float, slots: list[memoryview]
) -> list[tuple[memoryview, int]]:
    """One transmit as a transport before ``encode_into`` did it: the datagrams made, then
    each copied into its slot."""
    out = []
    for slot, d in zip(slots, conn.datagrams_to_send(now, SEND_BATCH), strict=False):
        size = len(d.data)
        slot[:size] = d.data
        out.append((slot[:size], d.port))
    return out


def measure(packets: int = PACKETS) -> dict[str, Any]:
    """CPU microseconds per data packet of each phase, for ``packets`` data packets (rounded
    up to whole writes), and what the run did; plain JSON values."""
    fabric = Fabric()
    region = OUTSTANDING * WRITE

    def config(local: int, remote: int, src: int, dst: int) -> ConnectionConfig:
        return ConnectionConfig(
            local_qpn=local,
            remote_qpn=remote,
            planes=fabric.planes,
            evs=addrplan.ev_profile(fabric, src, dst),
            mtu_payload=MTU_PAYLOAD,
            key=KEY,
            timeout=TIMEOUT,
            initial_rto=max(TIMEOUT, 0.05),
            ack_coalesce=ACK_COALESCE,
        )

    mem_a, mem_b = MemoryTable(), MemoryTable()
    src = bytearray(os.urandom(region))
    # Every page written once before the clock runs (as a long-lived mrcd's are), and
    # unlike the source, so the check at the end means something.
    dst = bytearray(b"\xff") * region
    mem_a.register(src)
    mr = mem_b.register(dst)
    now = 0.0
    a = Connection(config(0x100, 0x200, 0, 3), memory=mem_a, rng=random.Random(1), now=now)
    b = Connection(config(0x200, 0x100, 3, 0), memory=mem_b, rng=random.Random(2), now=now)
    writes = -(-packets // (WRITE // MTU_PAYLOAD))
    total = WARMUP_WRITES + writes
    posted = completed = 0
    view = memoryview(src)

    def post() -> None:
        nonlocal posted
        off = posted % OUTSTANDING * WRITE
        a.post_write(posted, view[off : off + WRITE], mr.va + off, mr.rkey, now=now)
        posted += 1

    a_slots, b_slots = _slots(), _slots()
    send = _send if hasattr(Connection, "encode_into") else _send_copied
    cpu = time.process_time_ns
    spent = {phase: 0 for phase in PHASES}
    data = acks = 0
    timed = False
    while posted < OUTSTANDING:
        post()
    stalls = 0
    while completed < total:
        if completed >= WARMUP_WRITES and not timed:  # warm: the counts start from here
            timed = True
            spent = {phase: 0 for phase in PHASES}
            data = acks = 0
        t0 = cpu()
        out = send(a, now, a_slots)
        a.get_timer()  # the transport's next timer, after each transmit (which also drops
        # the acknowledged packets' RTO entries: without it they would pile up here)
        t1 = cpu()
        spent["sender"] += t1 - t0
        if not out:  # nothing to send: let the timers run (never on a clean path)
            stalls += 1
            if stalls > 1000:
                raise RuntimeError("datapath bench: the transfer stalled")
            deadline = a.get_timer()
            now = max(now, deadline if deadline is not None else now) + TICK
            a.handle_timer(now)
            continue
        data += len(out)
        t0 = cpu()
        for i in range(0, len(out), READ_TURN):
            for datagram, port in out[i : i + READ_TURN]:
                now += TICK
                b.receive_datagram(datagram, now=now, port=port)
            while b.next_event() is not None:
                pass
        back = send(b, now, b_slots)
        b.get_timer()
        t1 = cpu()
        spent["receiver"] += t1 - t0
        acks += len(back)
        t0 = cpu()
        for datagram, port in back:
            now += TICK
            a.receive_datagram(datagram, now=now, port=port)
        done = 0
        while a.next_event() is not None:
            done += 1
        t1 = cpu()
        spent["ack"] += t1 - t0
        completed += done
        while posted < total and posted - completed < OUTSTANDING:
            post()
    if bytes(dst[:WRITE]) != bytes(src[:WRITE]):
        raise RuntimeError("datapath bench: the data did not arrive intact")
    result: dict[str, Any] = {
        f"{phase}_us_per_packet": spent[phase] / 1e3 / max(1, data) for phase in PHASES
    }
    result["total_us_per_packet"] = sum(result[f"{p}_us_per_packet"] for p in PHASES)
    return result | {
        "data_packets": data,
        "acks": acks,
        "writes": writes,
        "package": mrcstack.__file__,
    }


def _measure_in(tree: Path, packets: int) -> dict[str, Any]:
    """:func:`measure` in a fresh interpreter importing mrcstack from ``tree``."""
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--measure", "--packets", str(packets)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"datapath bench in {tree} failed:\n{proc.stderr[-2000:]}")
    out: dict[str, Any] = json.loads(proc.stdout)
    if not Path(out["package"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"{tree}: imported mrcstack from {out['package']} instead")
    return out


def compare(rev: str, rounds: int = ROUNDS, packets: int = PACKETS) -> dict[str, float]:
    """Each phase at revision ``rev`` ("before") and in this tree ("after"), alternating for
    ``rounds`` rounds in fresh interpreters: medians, min and max, after/before ratios."""
    # Not at the top: a measuring run executes this file with only the measured tree on
    # its path, whose ``bench`` package may differ.
    from bench import sim_bench  # noqa: PLC0415

    if rounds < 1:
        raise ValueError(f"rounds must be at least 1, got {rounds}")
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory(prefix="mrcstack-before-") as tmp:
        old_tree = Path(tmp)
        if not sim_bench.export(rev, old_tree):
            raise SystemExit(f"datapath bench: revision {rev!r} is not available here")
        for _ in range(rounds):
            for label, tree in (("before", old_tree), ("after", REPO)):
                runs[label].append(_measure_in(tree, packets))
        # (1: the per-packet modules ran compiled, mrcstack.native; 0: as Python)
        compiled = {label: float(sim_bench.runs_compiled(tree))
                    for label, tree in (("before", old_tree), ("after", REPO))}  # fmt: skip
    out: dict[str, float] = {
        "rounds": float(rounds),
        "data_packets": runs["after"][0]["data_packets"],
        "before_compiled": compiled["before"],
        "after_compiled": compiled["after"],
    }
    for phase in (*PHASES, "total"):
        key = f"{phase}_us_per_packet"
        for label in ("before", "after"):
            values = [r[key] for r in runs[label]]
            out[f"{label}_{key}"] = statistics.median(values)
            out[f"{label}_{key}_min"] = min(values)
            out[f"{label}_{key}_max"] = max(values)
        out[f"{phase}_after_over_before"] = out[f"after_{key}"] / out[f"before_{key}"]
        # Contention only adds CPU time (a shared machine): the best rounds' ratio is the
        # steadier one there.
        out[f"{phase}_after_over_before_best"] = out[f"after_{key}_min"] / out[f"before_{key}_min"]
    return out


def run(packets: int = PACKETS) -> dict[str, float]:
    """One measurement in this process (``make bench``)."""
    return {k: float(v) for k, v in measure(packets).items() if k != "package"}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.datapath_bench", description=__doc__)
    p.add_argument("--packets", type=int, default=PACKETS, help="data packets per run")
    p.add_argument("--against", metavar="REV", help="this tree vs git revision REV, alternating")
    p.add_argument("--rounds", type=int, default=ROUNDS, help="with --against: rounds per tree")
    p.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.packets < 1:
        p.error(f"--packets must be at least 1, got {args.packets}")
    if args.rounds < 1:
        p.error(f"--rounds must be at least 1, got {args.rounds}")
    if args.measure:
        print(json.dumps(measure(args.packets)), flush=True)
        return 0
    results = (
        compare(args.against, args.rounds, args.packets) if args.against else run(args.packets)
    )
    for key, value in results.items():
        print(f"{key:<44} {value:14,.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
