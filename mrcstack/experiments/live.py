"""Faults under traffic on the namespace testbed: mrcd next to kernel TCP and MPTCP.

One measurement, shared by the failover benchmark (``make bench``) and the testbed
experiments (``mrcstack experiment run --where testbed``), so a figure means the same in
both.  A run moves data h0 -> h3 (different racks) for ``warmup + pre`` seconds, applies a
:class:`FaultCase` (its first step at ``fault_at``, later steps at their offsets), moves
data for ``window`` seconds more, then restores every fault.  The series is what completed,
``(time_s, bytes)``:

- **mrcd**: one QP through the application API, 256 KiB RDMA writes, 16 in flight; each
  completion is a sample.  The run also reports the sender's retransmissions by reason
  (its /metrics) and the time from the fault to the first EV state change in its EV event
  stream;
- **MPTCP** (one subflow per plane: the receiver announces its other planes' addresses) or
  **TCP** (plain kernel TCP between the plane-0 addresses, the fabric's ECMP picks its
  path): the receiver counts the bytes it reads per millisecond.

:func:`mrcstack.progress.analyze` turns a series into the progress lost and the recovery
time.  The stream baselines run as their own processes inside the hosts' namespaces
(:mod:`.stream`, one JSON line out).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NoReturn

from mrcstack.api import (
    CompletionQueue,
    Context,
    Controller,
    Device,
    Listener,
    MemoryRegion,
    QpAttr,
    QueuePair,
    WcStatus,
    WriteWr,
)
from mrcstack.daemons.cluster import Cluster
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.faults import Faults
from mrcstack.netns.run import call_in_netns, ip
from mrcstack.netns.state import TestbedState, load
from mrcstack.progress import Impact, analyze, row_horizon

SRC, DST = 0, 3
WRITE = 256 << 10
OUTSTANDING = 16
REGION = 64 << 20
WARMUP_S = 0.5  # fresh pages, CC ramp: not part of the pre-fault rate
PRE_S = 1.0
WINDOW_S = 1.5  # MPTCP needs 0.5-1.2 s to move off a dead path: the window includes it
SETTLE_S = 0.5
#: Every link of the shaped fabric: 4 planes x 200 Mbit/s between two hosts, so the fabric,
#: not the daemons' CPU, is the bottleneck.
SHAPED_BPS = 200e6
SERVICE = 91
STACKS = ("mrcd", "tcp", "mptcp")

#: A fault action on the testbed's fault harness.
Action = Callable[[Faults], object]


@dataclass(frozen=True)
class FaultCase:
    """A fault: ``apply`` at the fault time, then each ``(offset_s, action)`` of ``later``."""

    name: str
    text: str
    apply: Action
    #: Target (ms) for mrcd's median progress lost on the unshaped fabric (the benchmark).
    lost_target_ms: float = 0.0
    later: tuple[tuple[float, Action], ...] = ()
    #: Count progress lost to this time after the fault (a fault that stays, such as loss:
    #: its cost over a set time); None: from the runs' recovery time.
    horizon_s: float | None = None


@dataclass(frozen=True)
class Run:
    """One transfer across a fault: its series and what the stack reported."""

    stack: str
    samples: tuple[tuple[float, int], ...]
    fault_at: float
    retx: dict[str, float]
    first_ev_ms: float | None  # mrcd only: fault -> first EV state change
    command_ms: float  # how long the fault's first command took
    #: From the fault time to the end of each of the case's later steps (ms): a port brought
    #: back is back when its command has finished (its addresses and routes restored).
    steps_ms: tuple[float, ...] = ()
    #: mrcd only: the QP failed (its first failed completion; no samples after it).
    failed: str | None = None

    def impact(
        self, pre_s: float = PRE_S, window_s: float = WINDOW_S, horizon_s: float | None = None
    ) -> Impact:
        return analyze(
            self.samples, self.fault_at, pre_s=pre_s, window_s=window_s, horizon_s=horizon_s
        )

    def timeline(self, bin_s: float, start_s: float, end_s: float) -> list[float]:
        """Goodput (bit/s) per ``bin_s`` from ``start_s`` to ``end_s`` around the fault."""
        count = round((end_s - start_s) / bin_s)
        bins = [0] * count
        for t, n in self.samples:
            i = int((t - self.fault_at - start_s) // bin_s)
            if 0 <= i < count:
                bins[i] += n
        return [b * 8 / bin_s for b in bins]


def impacts(
    runs: Sequence[Run],
    pre_s: float = PRE_S,
    window_s: float = WINDOW_S,
    horizon_s: float | None = None,
) -> tuple[list[Impact], int]:
    """The runs' impacts, progress lost counted to one horizon for all of them (``horizon_s``,
    or from their median recovery: :func:`mrcstack.progress.row_horizon`), and how many
    runs moved nothing before the fault (no pre-fault rate to measure against).  Those are
    left out, and counted for the caller to report."""
    first, ok = [], []
    for r in runs:
        try:
            first.append(r.impact(pre_s, window_s))
        except ValueError:
            continue
        ok.append(r)
    failed = len(runs) - len(ok)
    if not ok:
        return [], failed
    horizon = horizon_s or row_horizon([i.recovery_ms for i in first], window_s)
    return [r.impact(pre_s, window_s, horizon) for r in ok], failed


# The testbed -------------------------------------------------------------------------------
@contextmanager
def bed(fabric: Fabric, name: str) -> Iterator[tuple[TestbedState, Cluster]]:
    """A testbed ``name`` with mrcd on every host, removed by name on the way out."""
    testbed.clean(name)
    workdir = Path(tempfile.mkdtemp(prefix=f"mrc-live-{name}-"))
    try:
        testbed.up(fabric, name)
        state = load(name)
        with Cluster(state, workdir, log_level="warning") as cluster:
            yield state, cluster
    finally:
        testbed.clean(name)
        for f in sorted(workdir.iterdir()):
            f.unlink()
        workdir.rmdir()


def shaped(fabric: Fabric) -> Fabric:
    """The same fabric with every link at :data:`SHAPED_BPS`."""
    return replace(fabric, host_link_bps=SHAPED_BPS, fabric_link_bps=SHAPED_BPS)


def mptcp_setup(state: TestbedState, src: int = SRC, dst: int = DST) -> None:
    """Limits on both ends; the server announces its planes 1.. addresses (one subflow each).

    Client-side ``subflow`` endpoints alone do not work here: a subflow bound to nicP would
    have to reach the server's plane-0 address, and the planes are separate networks.
    """
    for host in (src, dst):
        ip("mptcp", "limits", "set", "subflow", "8", "add_addr_accepted", "8",
           netns=state.ns(f"h{host}"))  # fmt: skip
    for plane, addr in enumerate(state.baseline[f"h{dst}"]):
        if plane:
            ip("mptcp", "endpoint", "add", addr, "dev", f"nic{plane}", "signal",
               netns=state.ns(f"h{dst}"))  # fmt: skip


def metrics(cluster: Cluster, host: int) -> dict[str, float]:
    """One daemon's /metrics as ``{'name{labels}': value}``."""
    with urllib.request.urlopen(cluster.daemons[host].metrics_url, timeout=10) as resp:
        page = resp.read().decode()
    return {
        name: float(value)
        for name, _, value in (line.rpartition(" ") for line in page.splitlines())
        if name and not name.startswith("#")
    }


