"""``mrcstack demo``: its scenario and report (pure), its one-line refusal without root,
and a 3 s demo with Prometheus on testbed ``td`` (root), removed by exact name."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from mrcstack import demo, demoreport
from mrcstack.daemons.cluster import METRICS_PORT
from mrcstack.daemons.mrcd.ops.promserver import free_tcp_port
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.faults.scenario import parse_scenario
from mrcstack.netns.state import exists
from mrcstack.netns.topology import mgmt_address
from tests.support import REPO
from tests.support.isolation import run_name
from tests.support.testbeds import leftovers
from tests.support.tools import PY, WAIT

ROOT = REPO
#: Names of their own per run: concurrent runs must never build, or clean, each other's.
DEMO_BED = run_name("td")
TARGET_H0 = f"[{mgmt_address(DEMO_BED, 0)}]:{METRICS_PORT}"


def test_demo_scenario_is_valid_and_scales() -> None:
    fabric = Fabric()
    long = parse_scenario(demo.scenario_toml(20), fabric)
    short = parse_scenario(demo.scenario_toml(3), fabric)
    assert len(long.events) == len(short.events) == 20
    assert {e.action for e in long.events} == {
        "link_down",
        "link_up",
        "switch_fail",
        "switch_restore",
        "nic_down",
        "nic_up",
    }
    assert long.duration == pytest.approx(16.0) and short.duration == pytest.approx(2.4)


def test_demo_report_and_render() -> None:
    start = 1000.0
    series = [
        {"t": round(0.1 * i, 6), "bytes": 25 << 20, "writes": 25, "gbit_s": 2.1}
        for i in range(1, 31)
    ]
    run = demoreport.Run(3.0)
    run.client = {
        "start_time": start,
        "duration_s": 3.0,
        "series": series,
        "bytes": 750 << 20,
        "bw_average_gbit_s": 2.1,
        "bw_peak_gbit_s": 2.2,
    }
    run.server = {
        "verified": 750,
        "mismatches": 0,
        "events": [
            {"wall": start + 2.5, "type": "port_err", "port": 2},
        ],
    }
    run.faults = [
        {"wall": start + 1.2, "action": "link down", "target": "p0:t0a-t1a"},
        {"wall": start + 1.3, "action": "link down", "target": "p1:t0b-t1b"},
        {"wall": start + 2.4, "action": "nic down", "target": "h3 plane 2"},
    ]
    sent = {("mrc_sent_bytes_total", str(p)): 0.0 for p in range(4)}
    retx = {("mrc_retransmissions_total", r): 0.0 for r in ("timeout", "sack")}
    run.before = {0: {**sent, **retx}, 3: {("mrc_received_bytes_total", "0"): 0.0}}
    run.after = {
        0: {
            **{k: 1e8 for k in sent},
            ("mrc_retransmissions_total", "timeout"): 7.0,
            ("mrc_retransmissions_total", "sack"): 3.0,
        },
        3: {("mrc_received_bytes_total", "0"): 9e7},
    }
    doc = demoreport.report(run)
    assert [r["t"] for r in doc["rows"]] == [0, 1, 2]
    assert doc["rows"][1]["faults"] == ["+1.20 link down p0:t0a-t1a, p1:t0b-t1b"]
    assert doc["rows"][2]["faults"] == [
        "+2.40 nic down h3 plane 2",
        "+2.50 h3 app event port_err port 2",
    ]
    assert doc["rows"][0]["goodput_gbit_s"] == pytest.approx(250 * 2**20 * 8 / 1e9, rel=1e-3)
    assert doc["retransmissions"] == {"timeout": 7, "sack": 3}
    assert doc["planes"]["0"] == {"h0_sent_bytes": 100000000, "h3_received_bytes": 90000000}
    text = demoreport.render(doc)
    assert "link down p0:t0a-t1a, p1:t0b-t1b" in text
    assert "h0 retransmissions by reason: timeout 7, sack 3" in text
    assert doc["connection_failures"] == [] and "the connection never failed" in text
    json.dumps(doc)
    # What mrcd logged and the tools saw decides that line, not the demo.
    run.logged_failures = ["h0: qpn=7 reason='retry limit exhausted'"]
    run.server["events"].append(
        {"wall": start + 2.9, "type": "qp_fatal", "port": None, "reason": "remote failed"}
    )
    text = demoreport.render(demoreport.report(run))
    assert "never failed" not in text
    assert (
        "the connection FAILED (2): h0: qpn=7 reason='retry limit exhausted'; "
        "h3 app event qp_fatal: remote failed"
    ) in text


def test_example_prometheus_config_is_the_demos() -> None:
    """examples/prometheus.yml is what the demo runs on its default testbed: the scrape
    targets are the management addresses that testbed's daemons listen on."""
    assert (ROOT / "examples" / "prometheus.yml").read_text() == demo.prometheus_yml()
    targets = demo.prometheus_targets(demo.DEFAULT_NAME, Fabric().hosts)
    assert targets == [f"[{mgmt_address('demo', h)}]:9464" for h in range(4)]
    assert all(f'"{t}"' in demo.prometheus_yml() for t in targets)


