"""Live failover on the testbed: what a link, switch or NIC fault costs mrcd, next to MPTCP.

``run()`` (root only) builds the default fabric, unshaped (testbed ``fou``) and shaped to
200 Mbit/s per link (``fos``), with mrcd on every host, and for each fault in
:data:`FAULTS` runs ``MRC_FAILOVER_RUNS`` (default 5) transfers h0 -> h3 (different racks):

- **mrcd**: one QP through the application API, 256 KiB RDMA writes, 16 in flight; the
  time and size of every completion is the series;
- **MPTCP**: one connection with a subflow per plane (as in ``bench/daemon_bench.py``); the
  receiver counts the bytes it reads per millisecond.

Each run moves data for ``PRE_S`` seconds, injects the fault through the fault harness,
moves data for ``WINDOW_S`` more, then restores everything.  :func:`mrcstack.progress.analyze`
turns each series into the progress lost (ms at the pre-fault rate) and the time until
goodput is back within 10%; for mrcd the run also reports the retransmissions by reason
(the sender's /metrics) and the time from the fault to the first EV state change in the
sender's EV event stream.  Medians and spread (min-max) over the runs are printed, with the
targets of ``docs/benchmarks.md`` and the ratio to MPTCP.

``python -m bench.failover_bench [--runs N] [--faults a,b] [--unshaped-only] [--check]``
runs it alone; ``--check`` exits 1 when a median exceeds twice its target.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bench.daemon_bench import (
    SHAPED_BPS,
    _accept,
    bed,
    counters,
    mptcp_setup,
)
from mrcstack.api import Controller, Device, WcStatus, WriteWr
from mrcstack.daemons.cluster import Cluster
from mrcstack.fabric import Fabric, format_rate
from mrcstack.netns.faults import Faults
from mrcstack.netns.state import TestbedState
from mrcstack.progress import Impact, analyze

ROOT = Path(__file__).resolve().parent.parent
UNSHAPED, SHAPED = "fou", "fos"
SRC, DST = 0, 3
WRITE = 256 << 10
OUTSTANDING = 16
REGION = 64 << 20
WARMUP_S = 0.5  # fresh pages, CC ramp: not part of the pre-fault rate
PRE_S = 1.0
WINDOW_S = 1.5  # MPTCP needs 0.5-1.2 s to move off a dead path: the window includes it
SETTLE_S = 0.5
MPTCP_PORT = 5301
IPPROTO_MPTCP = 262
SERVICE = 91


@dataclass(frozen=True)
class FaultCase:
    name: str
    text: str
    apply: Callable[[Faults], object]
    #: Targets (ms) for mrcd's median progress lost and recovery, unshaped fabric.
    lost_target_ms: float


FAULTS: tuple[FaultCase, ...] = (
    FaultCase("link_down", "T0-T1 link down (p1:t0a-t1b)", lambda f: f.link_down("p1:t0a-t1b"), 5),
    FaultCase("t1_fail", "T1 switch fails (p1-t1b)", lambda f: f.switch_fail("p1-t1b"), 5),
    FaultCase("t1_blackhole", "T1 drops all (p1-t1b)", lambda f: f.switch_blackhole("p1-t1b"), 5),
    FaultCase("loss_2pct", "2% loss on p1:t0a-t1b", lambda f: f.loss("p1:t0a-t1b", None, 0.02), 50),
    FaultCase("rx_nic_down", "receiver NIC down (h3 plane 1)", lambda f: f.nic_down("h3", 1), 20),
    FaultCase("tx_nic_down", "sender NIC down (h0 plane 1)", lambda f: f.nic_down("h0", 1), 20),
)  # fmt: skip


def _quiet(line: str) -> None:
    """The harness's own log file keeps every fault; the table is what this prints."""


def runs() -> int:
    return int(os.environ.get("MRC_FAILOVER_RUNS", "5"))


