"""The fabric mapper on the testbed: what probing costs each host, the time from a fault
to every mrcd denying it (median and p95), and a long run with no fault, in which no link
may be flagged and no EV denied.

Each mrcd probes its share of the plan every 10 ms (the default); the mapper's hold-down is
3 s here so the runs follow each other quickly.  The faults rotate over the planes' T0-T1
links and host links; each is timed from the moment it fires to the moment the last mrcd
said it denies the link.
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
import urllib.request
from functools import partial
from pathlib import Path

from mrcstack.daemons.cluster import Cluster
from mrcstack.daemons.mapper_cli import fetch, time_to_deny, wait_for
from mrcstack.daemons.mrcmapper.status import cleared
from mrcstack.fabric import Fabric
from mrcstack.mapper.cost import probe_bytes, probe_cost
from mrcstack.mapper.plan import make_plan
from mrcstack.netns import testbed
from mrcstack.netns.faults import Faults
from mrcstack.netns.state import load
from mrcstack.stats import Method, quantile

NAME = "bmap"
HOLD_DOWN = 3.0
INTERVAL = 0.01
COST_S = 5.0
LINKS = ["p0:t0a-t1c", "p1:h2-t0b", "p2:t0b-t1a", "p3:h1-t0a", "p1:t0a-t1d"]


def _counter(cluster: Cluster, host: int, name: str) -> float:
    with urllib.request.urlopen(cluster.daemons[host].metrics_url, timeout=10) as resp:
        page = resp.read().decode()
    return sum(float(line.split()[-1]) for line in page.splitlines() if line.startswith(name))


def _cost(cluster: Cluster) -> dict[str, float]:
    """Probes each host sent over COST_S, against what the plan says they cost."""
    hosts = range(cluster.state.fabric.hosts)
    before = [_counter(cluster, h, "mrc_link_probes_sent_total") for h in hosts]
    time.sleep(COST_S)
    after = [_counter(cluster, h, "mrc_link_probes_sent_total") for h in hosts]
    pps = max(b - a for a, b in zip(before, after, strict=True)) / COST_S
    planned = probe_cost(make_plan(cluster.state.fabric), INTERVAL)
    size = probe_bytes()
    per_link = planned.host_link_bps * pps / planned.host_packets_per_s
    return {
        "probes/s per host (busiest)": pps,
        "probes/s per host (planned)": planned.host_packets_per_s,
        "probe bytes/s per host": pps * size,
        "probe bytes per packet (IPv6)": size,
        "busiest link, bit/s each way": max(per_link, planned.fabric_link_bps),
        "share of a 200 Mbit/s link (%)": max(per_link, planned.fabric_link_bps) / 200e6 * 100,
        "share of a 100 Gbit/s link (ppm)": max(per_link, planned.fabric_link_bps) / 100e9 * 1e6,
    }


def _quiet(cluster: Cluster, url: str, seconds: float) -> dict[str, float]:
    """``seconds`` with no fault: links flagged and EVs denied, at any time."""
    flagged: set[str] = set()
    denied = 0.0
    hosts = range(cluster.state.fabric.hosts)
    lost_before = sum(_counter(cluster, h, "mrc_link_probes_lost_total") for h in hosts)
    start = time.time()
    first = fetch(url)["counters"]["results"]
    while time.time() < start + seconds:
        doc = fetch(url)
        flagged |= {link["link"] for link in doc["links"] if link["state"] != "up"}
        flagged |= set(doc["denylist"]["links"])
        denied = max(denied, sum(a["denied_evs"] for a in doc["agents"]))
        time.sleep(1.0)
    doc = fetch(url)
    lost = sum(_counter(cluster, h, "mrc_link_probes_lost_total") for h in hosts) - lost_before
    return {
        "no fault: seconds watched": round(time.time() - start),
        "no fault: probe results": doc["counters"]["results"] - first,
        "no fault: probes lost (all hosts)": lost,
        "no fault: links flagged": len(flagged),
        "no fault: EVs denied (most at once)": denied,
    }


def run(runs: int = 20, quiet_s: float = 600.0) -> dict[str, float]:
    testbed.clean(NAME)
    workdir = Path(tempfile.mkdtemp(prefix="mrc-mapper-bench-"))
    try:
        testbed.up(Fabric(), NAME)
        state = load(NAME)
        extra = f"hold_down = {HOLD_DOWN}"
        with Cluster(state, workdir, log_level="warning", mapper=True, mapper_extra=extra) as c:
            assert c.mapper is not None  # asked for
            url = c.mapper.url
            wait_for(url, lambda d: cleared(d) and all(a["connected"] for a in d["agents"]), 30)
            out = _cost(c)
            faults = Faults(state, log=lambda line: None)
            timings = []
            for k in range(runs):
                link = LINKS[k % len(LINKS)]
                down = time_to_deny(faults, url, partial(Faults.link_down, a=link), [link])
                timings.append(down)
            for what, ms in (
                ("named by the mapper", [t.named * 1e3 for t in timings]),
                ("denied on every mrcd", [t.denied * 1e3 for t in timings]),
            ):
                out[f"fault -> {what}, median (ms)"] = statistics.median(ms)
                out[f"fault -> {what}, p95 (ms)"] = float(
                    quantile(ms, 0.95, method=Method.NEAREST_RANK) or 0.0
                )
            out["fault -> denied, runs"] = len(timings)
            out.update(_quiet(c, url, quiet_s))
            return out
    finally:
        testbed.clean(NAME)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    quick = bool(os.environ.get("MRC_BENCH_QUICK"))
    for key, value in run(quiet_s=60.0 if quick else 600.0).items():
        print(f"{key:<44} {value:14,.3f}")