def counters(state: TestbedState, cluster: Cluster) -> dict[str, float]:
    """What explains a goodput: the sender's packets, retransmissions by reason (and the
    spurious ones, and needless tail probes) and send errors; the receiver's duplicates; both
    namespaces' UDP receive-buffer drops (the sender's are ACKs: one dropped leaves the
    packets only it reported unreported) and the kernel's backlog drops."""
    out: dict[str, float] = {"sent_packets": 0.0}
    src = metrics(cluster, SRC)
    for name, value in src.items():
        if name.startswith("mrc_retransmissions_total{"):
            reason = name.split('"')[1]
            out[f"retx_{reason}"] = value
        elif name.startswith("mrc_sent_packets_total{"):
            out["sent_packets"] += value
    out["retx_spurious"] = src.get("mrc_spurious_retransmissions_total", 0.0)
    out["tlp_unneeded"] = src.get("mrc_tlp_unneeded_total", 0.0)
    out["send_errors"] = src.get("mrc_send_errors_total", 0.0)
    out["dst_duplicates"] = metrics(cluster, DST).get("mrc_duplicate_packets_total", 0.0)
    for side, host in (("src", SRC), ("dst", DST)):
        snmp = call_in_netns(state.ns(f"h{host}"), lambda: Path("/proc/net/snmp6").read_text())
        for line in snmp.splitlines():
            key, text = line.split()
            if key == "Udp6RcvbufErrors":
                out[f"{side}_rcvbuf_drops"] = float(text)
    softnet = Path("/proc/net/softnet_stat").read_text().splitlines()
    out["softnet_drops"] = float(sum(int(line.split()[1], 16) for line in softnet))
    return out


