"""mrcd's aggregate goodput with 1 and with 2 data-path workers (``workers = N``), 4 QPs.

The daemon bench's workers section (``python -m bench.daemon_bench --workers``, and part of
``make bench``): on the unshaped default fabric (testbed ``dbw``), h0 -> h3, four QPs in one
context through the application API, each with ``DEPTH`` 1 MiB writes in flight, for
``MRC_BENCH_SECONDS``; mrcd restarts with ``workers = 1`` and ``workers = 2`` on both hosts
in alternating rounds (``MRC_BENCH_REPEAT``), medians and their ratio.  What the ratio means
on a given machine is in docs/benchmarks.md ("Data-path workers").
"""

from __future__ import annotations

import os
import statistics
import tempfile
import threading
import time
from pathlib import Path

from mrcstack.api import CompletionQueue, Device, WcStatus, WorkCompletion, WriteWr
from mrcstack.daemons.cluster import Cluster
from mrcstack.experiments.live import accept
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.state import TestbedState, load

NAME = "dbw"  # this section's testbed
SRC, DST = 0, 3
QPS = 4
WRITE = 1 << 20
DEPTH = 8  # writes in flight per QP
REGION = QPS * DEPTH * WRITE
WORKERS = (1, 2)


def cpu_times() -> tuple[float, float]:
    """The machine's (busy, all) CPU time in clock ticks since boot (/proc/stat)."""
    fields = [float(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def successes(cq: CompletionQueue, what: str) -> list[WorkCompletion]:
    """The completions ``cq`` has, waiting up to 30 s for one; each must be a success
    (``what``: the run, for the error)."""
    wcs = cq.poll_wait(4096, timeout=30)
    if not wcs:
        raise RuntimeError(f"{what}: no completion in 30 s")
    for wc in wcs:
        if wc.status is not WcStatus.SUCCESS:
            raise RuntimeError(f"{what}: write failed: {wc}")
    return wcs


def goodput(cluster: Cluster, duration: float, qps: int = QPS) -> tuple[float, float]:
    """bits/s of 1 MiB writes h0 -> h3 over ``qps`` QPs for ``duration`` s (each QP keeps
    ``DEPTH`` writes in flight, in its own slots of one region), and the fraction of the
    machine's CPUs busy meanwhile (both ends, the kernel's forwarding, anything else)."""
    a = Device.open(cluster.daemons[SRC].api_socket).create_context()
    b = Device.open(cluster.daemons[DST].api_socket).create_context()
    try:
        acq, bcq = a.create_cq(4096), b.create_cq(4096)
        amr, bmr = a.reg_mr(REGION), b.reg_mr(REGION)
        amr.buf[:] = os.urandom(REGION)
        senders = []
        for i in range(qps):
            qa, qb = a.create_qp(acq), b.create_qp(bcq)
            listener = b.listen(90 + i)
            t = threading.Thread(target=lambda lst=listener, q=qb: accept(lst, q))
            t.start()
            qa.connect(DST, 90 + i, timeout=30)
            t.join(30)
            senders.append(qa)
        index = {qp.qpn: i for i, qp in enumerate(senders)}
        posted = [0] * qps

        def post(i: int) -> None:
            off = (i * DEPTH + posted[i] % DEPTH) * WRITE
            senders[i].post_send(WriteWr(posted[i], (amr, off, WRITE), bmr.addr + off, bmr.rkey))
            posted[i] += 1

        def wait(until: float | None) -> int:
            """Completions until none is in flight (reposting each until ``until``)."""
            done = 0
            while sum(posted) > done:
                for wc in successes(acq, "workers bench"):
                    done += 1
                    if until is not None and time.perf_counter() < until:
                        post(index[wc.qpn])
            return done

        for i in range(qps):  # warm-up: congestion windows, EV states
            for _ in range(DEPTH):
                post(i)
        wait(None)
        posted = [0] * qps
        busy0, all0 = cpu_times()
        start = time.perf_counter()
        for i in range(qps):
            for _ in range(DEPTH):
                post(i)
        done = wait(start + duration)
        took = time.perf_counter() - start
        busy1, all1 = cpu_times()
        if bytes(bmr.buf) != bytes(amr.buf):
            raise RuntimeError("workers bench: data did not arrive intact")
        return done * WRITE * 8 / took, (busy1 - busy0) / max(1.0, all1 - all0)
    finally:
        a.close()
        b.close()


def scaling(duration: float, rounds: int) -> dict[str, float]:
    """Median aggregate goodput with each of ``WORKERS`` (restarting mrcd between them, in
    alternating rounds on one testbed) and the 2-over-1 ratio."""
    got: dict[int, list[float]] = {w: [] for w in WORKERS}
    busy: dict[int, list[float]] = {w: [] for w in WORKERS}
    with tempfile.TemporaryDirectory(prefix="mrcstack-workers-") as tmp:
        testbed.clean(NAME)
        try:
            testbed.up(Fabric(), NAME)
            state: TestbedState = load(NAME)
            for _ in range(rounds):
                for w in WORKERS:
                    with Cluster(state, Path(tmp), log_level="warning",
                                 extra=f"workers = {w}") as cluster:  # fmt: skip
                        try:
                            bps, cpus = goodput(cluster, duration)
                        except RuntimeError as exc:
                            logs = "\n".join(cluster.tail(h, 20) for h in (SRC, DST))
                            raise RuntimeError(f"workers = {w}: {exc}\n{logs}") from None
                    got[w].append(bps)
                    busy[w].append(cpus)
        finally:
            testbed.clean(NAME)
    out = {"workers_qps": float(QPS)}
    for w in WORKERS:
        out[f"workers_{w}_gbps"] = statistics.median(got[w]) / 1e9
        out[f"workers_{w}_gbps_min"] = min(got[w]) / 1e9
        out[f"workers_{w}_gbps_max"] = max(got[w]) / 1e9
        out[f"workers_{w}_cpus_busy"] = statistics.median(busy[w]) * (os.cpu_count() or 1)
    out["workers_2_over_1"] = out["workers_2_gbps"] / out["workers_1_gbps"]
    return out