# One mrcd run ---------------------------------------------------------------------------------
def mrcd_run(state: TestbedState, cluster: Cluster, case: FaultCase) -> dict[str, Any]:
    """Write h0 -> h3 across the fault; the series, the fault time and what mrcd reported."""
    a = Device.open(cluster.daemons[SRC].api_socket).create_context()
    b = Device.open(cluster.daemons[DST].api_socket).create_context()
    faults = Faults(state, log=_quiet)
    samples: list[tuple[float, int]] = []
    try:
        acq, bcq = a.create_cq(4096), b.create_cq(4096)
        qa, qb = a.create_qp(acq), b.create_qp(bcq)
        amr, bmr = a.reg_mr(REGION), b.reg_mr(REGION)
        listener = b.listen(SERVICE)
        t = threading.Thread(target=lambda: _accept(listener, qb))
        t.start()
        qa.connect(DST, SERVICE, timeout=30)
        t.join(30)
        slots = REGION // WRITE
        posted = done = 0

        def post() -> None:
            nonlocal posted
            off = posted % slots * WRITE
            qa.post_send(WriteWr(posted, (amr, off, WRITE), bmr.addr + off, bmr.rkey))
            posted += 1

        amr.buf[:] = bytes(REGION)  # touch every page before the clock starts
        bmr.buf[:] = bytes(REGION)
        before = counters(state, cluster)
        start = time.time()
        fault_at = start + WARMUP_S + PRE_S
        end = fault_at + WINDOW_S
        injector: threading.Thread | None = None
        applied: list[float] = []

        def inject() -> None:
            case.apply(faults)
            applied.append(time.time())

        for _ in range(OUTSTANDING):
            post()
        while True:
            now = time.time()
            if injector is None and now >= fault_at:
                # The fault command takes 6-16 ms (ip, nft, tc in a namespace): run it beside
                # the loop, which must keep stamping completions and posting writes, or the
                # command's own duration shows up as progress lost.
                fault_at = time.time()
                injector = threading.Thread(target=inject)
                injector.start()
            if now >= end:
                break
            for wc in acq.poll_wait(4096, timeout=0.005) or ():
                if wc.status is not WcStatus.SUCCESS:
                    raise RuntimeError(f"failover run {case.name}: write failed: {wc}")
                samples.append((time.time(), WRITE))
                done += 1
            while posted - done < OUTSTANDING:
                post()
        assert injector is not None
        injector.join()
        after = counters(state, cluster)
        with Controller.open(cluster.daemons[SRC].api_socket) as ctl:
            events = [e for e in ctl.recent_ev_events() if float(e.get("time", 0)) >= fault_at]
        first_ev = min((float(e["time"]) for e in events), default=None)
        retx = {
            k.removeprefix("retx_"): after[k] - before.get(k, 0.0)
            for k in after
            if k.startswith("retx_")
        }
        return {
            "samples": samples,
            "fault_at": fault_at,
            "retx": retx,
            "first_ev_ms": None if first_ev is None else (first_ev - fault_at) * 1e3,
            "command_ms": (applied[0] - fault_at) * 1e3,
        }
    finally:
        faults.restore_all()
        a.close()
        b.close()
        time.sleep(SETTLE_S)  # EVs condemned by the fault come back before the next run


# One MPTCP run --------------------------------------------------------------------------------
def role_recv(args: argparse.Namespace) -> dict[str, Any]:
    """MPTCP receiver: bytes read per millisecond (wall clock), until the sender closes."""
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, IPPROTO_MPTCP)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("::", MPTCP_PORT))
    srv.listen(1)
    print(json.dumps({"ready": True}), flush=True)
    srv.settimeout(args.timeout)
    conn, _ = srv.accept()
    conn.settimeout(args.timeout)
    buf = bytearray(1 << 20)
    per_ms: dict[int, int] = {}
    while n := conn.recv_into(buf):
        ms = int(time.time() * 1000)
        per_ms[ms] = per_ms.get(ms, 0) + n
    return {"per_ms": per_ms}


def role_send(args: argparse.Namespace) -> dict[str, Any]:
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, IPPROTO_MPTCP)
    sock.settimeout(args.timeout)
    sock.connect((args.to, MPTCP_PORT))
    data = b"\x5a" * (256 << 10)
    end = time.time() + args.seconds
    while time.time() < end:
        sock.sendall(data)
    sock.close()
    return {}


ROLES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "recv": role_recv,
    "send": role_send,
}