def accept(listener: Listener, qp: QueuePair) -> None:
    req = listener.get_request(timeout=30)
    if req is not None:
        listener.accept(req, qp, timeout=30)


def _quiet(line: str) -> None:
    """The harness's own log file keeps every fault; the caller prints what it measured."""


class _Injector:
    """Applies a case's steps from a process of its own, forked before the transfer starts.

    A fault command is milliseconds of Python (the fault records, an ioctl in a namespace,
    nft) and the fault time is when it starts.  Run in a thread of the measuring process it
    competed for the interpreter with the threads that post and stamp the writes, and the
    harness's own cost showed as progress lost: an idle host's NIC taken down cost the
    transfer 5-10 ms.  A real fault comes with no such command, and a separate process
    leaves the measuring one alone.  The fork happens before any thread of the run exists,
    and the child arms the first step (:meth:`Faults.arm`: planned and recorded) before the
    constructor returns, so at the fault time only the kernel calls are left to make.
    """

    def __init__(self, faults: Faults, case: FaultCase) -> None:
        self.case = case
        self.fault_at = 0.0
        self._started = False
        self._joined: float | None = None
        self.steps_ms: tuple[float, ...] = ()  # set by join: see Run.steps_ms
        go_r, self._go = os.pipe()
        result_r, result_w = os.pipe()
        self._pid = os.fork()
        if self._pid == 0:  # the child: never returns
            os.close(self._go)
            os.close(result_r)
            self._child(faults, go_r, result_w)
        os.close(go_r)
        os.close(result_w)
        self._result = os.fdopen(result_r, "rb")
        first = self._result.readline()
        if first != b"armed\n":  # it failed to arm, and has left
            self.join()
            error = json.loads(first).get("error", "?") if first else "ended before arming"
            raise RuntimeError(f"fault {case.name}: {error}")

    def _child(self, faults: Faults, go: int, result: int) -> NoReturn:
        code = 0
        armed = None
        try:
            armed = faults.arm(self.case.apply)
            os.write(result, b"armed\n")
            with os.fdopen(go, "rb") as reader:
                start = reader.readline()
                if start:  # empty: the run ended before the fault time
                    fault_at = float(start)
                    armed.fire()
                    doc: dict[str, object] = {"applied": time.time()}
                    steps: list[float] = []
                    for offset, action in self.case.later:
                        time.sleep(max(0.0, fault_at + offset - time.time()))
                        action(faults)
                        steps.append(time.time())
                    doc["steps"] = steps
                    os.write(result, json.dumps(doc).encode())
                    # Leave only when the parent joins, after its window: tearing down a
                    # copy of the parent's address space is milliseconds of CPU, and at the
                    # fault time it cost the transfer about as much as the fault.
                    reader.read()
        except BaseException as exc:  # reported by the parent's join
            os.write(result, json.dumps({"error": f"{type(exc).__name__}: {exc}"}).encode())
            code = 1
        finally:
            try:
                if armed is not None:
                    armed.cancel()  # a no-op once fired
            finally:
                os._exit(code)

    def start(self) -> None:
        self.fault_at = time.time()
        self._started = True
        os.write(self._go, f"{self.fault_at!r}\n".encode())

    @property
    def started(self) -> bool:
        return self._started

    def join(self) -> float:
        """Wait for every step; how long the first command took (ms; nan if the fault never
        started).  RuntimeError if a step failed."""
        if self._joined is not None:
            return self._joined
        os.close(self._go)  # the child leaves (before the fault time: without applying it)
        with self._result as reader:
            data = reader.read()
        os.waitpid(self._pid, 0)
        self._joined = math.nan
        if not data:
            return self._joined
        doc = json.loads(data)
        if "error" in doc:
            raise RuntimeError(f"fault {self.case.name}: {doc['error']}")
        self._joined = (float(doc["applied"]) - self.fault_at) * 1e3
        self.steps_ms = tuple((float(t) - self.fault_at) * 1e3 for t in doc.get("steps", ()))
        return self._joined