@pytest.mark.requires_root  # to drop to nobody
@pytest.mark.requires_program("setpriv")
def test_demo_without_root_is_one_line() -> None:
    r = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            PY,
            "-m",
            "mrcstack",
            "demo",
        ],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        "mrcstack demo: error: needs root (network namespaces): sudo mrcstack demo"
    ]


def _processes_mentioning(text: str) -> list[int]:
    """Pids whose command line contains ``text`` (an exact path, never a name pattern)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if text in cmdline:
                pids.append(int(entry.name))
    return pids


def _prometheus_query(url: str, expr: str) -> list[dict[str, Any]]:
    query = urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(f"{url}/api/v1/query?{query}", timeout=5) as resp:
        doc = json.load(resp)
    assert doc["status"] == "success", doc
    result: list[dict[str, Any]] = doc["data"]["result"]
    return result


@pytest.mark.requires_root
@pytest.mark.requires_program("prometheus")
def test_demo_short_run_with_prometheus() -> None:
    """``mrcstack demo --duration 3 --prometheus``: the report, then a Prometheus server that
    scrapes all four daemons (its HTTP API shows their mrc_ series), up until Ctrl-C; then
    the testbed, the daemons and Prometheus are gone (checked by exact name and path)."""
    if exists(DEMO_BED):
        testbed.clean(DEMO_BED)
    port = free_tcp_port()
    proc = subprocess.Popen(
        [PY, "-m", "mrcstack", "demo", "--duration", "3", "--name", DEMO_BED,
         "--prometheus", "--prometheus-port", str(port)],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        # A suite started as a background job (`make test &`) passes SIGINT on ignored, and
        # the Ctrl-C below would then be lost: the demo gets it as a terminal would send it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # noqa: PLW1509 (takes no lock)
    )  # fmt: skip
    report: list[str] = []
    config = ""
    try:
        assert proc.stdout is not None
        for line in proc.stdout:  # the report, then the Prometheus line; it stays up
            report.append(line)
            if line.startswith("Prometheus: "):
                config = line.split("(config ", 1)[1].split(")", 1)[0]
                break
        assert config, "".join(report) + proc.communicate(timeout=WAIT)[1]
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:  # every daemon scraped: one mrc_planes series per instance
            got = _prometheus_query(url, "count by (instance) (mrc_planes)")
            if len(got) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.25)
        assert len(got) == 4, got
        sent = _prometheus_query(url, f'mrc_sent_bytes_total{{instance="{TARGET_H0}"}}')
        assert sum(float(s["value"][1]) for s in sent) > 0  # h0 sent the demo's traffic
        assert Path(config).read_text() == demo.prometheus_yml(DEMO_BED)
        workdir = str(Path(config).parents[1])
        assert _processes_mentioning(f"--config.file={config}")  # Prometheus runs
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
        if exists(DEMO_BED):
            testbed.clean(DEMO_BED)
    text = "".join(report) + out
    print(text)
    assert proc.returncode == 0, err
    assert "goodput" in text and "h0 sent per plane" in text
    assert "h0 retransmissions by reason: timeout" in text
    assert "0 mismatches" in text and "the connection never failed" in text
    assert "switch fail p1-t1c" in text or "switch fail p1-t1c" in err
    # The mapper ran, named the failed T1's links and had them denied on every mrcd.
    assert "the fabric mapper (every loop every 10 ms" in text
    for link in ("p1:t0a-t1c", "p1:t0b-t1c"):
        assert re.search(rf"s  {link}\s+down", text), link
    assert f"torn down: testbed {DEMO_BED}, daemons, Prometheus" in err
    assert not exists(DEMO_BED) and not leftovers(DEMO_BED)
    assert not _processes_mentioning(workdir)  # no Prometheus, no mrcd of this demo
    assert not Path(workdir).exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
