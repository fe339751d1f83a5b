"""Simulator speed: a full 64 MiB MRC transfer over a 4-plane fabric, timed on the wall clock.

Reports simulated packets and payload MB (10**6 bytes delivered) per wall-second, and the
protocol core's CPU microseconds per packet.  The core's share is measured by wrapping every
Connection call with ``time.perf_counter_ns`` (the run is single-threaded and CPU-bound, so
wall time inside a call is its CPU time); the rest is the simulator itself.

``scaling()`` times four 16 MiB cases (1% loss; 16, 256 and 1024 EVs) and reports each as a
ratio to the baseline revision ``BASELINE_REV`` measured in the same run: the revision is
exported from git into a temporary directory and both trees run the same cases in fresh
interpreters, alternately, best of three by process CPU time (this machine's wall clock
varies by a third between runs).  Without git or the revision it falls back to the
recorded ``BASELINE_PKTS_PER_S`` and says so.
Run: ``python -m bench.sim_bench``.
"""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mrcstack import native
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.events import Event
from mrcstack.core.memory import MemoryTable
from mrcstack.core.tx import Outgoing
from mrcstack.fabric import Fabric
from mrcstack.sim.runner import SimConfig
from mrcstack.sim.runner import run as run_sim
from mrcstack.wire import Packet

TRANSFER_BYTES = 64 << 20
FABRIC = Fabric(planes=4, racks=2, hosts_per_rack=2, t1_per_plane=8)
SEED = 7
NS_PER_US = 1000
BYTES_PER_MB = 1e6


class _CoreClock:
    """Nanoseconds spent inside the protocol core, summed over all connections."""

    def __init__(self) -> None:
        self.ns = 0


class _TimedConnection(Connection):
    """A Connection that adds the time of each adapter-facing call to a shared clock."""

    def __init__(
        self, config: ConnectionConfig, memory: MemoryTable, rng: random.Random, clock: _CoreClock
    ) -> None:
        self._clock = clock
        start = time.perf_counter_ns()
        super().__init__(config, memory=memory, rng=rng, now=0.0)
        clock.ns += time.perf_counter_ns() - start

    def post_write(
        self,
        wr_id: int,
        local: bytes | bytearray | memoryview,
        remote_va: int,
        rkey: int,
        *,
        imm: int | None = None,
        now: float,
    ) -> None:
        start = time.perf_counter_ns()
        super().post_write(wr_id, local, remote_va, rkey, imm=imm, now=now)
        self._clock.ns += time.perf_counter_ns() - start

    def receive_datagram(
        self,
        data: bytes | memoryview,
        *,
        now: float,
        port: int,
        ecn: bool = False,
        ev: int = 0,
        tclass: int = 0,
    ) -> None:
        start = time.perf_counter_ns()
        super().receive_datagram(data, now=now, port=port, ecn=ecn, ev=ev, tclass=tclass)
        self._clock.ns += time.perf_counter_ns() - start

    def receive_packet(
        self, pkt: Packet, size: int, *, now: float, port: int, ecn: bool = False
    ) -> None:
        start = time.perf_counter_ns()
        super().receive_packet(pkt, size, now=now, port=port, ecn=ecn)
        self._clock.ns += time.perf_counter_ns() - start

    def packets_to_send(  # (datagrams_to_send is this plus encoding: timed through it)
        self, now: float, limit: int = 1 << 16, data_limit: int | None = None
    ) -> list[Outgoing]:
        start = time.perf_counter_ns()
        out = super().packets_to_send(now, limit, data_limit)
        self._clock.ns += time.perf_counter_ns() - start
        return out

    def get_timer(self) -> float | None:
        start = time.perf_counter_ns()
        out = super().get_timer()
        self._clock.ns += time.perf_counter_ns() - start
        return out

    def handle_timer(self, now: float) -> None:
        start = time.perf_counter_ns()
        super().handle_timer(now)
        self._clock.ns += time.perf_counter_ns() - start

    def next_event(self) -> Event | None:
        start = time.perf_counter_ns()
        out = super().next_event()
        self._clock.ns += time.perf_counter_ns() - start
        return out

    def set_port_state(self, port: int, up: bool, now: float) -> None:
        start = time.perf_counter_ns()
        super().set_port_state(port, up, now)
        self._clock.ns += time.perf_counter_ns() - start


