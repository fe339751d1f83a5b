"""mrcd with ``workers = 2`` on both ends of the default testbed ``tw`` (root): four QPs
over both workers, every write verified under the demo's faults; a worker killed mid-run
fails only its own QPs, and a QP made afterwards works."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from mrcstack.api import AsyncEventType, Device, QpState, WcStatus, WriteWr
from mrcstack.demo import scenario_toml
from mrcstack.fabric import Fabric
from mrcstack.netns.faults.scenario import parse_scenario, run_scenario
from tests.support.apiharness import End, drain
from tests.support.testbeds import Bed, Testbeds
from tests.support.tools import WAIT, one_json, tool

pytestmark = pytest.mark.timeout(300)

FABRIC = Fabric()  # the demo's: its fault scenario names these links and switches
HOSTS = (0, 3)
SERVICE = 861


@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("tw", FABRIC, cluster=True, hosts=HOSTS, extra="workers = 2")


def api_socket(bed: Bed, host: int) -> Path:
    assert bed.cluster is not None
    return bed.cluster.daemons[host].api_socket


def qp_show(bed: Bed, host: int) -> list[dict[str, object]]:
    out = subprocess.run(
        [sys.executable, "-m", "mrcstack.daemons.mrcctl", "--socket", str(api_socket(bed, host)),
         "--json", "qp", "show"],
        check=True, capture_output=True, text=True, timeout=WAIT,
    ).stdout  # fmt: skip
    rows: list[dict[str, object]] = json.loads(out)
    return rows


def workers_of(bed: Bed, host: int) -> list[int]:
    """The pids of mrcd's data-path workers on ``host`` (its spawned children)."""
    assert bed.cluster is not None
    proc = bed.cluster.daemons[host].proc
    assert proc is not None
    pids = []
    for task in Path(f"/proc/{proc.pid}/task").iterdir():
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"spawn_main" in cmdline and b"resource_tracker" not in cmdline:
                pids.append(int(child))
    return pids


def test_four_qps_on_both_workers_verified_under_the_demo_faults(bed: Bed) -> None:
    duration = 8.0
    common = ["--service", str(SERVICE), "--json"]
    server = subprocess.Popen(
        tool("write_bw", "--socket", str(api_socket(bed, 3)), *common, netns=bed.ns(3)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    client = subprocess.Popen(
        tool("write_bw", "--socket", str(api_socket(bed, 0)), "--server-host", "3", *common,
             "-s", "256KiB", "-D", f"{duration:g}", "-q", "4", "--verify", netns=bed.ns(0)),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        # mrcctl qp show on both hosts once the QPs are up: two on each worker.
        deadline = time.monotonic() + WAIT
        shown: dict[int, list[dict[str, object]]] = {}
        while len(shown) < len(HOSTS) and time.monotonic() < deadline:
            for host in HOSTS:
                rows = [q for q in qp_show(bed, host) if q["state"] == "rts"]
                if len(rows) == 4:
                    shown[host] = rows
            time.sleep(0.1)
        for host, rows in shown.items():
            assert sorted(int(str(q["worker"])) for q in rows) == [0, 0, 1, 1], (host, rows)
        assert len(shown) == len(HOSTS), "the QPs never came up"
        scenario = parse_scenario(scenario_toml(duration), FABRIC)
        faults = threading.Thread(
            target=lambda: list(run_scenario(scenario, bed.faults)), daemon=True
        )
        faults.start()
        out, err = client.communicate(timeout=WAIT)
        faults.join(WAIT)
        srv_out, srv_err = server.communicate(timeout=WAIT)
    finally:
        for p in (client, server):
            if p.poll() is None:
                p.kill()
                p.communicate()
        bed.faults.restore_all()
    assert client.returncode == 0, err
    assert server.returncode == 0, srv_err
    c, s = one_json(out), one_json(srv_out)
    print(f"\n4 QPs over 2 workers each end, demo faults: {c['bw_average_gbit_s']:.3f} Gbit/s, "
          f"{c['iterations']} writes verified")  # fmt: skip
    assert c["iterations"] > 0
    assert c["server"]["verified"] == c["iterations"] == s["verified"]
    assert c["server"]["mismatches"] == 0 == s["mismatches"]
    assert sorted(q % 2 for q in c["qpns"]) == [0, 0, 1, 1]
    bed.alive()


def connect(bed: Bed, service: int, size: int) -> tuple[End, End]:
    ends = []
    for host in HOSTS:
        ctx = Device.open(api_socket(bed, host)).create_context()
        cq = ctx.create_cq()
        ends.append(End(ctx, cq, ctx.create_qp(cq), ctx.reg_mr(size)))
    a, b = ends
    listener = b.ctx.listen(service)
    b.qp.post_recv(range(8))
    accepted = threading.Thread(
        target=lambda: listener.accept(listener.get_request(timeout=WAIT), b.qp, timeout=WAIT)
    )
    accepted.start()
    a.qp.connect(HOSTS[1], service, timeout=WAIT)
    accepted.join(WAIT)
    return a, b


def write(a: End, b: End, wr_id: int, size: int) -> None:
    payload = os.urandom(size)
    a.mr.buf[:] = payload
    a.qp.post_send(WriteWr(wr_id, (a.mr, 0, size), b.mr.addr, b.mr.rkey, imm=wr_id))
    assert [(w.wr_id, w.status) for w in drain(a.cq, 1)] == [(wr_id, WcStatus.SUCCESS)]
    assert [w.imm for w in drain(b.cq, 1)] == [wr_id]
    assert bytes(b.mr.buf) == payload


def test_a_killed_worker_fails_only_its_qps_and_new_qps_work(bed: Bed) -> None:
    size = 1 << 20
    pairs = [connect(bed, SERVICE + 10 + i, size) for i in range(4)]
    pids = workers_of(bed, 0)
    assert len(pids) == 2, pids
    victim = pids[0]
    os.kill(victim, signal.SIGKILL)  # one of h0's mrcd's workers, which is ours
    failed, alive = [], []
    for a, b in pairs:
        event = a.ctx.get_async_event(timeout=3.0)
        (failed if event is not None else alive).append((a, b, event))
    assert len(failed) == 2 and len(alive) == 2, [e for _a, _b, e in failed]
    index = failed[0][0].qp.qpn % 2
    for a, _b, event in failed:
        assert event is not None and event.type is AsyncEventType.QP_FATAL
        assert a.qp.qpn % 2 == index
        assert f"data-path worker {index} (pid {victim}) died (killed by signal 9)" in event.reason
        assert a.qp.query().state is QpState.ERROR
    for i, (a, b, _event) in enumerate(alive):
        assert a.qp.qpn % 2 != index and a.qp.query().state is QpState.RTS
        write(a, b, 10 + i, size)
    deadline = time.monotonic() + WAIT
    while len(workers_of(bed, 0)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert victim not in workers_of(bed, 0) and len(workers_of(bed, 0)) == 2
    fresh = [connect(bed, SERVICE + 20 + i, size) for i in range(2)]
    assert sorted(a.qp.qpn % 2 for a, _b in fresh) == [0, 1]
    for i, (a, b) in enumerate(fresh):
        write(a, b, 20 + i, size)
    bed.alive()