def mptcp_run(state: TestbedState, case: FaultCase) -> dict[str, Any]:
    faults = Faults(state, log=_quiet)
    total = WARMUP_S + PRE_S + WINDOW_S
    wait = str(total + 30)
    argv = [sys.executable, "-m", "bench.failover_bench"]
    recv = subprocess.Popen(
        ["ip", "netns", "exec", state.ns(f"h{DST}"), *argv, "--role", "recv", "--timeout", wait],
        cwd=ROOT, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    send: subprocess.Popen[str] | None = None
    try:
        assert recv.stdout is not None
        if '"ready"' not in recv.stdout.readline():
            raise RuntimeError("MPTCP receiver did not start")
        to = state.baseline[f"h{DST}"][0]
        send = subprocess.Popen(
            ["ip", "netns", "exec", state.ns(f"h{SRC}"), *argv, "--role", "send", "--to", to,
             "--seconds", str(total), "--timeout", wait],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(WARMUP_S + PRE_S)
        fault_at = time.time()
        case.apply(faults)
        send.communicate(timeout=total + 30)
        out, _ = recv.communicate(timeout=60)
        doc = json.loads([line for line in out.splitlines() if line.strip()][-1])
        samples = [(int(ms) / 1000, n) for ms, n in doc["per_ms"].items()]
        return {"samples": samples, "fault_at": fault_at}
    finally:
        for proc in (send, recv):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        faults.restore_all()
        time.sleep(SETTLE_S)


# Tables ---------------------------------------------------------------------------------------
def _impact(run: dict[str, Any]) -> Impact:
    return analyze(run["samples"], run["fault_at"], pre_s=PRE_S, window_s=WINDOW_S)


def _med(values: Sequence[float]) -> tuple[float, float, float]:
    vals = sorted(values)
    return statistics.median(vals), vals[0], vals[-1]


def _fmt(med: tuple[float, float, float]) -> str:
    m, lo, hi = med
    return f"{m:7.1f} [{lo:.1f}..{hi:.1f}]"


def measure(fabric: Fabric, name: str, cases: Sequence[FaultCase], n: int) -> list[dict[str, Any]]:
    """Every case, ``n`` mrcd runs and ``n`` MPTCP runs, interleaved, on one testbed."""
    rows = []
    with bed(fabric, name) as (state, cluster):
        mptcp_setup(state)
        for case in cases:
            mrcd = [mrcd_run(state, cluster, case) for _ in range(n)]
            mptcp = [mptcp_run(state, case) for _ in range(n)]
            rows.append({"case": case, "mrcd": mrcd, "mptcp": mptcp})
    return rows


def report(rows: list[dict[str, Any]], title: str, check: bool) -> bool:
    """Print one table; False if ``check`` and a median is over twice its target."""
    ok = True
    print(f"== failover: {title} (median [min..max] over {len(rows[0]['mrcd'])} runs) ==")
    print(f"{'fault':<14} {'mrcd lost ms':>22} {'recovery ms':>22} {'cmd ms':>6} {'1st EV ms':>9} "
          f"{'window lost ms':>24} {'MPTCP lost ms':>22} {'ratio':>6}  "
          "retransmissions (mrcd, summed)")  # fmt: skip
    for row in rows:
        case: FaultCase = row["case"]
        mi = [_impact(r) for r in row["mrcd"]]
        pi = [_impact(r) for r in row["mptcp"]]
        lost = _med([i.lost_ms for i in mi])
        rec = _med([min(i.recovery_ms, WINDOW_S * 1e3) for i in mi])
        wlost = _med([i.window_lost_ms for i in mi])
        plost = _med([i.lost_ms for i in pi])
        evs = [r["first_ev_ms"] for r in row["mrcd"] if r["first_ev_ms"] is not None]
        cmd = statistics.median(r["command_ms"] for r in row["mrcd"])
        first = f"{statistics.median(evs):9.1f}" if evs else f"{'-':>9}"
        retx: dict[str, float] = {}
        for r in row["mrcd"]:
            for k, v in r["retx"].items():
                retx[k] = retx.get(k, 0.0) + v
        ratio = lost[0] / plost[0] if plost[0] > 0 else float("nan")
        over = lost[0] > 2 * case.lost_target_ms
        mark = " OVER 2x TARGET" if over else ""
        ok = ok and not (check and over)
        print(f"{case.name:<14} {_fmt(lost):>22} {_fmt(rec):>22} {cmd:6.1f} {first} "
              f"{_fmt(wlost):>24} {_fmt(plost):>22} "
              f"{ratio:6.3f}  " + " ".join(f"{k} {v:.0f}" for k, v in sorted(retx.items()) if v)
              + f"  (target < {case.lost_target_ms:g} ms){mark}")  # fmt: skip
    return ok


def run(
    n: int | None = None, names: Sequence[str] = (), unshaped_only: bool = False,
    check: bool = False,
) -> bool:  # fmt: skip
    cases = [c for c in FAULTS if not names or c.name in names]
    count = runs() if n is None else n
    fabric = Fabric()
    ok = report(measure(fabric, UNSHAPED, cases, count), "unshaped default fabric", check)
    if not unshaped_only:
        shaped = replace(fabric, host_link_bps=SHAPED_BPS, fabric_link_bps=SHAPED_BPS)
        title = f"every link shaped to {format_rate(SHAPED_BPS)}"
        # No check: on a shaped fabric a NIC down takes a quarter of the capacity away for
        # good, so its "lost" figure is capacity, not failover; the targets are unshaped.
        report(measure(shaped, SHAPED, cases, count), title, check=False)
    return ok


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.failover_bench", description=__doc__)
    p.add_argument("--runs", type=int, default=None, help="runs per fault (default 5)")
    p.add_argument("--faults", default="", help="comma-separated fault names (default all)")
    p.add_argument("--unshaped-only", action="store_true")
    p.add_argument("--check", action="store_true", help="exit 1 if a median exceeds 2x target")
    p.add_argument("--role", choices=sorted(ROLES), help=argparse.SUPPRESS)
    p.add_argument("--to", default="", help=argparse.SUPPRESS)
    p.add_argument("--seconds", type=float, default=1.0, help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=60.0, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.role:
        print(json.dumps(ROLES[args.role](args)), flush=True)
        return 0
    if os.geteuid() != 0:
        print("failover bench: skipped (needs root for network namespaces)")
        return 0
    known = {c.name for c in FAULTS}
    names = [x for x in args.faults.split(",") if x]
    unknown = sorted(set(names) - known)
    if unknown:
        print(f"failover bench: unknown fault {unknown[0]!r}: one of {', '.join(sorted(known))}",
              file=sys.stderr)  # fmt: skip
        return 2
    return 0 if run(args.runs, names, args.unshaped_only, args.check) else 1


if __name__ == "__main__":
    raise SystemExit(main())