class _Poster:
    """Keeps :data:`OUTSTANDING` writes posted from its own thread, all free slots in one
    post: a post waits for mrcd's reply (a turn of its busy loop, milliseconds), and a loop
    that posted between polls would stamp the completions that came meanwhile late, all at
    once."""

    def __init__(self, qp: QueuePair, src: MemoryRegion, dst: MemoryRegion) -> None:
        self.qp, self.src, self.dst = qp, src, dst
        self.posted = self.done = 0
        self._cond = threading.Condition()
        self._stop = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="live-poster", daemon=True)

    def __enter__(self) -> _Poster:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join()

    def completed(self, n: int) -> None:
        """``n`` more writes completed (re-raises what stopped the poster)."""
        if self._error is not None:
            raise RuntimeError(f"posting writes failed: {self._error}") from self._error
        if n:
            with self._cond:
                self.done += n
                self._cond.notify()

    def _run(self) -> None:
        slots = REGION // WRITE
        try:
            while True:
                with self._cond:
                    while not self._stop and self.posted - self.done >= OUTSTANDING:
                        self._cond.wait()
                    if self._stop:
                        return
                    first, n = self.posted, OUTSTANDING - (self.posted - self.done)
                wrs = []
                for i in range(first, first + n):
                    off = i % slots * WRITE
                    wrs.append(WriteWr(i, (self.src, off, WRITE), self.dst.addr + off,
                                       self.dst.rkey))  # fmt: skip
                self.qp.post_send(wrs)
                with self._cond:
                    self.posted += n
        except BaseException as exc:  # reported by the measuring loop
            self._error = exc


# One mrcd run -------------------------------------------------------------------------------
def _connected(
    a: Context, b: Context, attr: QpAttr | None = None
) -> tuple[CompletionQueue, QueuePair, MemoryRegion, MemoryRegion]:
    """A QP from ``a`` (with ``attr``) connected to one of ``b``'s: the sender's CQ and QP,
    and both sides' regions, every page touched before the clock starts."""
    acq, bcq = a.create_cq(4096), b.create_cq(4096)
    qa, qb = a.create_qp(acq, attr=attr), b.create_qp(bcq)
    amr, bmr = a.reg_mr(REGION), b.reg_mr(REGION)
    listener = b.listen(SERVICE)
    t = threading.Thread(target=lambda: accept(listener, qb))
    t.start()
    qa.connect(DST, SERVICE, timeout=30)
    t.join(30)
    amr.buf[:] = bytes(REGION)
    bmr.buf[:] = bytes(REGION)
    return acq, qa, amr, bmr


