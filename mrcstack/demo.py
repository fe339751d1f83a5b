"""``mrcstack demo`` (``make demo``): MRC riding through faults, in about half a minute.

1. builds the default testbed (4 planes, 2 racks x 2 hosts, 4 T1 per plane; name ``demo``,
   a stale one removed first by exact name) and starts mrcd on every host;
2. runs ``mrc-write-bw --verify`` from h0 to h3 (different racks: every path crosses
   T0-T1-T0) for ``--duration`` seconds (20) with a 100 ms throughput series, while a fault
   scenario flaps four T0-T1 links twice, fails T1 switch ``p1-t1c`` and takes h3's
   plane-2 NIC port down and up;
3. prints a per-second table (goodput from the tool, bytes h0 sent per plane and
   retransmissions from h0's ``/metrics`` over the management network, the faults in the
   rows where they happened), the bytes per plane and the retransmissions by reason;
4. tears everything down in ``finally``.

``--prometheus`` also starts a Prometheus server scraping every daemon and leaves it, the
testbed and the daemons up until Ctrl-C.  See docs/tools.md ("The demo").
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from daemons.cluster import METRICS_PORT, Cluster
from daemons.mrcd.promserver import PrometheusServer, free_tcp_port, start_prometheus
from mrcstack.fabric import Fabric
from netns import testbed
from netns.faults import Faults
from netns.scenario import parse_scenario, run_scenario
from netns.state import TestbedState, exists, faults_path, load, state_path

PROG = "mrcstack demo"
DEFAULT_NAME = "demo"
DEFAULT_DURATION = 20.0
SERVICE = 18515
SRC, DST = 0, 3
WRITE = "1MiB"
SAMPLE_PERIOD = 0.25
FLAPPED = ("p0:t0a-t1a", "p1:t0b-t1b", "p2:t0a-t1c", "p3:t0b-t1d")
FAILED_SWITCH = "p1-t1c"
NIC_HOST, NIC_PLANE = "h3", 2
#: The scenario on a 20 s timeline (scaled to --duration): (at, action, targets, lasts).
TIMELINE: tuple[tuple[float, str, str, float], ...] = (
    (2.0, "link_down", "links = [" + ", ".join(f'"{x}"' for x in FLAPPED) + "]", 1.0),
    (4.0, "link_down", "links = [" + ", ".join(f'"{x}"' for x in FLAPPED) + "]", 1.0),
    (7.0, "switch_fail", f'switch = "{FAILED_SWITCH}"', 4.0),
    (13.0, "nic_down", f'host = "{NIC_HOST}"\nplane = {NIC_PLANE}', 3.0),
)
_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


class DemoError(Exception):
    """The demo could not run; one line, exit status 1."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        print(f"{PROG}: error: {message}", file=sys.stderr)
        sys.exit(2)


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and 1.0 <= value <= 600.0):
        raise argparse.ArgumentTypeError(f"{text}: must be in 1..600 seconds")
    return value


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = _Parser(
        prog=PROG,
        description="Build the default testbed, start mrcd on every host, run mrc-write-bw "
        "h0 -> h3 while links flap, a T1 switch fails and a NIC port goes down and up; "
        "print what happened; tear everything down. Needs root.",
    )
    p.add_argument(
        "--duration",
        type=_seconds,
        default=DEFAULT_DURATION,
        help=f"seconds of traffic (default {DEFAULT_DURATION:g}; faults scale with it)",
    )
    p.add_argument("--json", action="store_true", help="the results as one JSON document")
    p.add_argument(
        "--prometheus",
        action="store_true",
        help="also run Prometheus scraping every daemon; keep it, the testbed and "
        "the daemons up until Ctrl-C",
    )
    p.add_argument(
        "--prometheus-port",
        type=int,
        default=9090,
        metavar="PORT",
        help="Prometheus' port on 127.0.0.1 (default 9090, or a free one if taken)",
    )
    p.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help=f"testbed name (default {DEFAULT_NAME}); removed first if it exists",
    )
    return p.parse_args(list(argv))