def run(transfer_bytes: int = TRANSFER_BYTES) -> dict[str, float]:
    """Time one transfer; every value is a float so the dict prints and compares easily."""
    clock = _CoreClock()

    def factory(config: ConnectionConfig, memory: MemoryTable, rng: random.Random) -> Connection:
        return _TimedConnection(config, memory, rng, clock)

    cfg = SimConfig(fabric=FABRIC, bytes_per_flow=transfer_bytes, seed=SEED)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    result = run_sim(cfg, connection_factory=factory)
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    packets = result.packets_sent
    core_us = clock.ns / NS_PER_US
    return {
        "transfer_bytes": float(transfer_bytes),
        "packets": float(packets),
        "wall_s": wall,
        "cpu_s": cpu,
        "sim_time_s": result.sim_time_s,
        "packets_per_wall_s": packets / wall,
        "payload_mb_per_wall_s": result.bytes_delivered / wall / BYTES_PER_MB,
        "core_cpu_us_per_packet": core_us / packets,
        "sim_cpu_us_per_packet": (cpu * 1e6 - core_us) / packets,
        "goodput_fraction": result.goodput_fraction,
        "verified": float(result.verified),
    }


#: The revision the scaling ratios are against: before SACK processing became
#: O(newly acknowledged) and before packets travelled decoded.  ``scaling()`` runs it in the
#: same run when git and the revision are at hand (see :func:`baseline`).
BASELINE_REV = "d23974d"
#: The same cases at ``BASELINE_REV`` on this 2-core machine, in packets per wall second:
#: the fallback when the revision cannot be run here (no git, or a source tree without it).
BASELINE_PKTS_PER_S = {
    "loss_1pct": 13_308.0,
    "evs_16": 15_689.0,
    "evs_256": 16_226.0,
    "evs_1024": 23_471.0,
}
LOSSY_BYTES = 16 << 20
#: The scaling cases as SimConfig keywords (beside the fabric): plain data, so the same
#: cases run unchanged in a subprocess at the baseline revision.
SCALING_CASES: dict[str, dict[str, float | int]] = {
    "loss_1pct": {"bytes_per_flow": LOSSY_BYTES, "loss": 0.01, "seed": SEED},
    **{
        f"evs_{n}": {"bytes_per_flow": LOSSY_BYTES, "ev_count": n, "seed": SEED}
        for n in (16, 256, 1024)
    },
}
#: Runs of each case per side; each side's best (least CPU) run counts.
SCALING_REPEAT = 3
REPO = Path(__file__).resolve().parent.parent

# Runs the cases in whatever tree PYTHONPATH names and prints, as JSON, the tree's package
# path (so a mix-up shows) and per case the packets sent and the CPU and wall seconds of
# its best run.  Only SimConfig(fabric=..., **case), run() and packets_sent are used: they
# exist alike at the baseline revision.
_CASE_RUNNER = """
import json, sys, time
import mrcstack
from mrcstack.fabric import Fabric
from mrcstack.sim.runner import SimConfig, run
spec = json.loads(sys.argv[1])
fabric = Fabric(**spec["fabric"])
out = {"package": mrcstack.__file__, "cases": {}}
for name, kw in spec["cases"].items():
    best = None
    for _ in range(spec["repeat"]):
        wall, cpu = time.perf_counter(), time.process_time()
        result = run(SimConfig(fabric=fabric, **kw))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        if best is None or cpu < best["cpu_s"]:
            best = {"packets": result.packets_sent, "cpu_s": cpu, "wall_s": wall,
                    "verified": bool(result.verified)}
    out["cases"][name] = best
print(json.dumps(out))
"""


@dataclass(frozen=True)
class CaseSpeed:
    """One case's best run in one tree: packets sent, CPU and wall seconds."""

    packets: int
    cpu_s: float
    wall_s: float
    verified: bool

    @property
    def per_cpu_s(self) -> float:
        return self.packets / self.cpu_s

    @property
    def per_wall_s(self) -> float:
        return self.packets / self.wall_s