def _retransmissions(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """The sender's retransmissions by reason between two :func:`counters` readings."""
    return {
        k.removeprefix("retx_"): after[k] - before.get(k, 0.0)
        for k in after
        if k.startswith("retx_")
    }


def mrcd_run(
    state: TestbedState,
    cluster: Cluster,
    case: FaultCase,
    *,
    pre_s: float = PRE_S,
    window_s: float = WINDOW_S,
    attr: QpAttr | None = None,
) -> Run:
    """Write h0 -> h3 across the fault; the series, the fault time and what mrcd reported.
    ``attr``: the sender's QP attributes (its EV profile, say).  A QP that fails (a write
    completes in error) ends the series there: the run reports it, progress stops."""
    a = Device.open(cluster.daemons[SRC].api_socket).create_context()
    b = Device.open(cluster.daemons[DST].api_socket).create_context()
    faults = Faults(state, log=_quiet)
    injector: _Injector | None = None
    samples: list[tuple[float, int]] = []
    failed: str | None = None
    try:
        injector = _Injector(faults, case)  # before the run's threads: it forks
        acq, qa, amr, bmr = _connected(a, b, attr)
        before = counters(state, cluster)
        fault_at = time.time() + WARMUP_S + pre_s
        end = fault_at + window_s
        with _Poster(qa, amr, bmr) as poster:
            while True:
                now = time.time()
                if not injector.started and now >= fault_at:
                    injector.start()
                    fault_at = injector.fault_at
                if now >= end:
                    break
                if failed is not None:  # nothing more will complete: wait out the window
                    time.sleep(min(0.05, end - now))
                    continue
                wcs = acq.poll_wait(4096, timeout=0.005) or ()
                for wc in wcs:
                    if wc.status is not WcStatus.SUCCESS:
                        failed = failed or f"{wc.status.name} at {time.time() - fault_at:+.3f} s"
                        continue
                    samples.append((time.time(), WRITE))
                if failed is None:
                    poster.completed(len(wcs))
        command_ms = injector.join()
        after = counters(state, cluster)
        with Controller.open(cluster.daemons[SRC].api_socket) as ctl:
            events = [e for e in ctl.recent_ev_events() if float(e.get("time", 0)) >= fault_at]
        first_ev = min((float(e["time"]) for e in events), default=None)
        return Run(
            "mrcd",
            tuple(samples),
            fault_at,
            _retransmissions(before, after),
            None if first_ev is None else (first_ev - fault_at) * 1e3,
            command_ms,
            injector.steps_ms,
            failed,
        )
    finally:
        if injector is not None:
            injector.join()
        faults.restore_all()
        a.close()
        b.close()
        time.sleep(SETTLE_S)  # EVs condemned by the fault come back before the next run


# One TCP or MPTCP run -----------------------------------------------------------------------
def stream_run(
    state: TestbedState,
    case: FaultCase,
    proto: str = "mptcp",
    *,
    pre_s: float = PRE_S,
    window_s: float = WINDOW_S,
) -> Run:
    """The same transfer over kernel MPTCP (``proto="mptcp"``; :func:`mptcp_setup` first)
    or plain TCP (``"tcp"``) between the plane-0 addresses."""
    if proto not in ("tcp", "mptcp"):
        raise ValueError(f"proto must be tcp or mptcp, not {proto!r}")
    faults = Faults(state, log=_quiet)
    injector = _Injector(faults, case)
    total = WARMUP_S + pre_s + window_s
    wait = str(total + 30)
    argv = [sys.executable, "-m", "mrcstack.experiments.stream", "--proto", proto]
    recv = subprocess.Popen(
        ["ip", "netns", "exec", state.ns(f"h{DST}"), *argv, "--role", "recv", "--timeout", wait,
         "--seconds", str(total)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    send: subprocess.Popen[str] | None = None
    try:
        assert recv.stdout is not None
        if '"ready"' not in recv.stdout.readline():
            raise RuntimeError(f"{proto} receiver did not start")
        to = state.baseline[f"h{DST}"][0]
        send = subprocess.Popen(
            ["ip", "netns", "exec", state.ns(f"h{SRC}"), *argv, "--role", "send", "--to", to,
             "--seconds", str(total), "--timeout", wait],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert send.stdout is not None
        if '"connected"' not in send.stdout.readline():
            raise RuntimeError(f"{proto} sender did not connect")
        time.sleep(WARMUP_S + pre_s)  # from its connection, not its spawn
        injector.start()
        send.communicate(timeout=total + 30)
        out, _ = recv.communicate(timeout=60)
        command_ms = injector.join()
        doc = json.loads([line for line in out.splitlines() if line.strip()][-1])
        samples = tuple((int(ms) / 1000, n) for ms, n in doc["per_ms"].items())
        return Run(proto, samples, injector.fault_at, {}, None, command_ms, injector.steps_ms)
    finally:
        for proc in (send, recv):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
        injector.join()
        faults.restore_all()
        time.sleep(SETTLE_S)


def measure(
    state: TestbedState,
    cluster: Cluster,
    case: FaultCase,
    stacks: Sequence[str],
    runs: int,
    *,
    pre_s: float = PRE_S,
    window_s: float = WINDOW_S,
    attr: QpAttr | None = None,
) -> dict[str, list[Run]]:
    """``runs`` transfers per stack across ``case``, the stacks taking turns, on one testbed;
    ``attr``: mrcd's sender QP attributes."""
    unknown = [s for s in stacks if s not in STACKS]
    if unknown:
        raise ValueError(f"unknown stack {unknown[0]!r}: one of {', '.join(STACKS)}")

    def one(stack: str) -> Run:
        if stack == "mrcd":
            return mrcd_run(state, cluster, case, pre_s=pre_s, window_s=window_s, attr=attr)
        return stream_run(state, case, stack, pre_s=pre_s, window_s=window_s)

    out: dict[str, list[Run]] = {stack: [] for stack in stacks}
    for _ in range(runs):  # taking turns: a busy moment of the machine hurts all alike
        for stack in stacks:
            out[stack].append(one(stack))
    return out