def scenario_toml(duration: float) -> str:
    """The fault scenario for a run of ``duration`` seconds (netns.scenario format)."""
    scale = duration / DEFAULT_DURATION
    steps = [f'name = "mrcstack demo, {duration:g} s"']
    for at, action, targets, lasts in TIMELINE:
        steps.append(
            f'[[step]]\nat = {at * scale:.4f}\naction = "{action}"\n{targets}\n'
            f"duration = {lasts * scale:.4f}"
        )
    return "\n\n".join(steps) + "\n"


# Metrics ------------------------------------------------------------------------------------
def scrape(url: str) -> dict[tuple[str, str], float]:
    """``{(name, first label value or ""): value}`` of one /metrics page."""
    with urllib.request.urlopen(url, timeout=5) as resp:
        text = resp.read().decode()
    out: dict[tuple[str, str], float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m:
            labels = _LABEL.findall(m.group(2) or "")
            out[(m.group(1), labels[0][1] if labels else "")] = float(m.group(3))
    return out


def family(sample: dict[tuple[str, str], float], name: str) -> dict[str, float]:
    return {label: v for (n, label), v in sample.items() if n == name and label}


class Sampler:
    """Scrapes h0 and h3 every SAMPLE_PERIOD in a thread: ``(unix time, {host: sample})``."""

    def __init__(self, urls: dict[int, str]) -> None:
        self.urls = urls
        self.samples: list[tuple[float, dict[int, dict[tuple[str, str], float]]]] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def take(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.samples.append((time.time(), {h: scrape(u) for h, u in self.urls.items()}))

    def run(self) -> None:
        while not self.done.is_set():
            self.take()
            self.done.wait(SAMPLE_PERIOD)

    def at(self, when: float, host: int, name: str) -> dict[str, float]:
        """One family of ``host`` at unix time ``when``, linearly interpolated."""
        if not self.samples:
            return {}
        before = [s for s in self.samples if s[0] <= when]
        after = [s for s in self.samples if s[0] >= when]
        a = before[-1] if before else self.samples[0]
        b = after[0] if after else self.samples[-1]
        fa, fb = family(a[1][host], name), family(b[1][host], name)
        if b[0] <= a[0]:
            return fb
        w = (when - a[0]) / (b[0] - a[0])
        return {k: fa.get(k, 0.0) + (fb.get(k, 0.0) - fa.get(k, 0.0)) * w for k in fb}


# Running the tools ---------------------------------------------------------------------------
def _tool(netns: str, socket: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            "ip",
            "netns",
            "exec",
            netns,
            sys.executable,
            "-m",
            "daemons.tools.write_bw",
            "--socket",
            str(socket),
            "--service",
            str(SERVICE),
            "--json",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _result(proc: subprocess.Popen[str], what: str, timeout: float) -> dict[str, Any]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise DemoError(f"{what} did not finish in {timeout:g} s") from None
    lines = [x for x in out.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        raise DemoError(f"{what} failed: {last}")
    doc: dict[str, Any] = json.loads(lines[-1])
    return doc


class _StoppedError(Exception):
    pass


def group(notes: Sequence[tuple[float, str, str]]) -> list[str]:
    """``+2.15 link down a, b``: consecutive (time, action, target) of one action merged."""
    out: list[tuple[float, str, list[str]]] = []
    for t, action, target in notes:
        if out and out[-1][1] == action:
            out[-1][2].append(target)
        else:
            out.append((t, action, [target]))
    return [
        f"+{t:.2f} {action} {', '.join(x for x in targets if x)}".rstrip()
        for t, action, targets in out
    ]


def _short(text: str) -> tuple[str, str]:
    """A scenario event as (action, target): ``("link down", "p0:t0a-t1a")``."""
    text = text.replace(" (automatic restore)", "")
    action, _, rest = text.partition(" ")
    words = [
        w.split("=", 1)[1] if w.startswith(("a=", "switch=", "host=")) else w for w in rest.split()
    ]
    words = [w.replace("plane=", "plane ") for w in words]
    return action.replace("_", " "), " ".join(words)


# The demo -----------------------------------------------------------------------------------
@dataclass
class Run:
    duration: float
    client: dict[str, Any] = field(default_factory=dict)
    server: dict[str, Any] = field(default_factory=dict)
    faults: list[dict[str, Any]] = field(default_factory=list)  # {"wall", "text"}
    sampler: Sampler | None = None
    before: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)
    after: dict[int, dict[tuple[str, str], float]] = field(default_factory=dict)


def log(t0: float, text: str) -> None:
    print(f"[{time.monotonic() - t0:6.1f}s] {text}", file=sys.stderr, flush=True)


def run_traffic(args: argparse.Namespace, state: TestbedState, cluster: Cluster, t0: float) -> Run:
    run = Run(args.duration)
    d0, d3 = cluster.daemons[SRC], cluster.daemons[DST]
    urls = {SRC: d0.metrics_url, DST: d3.metrics_url}
    faults = Faults(state, log=lambda line: None)
    scenario = parse_scenario(scenario_toml(args.duration), state.fabric)
    run.before = {h: scrape(u) for h, u in urls.items()}
    sampler = Sampler(urls)
    run.sampler = sampler
    stop = threading.Event()
    fault_error: list[BaseException] = []

    def sleep(seconds: float) -> None:
        if stop.wait(seconds):
            raise _StoppedError

    def play() -> None:
        start = time.time()
        try:
            for entry in run_scenario(scenario, faults, sleep=sleep, log=lambda line: None):
                action, target = _short(entry.text)
                run.faults.append(
                    {"wall": start + entry.actual, "action": action, "target": target}
                )
        except BaseException as exc:
            if not stop.is_set():
                fault_error.append(exc)

    server = _tool(state.ns(f"h{DST}"), d3.api_socket, "--timeout", "60")
    client = None
    player = threading.Thread(target=play, daemon=True)
    try:
        client = _tool(
            state.ns(f"h{SRC}"),
            d0.api_socket,
            "--server-host",
            str(DST),
            "-s",
            WRITE,
            "-D",
            f"{args.duration:g}",
            "--interval",
            "0.1",
            "--verify",
            "--timeout",
            "60",
        )
        log(
            t0,
            f"mrc-write-bw h{SRC} -> h{DST}: 1 QP, {WRITE} writes, --verify, "
            f"{args.duration:g} s, under faults:",
        )
        sampler.thread.start()
        base = family(run.before[SRC], "mrc_sent_bytes_total")
        deadline = time.monotonic() + 30
        while True:  # the faults start once data flows
            if client.poll() is not None or time.monotonic() > deadline:
                break
            with contextlib.suppress(OSError, ValueError):
                now = family(scrape(urls[SRC]), "mrc_sent_bytes_total")
                if sum(now.values()) - sum(base.values()) > 1 << 20:
                    break
            time.sleep(0.05)
        plan = [(e.at, *_short(e.describe())) for e in scenario.events]
        for line in group(plan):
            print(f"           {line}", file=sys.stderr)
        player.start()
        run.client = _result(client, "mrc-write-bw (client, h0)", args.duration + 90)
        run.server = _result(server, "mrc-write-bw (server, h3)", 30)
    finally:
        stop.set()
        if player.is_alive():
            player.join(30)
        for proc in (client, server):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.communicate()
        sampler.done.set()
        if sampler.thread.is_alive():
            sampler.thread.join(10)
        with contextlib.suppress(Exception):
            faults.restore_all()
    sampler.take()
    run.after = {h: scrape(u) for h, u in urls.items()}
    if fault_error:
        raise DemoError(f"fault scenario failed: {fault_error[0]}")
    return run


def report(run: Run) -> dict[str, Any]:
    """The per-second rows, per-plane bytes and retransmissions of a finished run."""
    c, s = run.client, run.server
    start = float(c["start_time"])
    seconds = max(1, round(float(c["duration_s"])))  # a last partial second only if >= 0.5 s
    sampler = run.sampler
    rows = []
    for k in range(seconds):
        lo, hi = start + k, start + k + 1
        goodput = sum(e["bytes"] for e in c["series"] if k < e["t"] <= k + 1 + 1e-9)
        planes: dict[str, float] = {}
        retx = 0.0
        if sampler is not None:
            a, b = (
                sampler.at(lo, SRC, "mrc_sent_bytes_total"),
                sampler.at(hi, SRC, "mrc_sent_bytes_total"),
            )
            planes = {p: b[p] - a.get(p, 0.0) for p in sorted(b, key=int)}
            ra = sampler.at(lo, SRC, "mrc_retransmissions_total")
            rb = sampler.at(hi, SRC, "mrc_retransmissions_total")
            retx = sum(rb.values()) - sum(ra.values())
        notes = [
            (f["wall"] - start, f["action"], f["target"])
            for f in run.faults
            if lo <= f["wall"] < hi
        ]
        notes += [
            (e["wall"] - start, f"h{DST} app event {e['type']}", f"port {e['port']}")
            for e in s.get("events", [])
            if lo <= e["wall"] < hi and e.get("port") is not None
        ]
        rows.append(
            {
                "t": k,
                "goodput_gbit_s": round(goodput * 8 / 1e9, 3),
                "sent_gbit_s": {p: round(v * 8 / 1e9, 3) for p, v in planes.items()},
                "retransmissions": round(retx),
                "faults": group(sorted(notes)),
            }
        )
    sent0 = family(run.before[SRC], "mrc_sent_bytes_total")
    sent1 = family(run.after[SRC], "mrc_sent_bytes_total")
    recv0 = family(run.before[DST], "mrc_received_bytes_total")
    recv1 = family(run.after[DST], "mrc_received_bytes_total")
    retx0 = family(run.before[SRC], "mrc_retransmissions_total")
    retx1 = family(run.after[SRC], "mrc_retransmissions_total")
    planes_total = {
        p: {
            "h0_sent_bytes": round(sent1[p] - sent0.get(p, 0.0)),
            "h3_received_bytes": round(recv1.get(p, 0.0) - recv0.get(p, 0.0)),
        }
        for p in sorted(sent1, key=int)
    }
    return {
        "duration_s": c["duration_s"],
        "bytes": c["bytes"],
        "goodput_gbit_s": c["bw_average_gbit_s"],
        "peak_gbit_s": c["bw_peak_gbit_s"],
        "verified": s.get("verified", 0),
        "mismatches": s.get("mismatches", 0),
        "rows": rows,
        "planes": planes_total,
        "retransmissions": {r: round(retx1[r] - retx0.get(r, 0.0)) for r in retx1},
        "faults": [
            {"t": round(f["wall"] - start, 3), "action": f["action"], "target": f["target"]}
            for f in run.faults
        ],
    }


def render(doc: dict[str, Any]) -> str:
    planes = list(doc["planes"])
    out = [
        "",
        f"mrc-write-bw h{SRC} -> h{DST} (different racks), 1 QP, {WRITE} writes, --verify: "
        f"{doc['bytes'] / 2**30:.2f} GiB in {doc['duration_s']:.1f} s, "
        f"{doc['goodput_gbit_s']:.2f} Gbit/s average, {doc['peak_gbit_s']:.2f} peak (100 ms)",
        "",
        f"  {'t':>3}  {'goodput':>8}  {'h0 sent per plane [Gbit/s]':^{7 * len(planes)}}  "
        f"{'retx':>5}  faults (+s from the start)",
        f"  {'[s]':>3}  {'[Gbit/s]':>8}  "
        + "".join(f"{'p' + p:>7}" for p in planes)
        + f"  {'':>5}",
    ]
    for row in doc["rows"]:
        sent = "".join(f"{row['sent_gbit_s'].get(p, 0.0):7.2f}" for p in planes)
        notes = "; ".join(row["faults"])
        out.append(
            f"  {row['t']:>3}  {row['goodput_gbit_s']:8.2f}  {sent}  "
            f"{row['retransmissions']:>5}  {notes}".rstrip()
        )
    total = sum(v["h0_sent_bytes"] for v in doc["planes"].values()) or 1
    out += ["", "  plane  h0 sent [MiB]  share  h3 received [MiB]"]
    for p, v in doc["planes"].items():
        out.append(
            f"  p{p:<5} {v['h0_sent_bytes'] / 2**20:13.1f}  {v['h0_sent_bytes'] / total:5.1%}"
            f"  {v['h3_received_bytes'] / 2**20:17.1f}"
        )
    retx = ", ".join(f"{r} {n}" for r, n in doc["retransmissions"].items())
    out += [
        "",
        f"  h0 retransmissions by reason: {retx}",
        f"  verified by h3: {doc['verified']} writes landed intact, {doc['mismatches']} mismatches;"
        " the connection never failed",
        "",
    ]
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        print(
            f"{PROG}: error: needs root (network namespaces): sudo mrcstack demo", file=sys.stderr
        )
        return 1
    try:
        return _main(args)
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted; everything was torn down", file=sys.stderr)
        return 130
    except Exception as exc:
        print(
            f"{PROG}: error: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            file=sys.stderr,
        )
        return 1


def _main(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    name = args.name
    workdir = Path(tempfile.mkdtemp(prefix="mrcstack-demo-"))
    cluster: Cluster | None = None
    prom: PrometheusServer | None = None
    built = False
    try:
        if exists(name):
            testbed.clean(name)
            log(t0, f"removed a stale testbed {name}")
        report_up = testbed.up(Fabric(), name)
        built = True
        log(
            t0,
            f"testbed {name} up: {report_up.namespaces} namespaces, {report_up.links} "
            f"links, 4 planes x 4 T1 ({state_path(name)})",
        )
        state = load(name)
        cluster = Cluster(state, workdir / "mrcd")
        cluster.start()
        log(
            t0,
            f"mrcd running on h0..h{len(cluster.daemons) - 1} (PSK auth, control and "
            f"metrics on the management network)",
        )
        if args.prometheus:
            targets = [f"[{state.mgmt[f'h{h}']}]:{METRICS_PORT}" for h in cluster.daemons]
            try:
                port = free_tcp_port_or(args.prometheus_port)
                prom = start_prometheus(targets, workdir / "prometheus", port=port)
            except Exception as exc:
                raise DemoError(f"prometheus: {exc}") from None
            log(t0, f"Prometheus at {prom.url} scraping {len(targets)} daemons")
        run = run_traffic(args, state, cluster, t0)
        doc = report(run)
        doc["testbed"] = name
        if args.json:
            print(json.dumps(doc))
        else:
            print(render(doc), flush=True)
        if prom is not None:
            _hold(prom, name, cluster)
        return 0
    finally:
        if prom is not None:
            prom.stop()
        if cluster is not None:
            cluster.stop()
        if built or exists(name):
            testbed.clean(name)
        faults_path(name).with_suffix(".log").unlink(missing_ok=True)
        shutil.rmtree(workdir, ignore_errors=True)
        log(t0, f"torn down: testbed {name}, daemons{', Prometheus' if prom else ''}")


def free_tcp_port_or(port: int) -> int:
    """``port`` if nothing listens on 127.0.0.1:port, else a free one."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return free_tcp_port("127.0.0.1")
    return port


def _hold(prom: PrometheusServer, name: str, cluster: Cluster) -> None:
    tool = f"{sys.executable} -m daemons.tools.write_bw"
    s0, s3 = cluster.daemons[SRC].api_socket, cluster.daemons[DST].api_socket
    print(
        f"Prometheus: {prom.url}  (config {prom.datadir / 'prometheus.yml'})\n"
        f"  try: sum by (plane) (rate(mrc_sent_bytes_total[10s]))\n"
        f"       sum by (reason) (mrc_retransmissions_total)\n"
        f"more traffic:\n"
        f"  sudo mrcstack testbed exec --name {name} h3 -- {tool} --socket {s3} &\n"
        f"  sudo mrcstack testbed exec --name {name} h0 -- {tool} --socket {s0} "
        f"--server-host 3 -s 1MiB -D 30 --report_gbits\n"
        f"faults: sudo mrcstack fault --name {name} ...\n"
        f"The testbed, the daemons and Prometheus stay up; Ctrl-C tears everything down.",
        flush=True,
    )
    with contextlib.suppress(KeyboardInterrupt):
        while True:
            signal.pause()