def _run_cases(tree: Path, repeat: int) -> dict[str, CaseSpeed]:
    """The scaling cases in the source tree ``tree``, in a fresh interpreter."""
    spec = {
        "fabric": {"planes": 4, "racks": 2, "hosts_per_rack": 2, "t1_per_plane": 8},
        "cases": SCALING_CASES,
        "repeat": repeat,
    }
    proc = subprocess.run(
        [sys.executable, "-c", _CASE_RUNNER, json.dumps(spec)],
        env={**os.environ, "PYTHONPATH": str(tree)},
        cwd=tree,
        capture_output=True,
        text=True,
        check=True,
    )
    out = json.loads(proc.stdout)
    if not Path(out["package"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"{tree}: imported mrcstack from {out['package']} instead")
    return {name: CaseSpeed(**case) for name, case in out["cases"].items()}


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a process that imports mrcstack from ``tree``."""
    return os.environ | {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"}


def runs_compiled(tree: Path | None) -> bool:
    """Whether mrcstack imported from ``tree`` (None: this one) runs its per-packet modules
    compiled (mrcstack.native; a revision without it runs Python)."""
    if tree is None:
        return native.compiled()
    code = "import mrcstack; n = getattr(mrcstack, 'native', None); print(bool(n and n.compiled()))"
    done = subprocess.run(
        [sys.executable, "-c", code], env=tree_env(tree), capture_output=True, text=True,
        check=True, timeout=60,
    )  # fmt: skip
    return done.stdout.strip() == "True"


def export(rev: str, into: Path) -> bool:
    """Write revision ``rev`` of this repository into ``into``; False if git or the
    revision is not available (a source tarball, a shallow clone).  When this tree runs
    compiled and the revision has the build (mrcstack.native), it is built too, so that a
    comparison sets like against like; the comparisons print which ran compiled."""
    if shutil.which("git") is None:
        return False
    probe = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
        capture_output=True,
        check=False,
    )
    if probe.returncode != 0:
        return False
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", "--format=tar", rev],
        capture_output=True,
        check=True,
    )
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    if native.compiled() and (into / "mrcstack" / "native.py").exists():
        built = subprocess.run(
            [sys.executable, "-m", "mrcstack", "native", "build"], cwd=into,
            env=tree_env(into), capture_output=True, text=True, check=False,
        )  # fmt: skip
        if built.returncode != 0:
            raise RuntimeError(f"building {rev} with mypyc failed:\n{built.stderr[-2000:]}")
    return True


def baseline(
    rev: str = BASELINE_REV, repeat: int = SCALING_REPEAT
) -> tuple[dict[str, CaseSpeed], dict[str, CaseSpeed]] | None:
    """(baseline, now): the scaling cases at ``rev`` and in this tree, measured in this run
    and alternating between the two (this machine's speed drifts); None when ``rev``
    cannot be exported here.  The exported tree lives in a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="mrcstack-baseline-") as tmp:
        old_tree = Path(tmp)
        if not export(rev, old_tree):
            return None
        old: dict[str, CaseSpeed] = {}
        new: dict[str, CaseSpeed] = {}
        for _ in range(repeat):
            for tree, best in ((old_tree, old), (REPO, new)):
                for name, speed in _run_cases(tree, 1).items():
                    if name not in best or speed.cpu_s < best[name].cpu_s:
                        best[name] = speed
        return old, new


def _timed(cfg: SimConfig) -> tuple[float, float]:
    """(core CPU us per packet, verified) of one run with the core timed."""
    clock = _CoreClock()

    def factory(config: ConnectionConfig, memory: MemoryTable, rng: random.Random) -> Connection:
        return _TimedConnection(config, memory, rng, clock)

    result = run_sim(cfg, connection_factory=factory)
    return clock.ns / NS_PER_US / result.packets_sent, float(result.verified)


def scaling(rev: str = BASELINE_REV, repeat: int = SCALING_REPEAT) -> dict[str, float]:
    """4 planes x 8 T1 at 1% loss on every link, and lossless at 16, 256 and 1024 EVs:
    simulated packets per CPU and per wall second (best of ``repeat``), the core's CPU per
    packet, and the ratio to revision ``rev`` measured in this same run (by CPU time, and by
    wall time).  Without git or that revision, the ratio is to the recorded
    ``BASELINE_PKTS_PER_S`` (wall seconds on this 2-core machine), and it says so."""
    measured = baseline(rev, repeat)
    if measured is None:
        print(
            f"sim baseline: revision {rev} is not available here (no git, or not in this "
            "tree's history): ratios are to BASELINE_PKTS_PER_S, recorded on a 2-core "
            "machine, not measured in this run; by wall time"
        )
        now = _run_cases(REPO, repeat)
    else:
        print(f"sim baseline: revision {rev} measured in this run (best of {repeat}, by CPU time)")
        old, now = measured
    out: dict[str, float] = {"baseline_measured": float(measured is not None)}
    for name, kw in SCALING_CASES.items():
        speed = now[name]
        core_us, verified = _timed(SimConfig(fabric=FABRIC, **kw))  # type: ignore[arg-type]
        out[f"{name}_packets_per_cpu_s"] = speed.per_cpu_s
        out[f"{name}_packets_per_wall_s"] = speed.per_wall_s
        out[f"{name}_core_cpu_us_per_packet"] = core_us
        if measured is None:
            out[f"{name}_vs_baseline_wall"] = speed.per_wall_s / BASELINE_PKTS_PER_S[name]
        else:
            base = old[name]
            out[f"{name}_baseline_packets_per_cpu_s"] = base.per_cpu_s
            out[f"{name}_baseline_packets_per_wall_s"] = base.per_wall_s
            out[f"{name}_vs_baseline_cpu"] = speed.per_cpu_s / base.per_cpu_s
            out[f"{name}_vs_baseline_wall"] = speed.per_wall_s / base.per_wall_s
        out[f"{name}_verified"] = float(speed.verified and verified)
    return out


def _print(results: dict[str, float], names: Sequence[str] | None = None) -> None:
    for name in names or sorted(results):
        print(f"{name:24} {results[name]:.6g}")


if __name__ == "__main__":
    _print(run())
    _print(scaling())
