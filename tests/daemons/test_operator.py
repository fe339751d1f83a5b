"""What an operator meets on a live cluster (the default testbed, mrcd on every host, its
default AES-GCM packet authentication): one QPN followed by one string through
``mrc-write-bw``, ``mrcctl``, mrcd's log and tshark; every tshark line of the docs run as
written; ``mrcctl probe -c`` across a downed link; ``testbed status --plane`` while traffic
flows; a transfer's own EV probes counted as answers, not rejections; and every query of
the shipped Grafana dashboard answered by a live Prometheus scraping the daemons."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mrcstack.addrplan import address, ev_value
from mrcstack.daemons.mrcd.ops.promserver import PrometheusServer, run_prometheus
from mrcstack.fabric import Fabric
from tests.support import REPO
from tests.support.dissector import LUA, TSHARK
from tests.support.docs import commands
from tests.support.monitoring import dashboard_queries
from tests.support.programs import by_label
from tests.support.testbeds import Bed, Testbeds
from tests.support.tools import WAIT, tool

FABRIC = Fabric()
SRC, DST = 0, 3  # different racks: every path crosses T0-T1-T0
QPN = re.compile(r"0x[0-9a-f]{6}\b")
pytestmark = [
    pytest.mark.requires_root,
    pytest.mark.requires_program("tshark"),
    pytest.mark.timeout(300),
]


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("op", FABRIC, cluster=True)


def socket_of(bed: Bed, host: int) -> str:
    assert bed.cluster is not None
    return str(bed.cluster.daemons[host].api_socket)


def mrcctl(bed: Bed, *args: str, host: int = SRC) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrcstack.daemons.mrcctl", "--socket", socket_of(bed, host),
         *args],
        capture_output=True, text=True, timeout=WAIT, cwd=REPO, check=False,
    )  # fmt: skip


@contextlib.contextmanager
def traffic(bed: Bed, seconds: float, service: int) -> Iterator[str]:
    """``mrc-write-bw`` h0 -> h3 for ``seconds``; yields the client's QPN as its header
    prints it, and checks both ends succeeded when the block ends."""
    server = subprocess.Popen(
        tool("write_bw", "--socket", socket_of(bed, DST), "--service", str(service),
             netns=bed.ns(DST)),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    client = subprocess.Popen(
        tool("write_bw", "--socket", socket_of(bed, SRC), "--service", str(service),
             "--server-host", f"h{DST}", "-D", str(seconds), netns=bed.ns(SRC)),
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert client.stdout is not None
        header = []
        for line in client.stdout:  # the header comes once the QP is connected
            header.append(line)
            if line.lstrip().startswith("QPNs"):
                break
        found = QPN.findall(header[-1]) if header else []
        assert len(found) == 1, "".join(header)
        yield found[0]
        out, err = client.communicate(timeout=WAIT)
        assert client.returncode == 0, out + err
        srv_out, srv_err = server.communicate(timeout=WAIT)
        assert server.returncode == 0, srv_out + srv_err
    finally:
        for proc in (client, server):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


@contextlib.contextmanager
def capture(netns: str, ifname: str, pcap: Path) -> Iterator[None]:
    """tshark writing what crosses one port to ``pcap`` for the block's length."""
    assert TSHARK is not None
    cap = subprocess.Popen(
        ["ip", "netns", "exec", netns, TSHARK, "-n", "-i", ifname, "-f", "udp port 4791",
         "-a", "duration:60", "-w", str(pcap)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert cap.stderr is not None
    try:
        for line in cap.stderr:
            if "Capturing on" in line:
                break
        yield
    finally:
        if cap.poll() is None:
            cap.send_signal(signal.SIGINT)
        cap.communicate(timeout=30)


def test_one_qpn_is_one_string_in_every_tool(bed: Bed, tmp_path: Path) -> None:
    """The QPN mrc-write-bw prints is, as printed, in mrcctl qp show and ev states, in the
    line mrcd logged when the QP connected, and in tshark's destination QP field."""
    assert bed.cluster is not None
    pcap = tmp_path / "h0-port.pcap"
    with capture(bed.state.ns("p0-t0a"), "h0", pcap), traffic(bed, 3, 7101) as qpn:
        shown = mrcctl(bed, "qp", "show")
        one = mrcctl(bed, "qp", qpn)  # read back in the printed form, too
        states = mrcctl(bed, "ev", "states", "--qp", qpn)
    assert shown.returncode == 0 and f"{qpn}  rts" in shown.stdout, shown.stdout + shown.stderr
    assert one.returncode == 0 and one.stdout.splitlines()[1].startswith(f"{qpn}  rts")
    rows = states.stdout.splitlines()[1:]
    assert len(rows) == 16 and all(row.startswith(f"{qpn}  ") for row in rows), states.stdout
    log = bed.cluster.daemons[SRC].log.read_text()
    assert f"event=qp_ready qpn={qpn} remote=h3" in log
    assert TSHARK is not None
    fields = subprocess.run(
        [TSHARK, "-n", "-r", str(pcap), "-X", f"lua_script:{LUA}", "-Y", "mrc",
         "-T", "fields", "-e", "mrc.bth.destqp"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.split()  # fmt: skip
    assert qpn in fields, f"{qpn} not among {sorted(set(fields))}"  # the ACKs h3 sent h0


def test_every_tshark_line_of_the_docs_runs_as_written(bed: Bed) -> None:
    """In order, from the repository's top folder, on this testbed (MRC_TESTBED): the
    capture on a switch port while traffic flows, then each reading of it."""
    lines = commands("tshark")
    assert len(lines) >= 3 and "testbed exec" in lines[0][1], lines
    env = os.environ | {"MRC_TESTBED": bed.name}
    outputs = {}
    with traffic(bed, 4, 7102):
        for where, line in lines:
            done = subprocess.run(
                ["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True,
                timeout=120, check=False,
            )  # fmt: skip
            assert done.returncode == 0, f"{where}: {line}\n{done.stderr}"
            outputs[line] = done.stdout
    # mrcd's default trailer is an AES-GCM tag, and the lines above read it with no setting:
    # the dissector takes it from the extension's AEAD_TAG flag on every packet.
    assert TSHARK is not None
    rows = subprocess.run(
        [TSHARK, "-n", "-r", "/tmp/mrc.pcap", "-X", f"lua_script:{LUA}", "-Y", "mrc",
         "-T", "fields", "-E", "separator=/t", "-e", "udp.payload", "-e", "mrc.aead_tag",
         "-e", "mrc.icrc", "-e", "mrc.xeth.aead_tag", "-e", "mrc.xeth.trimmed",
         "-e", "_ws.malformed"],
        capture_output=True, text=True, timeout=120, check=True,
    ).stdout.splitlines()  # fmt: skip
    Path("/tmp/mrc.pcap").unlink(missing_ok=True)
    assert len(rows) >= 100
    tagged = 0
    for row in rows:
        payload, tag, icrc, flag, trimmed, malformed = (row.split("\t") + [""] * 6)[:6]
        assert not malformed, row
        if trimmed == "1":
            continue  # a switch cut the trailer off with the payload
        if payload[:2] in ("d8", "d9") and flag == "0":  # the endpoint's EV probes: the ICRC
            assert len(icrc) == 10 and not tag, row
            continue
        assert flag == "1" and len(tag) == 32 and payload.endswith(tag) and not icrc, row
        tagged += 1
    # Every other packet was checked above; the rest were trimmed under load or were the
    # endpoint's probes (12 of 100 in one run on a busy machine), so only a floor here.
    assert tagged >= 10, f"{tagged} of {len(rows)} packets with the tag"
    reads = [out for line, out in outputs.items() if " -r " in line and " -Y " not in line]
    assert reads and all(out.count("\n") >= 100 for out in reads)  # the 100 packets
    assert any("RDMA_WRITE" in out for out in reads)
    assert any(QPN.search(out) for out in reads)


def test_probe_counts_and_names_the_ev_of_a_downed_link(bed: Bed) -> None:
    """mrcctl probe -c 5 h3: five lines per plane and a summary; T1 a's link down on plane
    0 takes the EV through it, which the lines and the summary name with its path."""
    bed.faults.link_down("p0:t0a-t1a")
    try:
        r = mrcctl(bed, "probe", "h3", "-c", "5", "-i", "0.2", "--timeout", "0.5")
    finally:
        bed.faults.link_up("p0:t0a-t1a")
    assert r.returncode == 1, r.stdout + r.stderr  # a path never answered
    lines = r.stdout.splitlines()
    for plane in range(FABRIC.planes):
        ev = ev_value(plane, 0)
        probes = [x for x in lines if x.startswith(f"h3 plane {plane} ev {ev:#05x} seq ")]
        assert len(probes) == 5, r.stdout
        [summary] = [x for x in lines if x.startswith(f"plane {plane} ev {ev:#05x}: ")]
        if plane:
            assert "5 sent, 5 answered, 0% loss, rtt min/avg/max" in summary
    path = address(FABRIC, SRC, DST, 0, 0)
    assert f"h3 plane 0 ev 0x000 seq 5: no answer in 0.5 s, path {path}" in lines
    assert f"plane 0 ev 0x000: 5 sent, 0 answered, 100% loss, path {path}" in lines


def test_status_of_a_plane_fits_a_terminal_and_its_rates_move(bed: Bed, tmp_path: Path) -> None:
    def status(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-m", "mrcstack", "testbed", "status", "--name", bed.name,
             "--interval", "0.5", *args],
            capture_output=True, text=True, timeout=60, cwd=REPO, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        return done.stdout

    def h0_rate(text: str) -> float:
        [row] = [x for x in text.splitlines() if x.startswith("p1:h0-t0a ")]
        return float(row.split()[2])  # a->b pkt/s: what h0 sends into plane 1

    idle = status("--plane", "1")
    summary = status()
    with traffic(bed, 3, 7103):
        time.sleep(0.5)  # past the connection's first round trips
        busy = status("--plane", "1", "--plot", str(tmp_path / "load.png"))
    for text in (idle, busy):
        lines = text.splitlines()
        assert len(lines) <= 24 and max(map(len, lines)) <= 80, text
    assert h0_rate(busy) > 100 and h0_rate(busy) > 10 * h0_rate(idle), (idle, busy)
    planes = [x.split() for x in summary.splitlines() if x[:2] in ("0 ", "1 ", "2 ", "3 ")]
    assert len(planes) == 4 and all(p[4] == "0" for p in planes), summary  # no idle drops
    assert (tmp_path / "load.png").read_bytes()[:4] == b"\x89PNG"


def test_a_transfers_own_probes_are_answers_not_rejections(bed: Bed) -> None:
    """The receiving QP probes the paths its ACKs take, with the ICRC (hundreds a second
    under load), and the sending host answers them: counted in mrc_probe_answers_total by
    how they were authenticated, none in mrc_rejected_packets_total."""
    names = ("mrc_probe_answers_total", "mrc_rejected_packets_total")
    before = [by_label(bed, SRC, name) for name in names]
    with traffic(bed, 2, 7105):
        pass
    answered, rejected = (
        {k: v - was.get(k, 0.0) for k, v in by_label(bed, SRC, name).items()}
        for name, was in zip(names, before, strict=True)
    )
    print(f"\nh0 during 2 s of mrc-write-bw: answered {answered}, rejected {rejected}")
    assert answered["icrc"] >= 10, answered
    assert {k: v for k, v in rejected.items() if k.startswith("probe_") and v} == {}, rejected


def wait_nonempty(prom: PrometheusServer, expr: str, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while not (result := prom.query(expr)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return len(result)


@pytest.mark.requires_program("prometheus")
def test_every_dashboard_query_returns_data_from_a_live_cluster(bed: Bed, tmp_path: Path) -> None:
    """Prometheus scrapes the four daemons while data moves between racks; then every
    expression of the shipped dashboard, as Grafana would send it, returns samples."""
    assert bed.cluster is not None
    targets = [
        d.metrics_url.split("//", 1)[1].split("/", 1)[0] for d in bed.cluster.daemons.values()
    ]
    with run_prometheus(targets, tmp_path / "prom", scrape_interval=1.0) as prom:
        prom.wait_for('up{job="mrcd"} == 1', timeout=30.0, count=len(targets))
        with traffic(bed, 4, 7104):
            assert wait_nonempty(prom, "sum(rate(mrc_placed_bytes_total[10s])) > 0")
        empty = [
            f"{q.panel}: {q.promql('15s')}"
            for q in dashboard_queries()
            if not wait_nonempty(prom, q.promql("15s"), timeout=10.0)
        ]
    assert empty == [], empty
