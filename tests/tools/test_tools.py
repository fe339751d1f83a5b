"""mrc-write-bw, mrc-write-lat and ``mrcstack demo``.

- Pure: the handshake structs, patterns, figures, flags (one line, exit 2), the demo's
  scenario and report.
- Loopback (no root): two mrcds in this process (tests/support/apiharness.py), the tools as
  subprocesses on their sockets; a hand-made client proves --verify catches a bad write
  (and that a server in the middle of -a stops there, or when the next run does not come);
  -a sweeps of both tools, every size verified.
- Testbed (root): testbed ``tt`` (2 planes, 2 racks x 1 host, 2 T1 per plane) with mrcd on
  both hosts (mrcstack.daemons.cluster), the tools in the hosts' namespaces; and a 3 s demo
  (testbed ``tdm``).  Everything removed by exact name in ``finally``.

No timing assertions: figures must be sensible (bytes > 0, verified), not fast.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from mrcstack import demo, demoreport
from mrcstack.api import Device, QpCap, WcOpcode, WriteWr
from mrcstack.daemons.cluster import METRICS_PORT
from mrcstack.daemons.mrcd.ops.promserver import free_tcp_port
from mrcstack.daemons.tools import common
from mrcstack.daemons.tools.common import (
    END,
    KIND_BW,
    KIND_LAT,
    MASK31,
    Hello,
    Pattern,
    UsageError,
    Welcome,
    all_sizes,
    delta31,
    end_stop,
    pack_end,
)
from mrcstack.daemons.tools.flags import ALL_ITERS_BW, ALL_ITERS_LAT, parse_args
from mrcstack.daemons.tools.report import bw_figures, bw_figures_row, lat_stats, peak_note
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from mrcstack.netns.faults.scenario import parse_scenario
from mrcstack.netns.state import exists
from mrcstack.netns.topology import mgmt_address
from tests.support import REPO
from tests.support.apiharness import Daemons
from tests.support.isolation import run_name
from tests.support.testbeds import Bed, Testbeds, leftovers
from tests.support.tools import PY, WAIT, json_lines, one_json, run_pair, tool

ROOT = REPO
#: Names of their own per run: concurrent runs must never build, or clean, each other's.
DEMO_BED = run_name("td")
TARGET_H0 = f"[{mgmt_address(DEMO_BED, 0)}]:{METRICS_PORT}"


SWEEP_64K = [1 << k for k in range(1, 17)]  # -a --max-size 64KiB: 2 .. 65536


# Pure ---------------------------------------------------------------------------------------
def test_hello_and_welcome_round_trip() -> None:
    hello = Hello(KIND_BW, True, 4, 3, 1 << 20, 32, 1, 16, 0x1000, 0x77, 0)
    assert Hello.unpack(hello.pack()) == hello
    assert Welcome.unpack(Welcome(0x2000, 9, 0x3000).pack()) == Welcome(0x2000, 9, 0x3000)
    for bad in (b"", b"XXXX" + hello.pack()[4:], hello.pack()[:10]):
        with pytest.raises(ValueError):
            Hello.unpack(bad)
    with pytest.raises(ValueError, match="qps"):
        Hello.unpack(Hello(KIND_LAT, False, 1, 1, 2, 2, 1, 1, 0, 0).pack())  # index >= qps


def test_hello_more_flag_version_and_end_flags() -> None:
    more = Hello(KIND_BW, False, 1, 0, 2, 1, 32, 128, 0x1000, 0x77, 0, more=True)
    packed = more.pack()
    assert Hello.unpack(packed) == more and Hello.unpack(packed).more
    assert not more.same_run(Hello(KIND_BW, False, 1, 0, 2, 1, 32, 128, 0x1000, 0x77))
    with pytest.raises(ValueError, match="unknown hello flags 0x8"):
        Hello.unpack(packed[:6] + bytes([packed[6] | 0x8]) + packed[7:])  # flags: bytes 6-7
    both = Hello(KIND_BW, False, 1, 0, 2, 1, 32, 128, 0x1000, 0x77, 0x2000, bidir=True)
    assert Hello.unpack(both.pack()) == both and not both.same_run(more)
    with pytest.raises(ValueError, match=f"hello version 1, this tool speaks {common.VERSION}"):
        Hello.unpack(packed[:4] + b"\x01" + packed[5:])  # a version-1 client
    cell = memoryview(bytearray(common.END_LEN))
    pack_end(cell, 0, 7, stop=True)
    assert end_stop(cell, 0) and int.from_bytes(cell[:8], "little") == 7
    pack_end(cell, 0, 7, stop=False)
    assert not end_stop(cell, 0)
    assert all_sizes(8 << 20) == [1 << k for k in range(1, 24)]  # perftest's 2**1 .. 2**23
    assert all_sizes(65536) == SWEEP_64K and all_sizes(2) == [2]


def test_counters_wrap_and_patterns_differ() -> None:
    assert delta31(3, MASK31) == 4
    assert delta31(10, 10) == 0
    assert (END | 5) & MASK31 == 5
    p = Pattern(4096)
    a, b, a2 = bytearray(4096), bytearray(4096), bytearray(4096)
    crc_a = p.fill(memoryview(a), 0, 1)
    crc_b = p.fill(memoryview(b), 0, 2)
    assert p.fill(memoryview(a2), 0, 1) == crc_a and a == a2  # deterministic
    assert a != b and crc_a != crc_b  # every iteration different
    tiny = bytearray(3)
    Pattern(3).fill(memoryview(tiny), 1, 7)  # smaller than the stamp
    big = bytearray(3 << 20)
    Pattern(3 << 20).fill(memoryview(big), 0, 5)  # larger than one random block
    assert big[1 << 20 : 2 << 20] != big[: 1 << 20]


def test_latency_figures_are_perftests() -> None:
    st = lat_stats([i * 1e-6 for i in range(1, 1001)])  # 1..1000 us
    assert st["t_min_us"] == pytest.approx(1)
    assert st["t_max_us"] == pytest.approx(1000)
    assert st["t_typical_us"] == pytest.approx(501)
    assert st["t_avg_us"] == pytest.approx(500.5)
    assert st["t_99_us"] == pytest.approx(991)
    assert lat_stats([]) == {}


def test_flag_defaults_follow_perftest() -> None:
    o = parse_args("mrc-write-bw", KIND_BW, ["--server-host", "h3", "-s", "1MiB", "-D", "2"])
    assert (o.server_host, o.size, o.duration, o.qps, o.tx_depth) == (3, 1 << 20, 2.0, 1, 16)
    assert parse_args("mrc-write-bw", KIND_BW, []).size == 65536
    assert parse_args("mrc-write-bw", KIND_BW, []).tx_depth == 128
    lat = parse_args("mrc-write-lat", KIND_LAT, ["--run_infinitely"])
    assert (lat.size, lat.iters, lat.duration) == (2, 1000, 5.0)
    with pytest.raises(UsageError):
        parse_args("mrc-write-lat", KIND_LAT, ["-q", "2"])  # no such flag for latency


def test_all_sizes_flags() -> None:
    o = parse_args("mrc-write-bw", KIND_BW, ["--server-host", "3", "-a"])
    assert o.all and o.max_size == 8 << 20 and o.iters == ALL_ITERS_BW and o.duration is None
    assert o.sizes() == [1 << k for k in range(1, 24)]
    # the default tx depth follows each size (at most 16 MiB outstanding); -t stays
    assert [o.for_size(s).tx_depth for s in (2, 131072, 1 << 20, 8 << 20)] == [128, 128, 16, 2]
    assert o.for_size(4096).size == 4096
    fixed = parse_args("mrc-write-bw", KIND_BW, ["-a", "-t", "8", "--max-size", "1MiB"])
    assert fixed.for_size(1 << 20).tx_depth == 8 and fixed.sizes()[-1] == 1 << 20
    lat = parse_args("mrc-write-lat", KIND_LAT, ["-a", "--max-size", "64KiB", "-n", "7"])
    assert (lat.sizes(), lat.iters) == (SWEEP_64K, 7)
    assert parse_args("mrc-write-lat", KIND_LAT, ["-a"]).iters == ALL_ITERS_LAT
    assert parse_args("mrc-write-lat", KIND_LAT, ["-a", "-D", "2"]).duration == 2.0
    assert parse_args("mrc-write-bw", KIND_BW, ["-a", "--max-size", "2"]).sizes() == [2]
    assert parse_args("mrc-write-bw", KIND_BW, ["-a", "--max-size", "2GiB"]).max_size == 1 << 31
    assert parse_args("mrc-write-bw", KIND_BW, []).iters == 5000  # without -a: unchanged
    for bad in (["-a", "--max-size", "3000"], ["-a", "--max-size", "1"], ["--max-size", "8"]):
        with pytest.raises(UsageError, match="--max-size"):
            parse_args("mrc-write-bw", KIND_BW, bad)


@pytest.mark.parametrize(
    ("name", "args", "needle"),
    [
        ("write_bw", ["-s", "0"], "-s/--size"),
        ("write_bw", ["-s", "lots"], "bad size"),
        ("write_bw", ["-n", "x"], "-n/--iters"),
        ("write_bw", ["-q", "0"], "-q/--qp"),
        ("write_bw", ["-D", "-1"], "-D/--duration"),
        ("write_bw", ["--server-host", "three"], "--server-host"),
        ("write_bw", ["--bogus"], "unrecognized arguments"),
        ("write_lat", ["-t", "4"], "unrecognized arguments"),
        ("write_lat", ["--interval", "0"], "--interval"),
        ("write_bw", ["-a", "-s", "4096"], "argument -s/--size: not allowed with argument -a"),
        ("write_lat", ["-s", "4096", "-a"], "argument -a/--all: not allowed with argument -s"),
        ("write_bw", ["-a", "--run_infinitely"], "not allowed with argument --run_infinitely"),
        ("write_lat", ["--run_infinitely", "-a"], "not allowed with argument --run_infinitely"),
        ("write_bw", ["-a", "--max-size", "100KiB"], "100KiB: must be a power of two"),
        ("write_lat", ["-a", "--max-size", "4GiB"], "4GiB: must be a power of two"),
        ("write_bw", ["--max-size", "64KiB"], "--max-size: only with -a/--all"),
        ("write_bw", ["-b", "--verify"], "-b/--bidirectional: not allowed with argument --verify"),
        ("write_lat", ["-b"], "unrecognized arguments"),  # as ib_write_lat: no -b
    ],
)
def test_bad_flags_are_one_line_and_exit_2(name: str, args: list[str], needle: str) -> None:
    r = subprocess.run(
        tool(name, *args), check=False, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 2, r
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert lines[0].startswith(f"mrc-{name.replace('_', '-')}: error: ")


def test_no_daemon_is_one_line_and_exit_1(tmp_path: Path) -> None:
    sock = tmp_path / "none.sock"
    r = subprocess.run(
        tool("write_bw", "--socket", str(sock), "--server-host", "1"),
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1
    assert r.stderr.strip() == f"mrc-write-bw: error: cannot connect to mrcd at {sock}: " + (
        "No such file or directory"
    )


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


# Loopback -----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def loop_daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemons]:
    d = Daemons(tmp_path_factory.mktemp("tools")).start()
    try:
        yield d
    finally:
        d.stop()


def test_loopback_bw_verify_json(loop_daemons: Daemons) -> None:
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    srv, cli = run_pair(
        "write_bw",
        tool("write_bw", "--socket", s3, "--service", "701", "--json"),
        tool(
            "write_bw",
            "--socket",
            s0,
            "--server-host",
            "3",
            "--service",
            "701",
            "-s",
            "64KiB",
            "-n",
            "200",
            "-t",
            "8",
            "-q",
            "2",
            "--verify",
            "--json",
            "--interval",
            "0.05",
        ),
    )
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    c, s = one_json(cli.stdout), one_json(srv.stdout)
    assert c["iterations"] == 400 and c["bytes"] == 400 * 65536
    assert c["server"] == {"writes": 400, "bytes": 400 * 65536, "verified": 400, "mismatches": 0}
    assert s["verified"] == 400 and s["mismatches"] == 0 and s["first_mismatch"] is None
    assert c["bw_average_MB_s"] > 0 and c["bw_peak_MB_s"] >= c["bw_average_MB_s"]
    assert len(c["qpns"]) == 2 and (c["qps"], c["tx_depth"], c["verify"]) == (2, 8, True)
    assert sum(e["bytes"] for e in c["series"]) <= c["bytes"]


def test_loopback_bw_bidirectional(loop_daemons: Daemons) -> None:
    """-b: the server writes back while the client writes; each side counts both ways and
    its figures sum them, as perftest's -b does."""
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    srv, cli = run_pair(
        "write_bw",
        tool("write_bw", "--socket", s3, "--service", "705", "--json"),
        tool("write_bw", "--socket", s0, "--server-host", "3", "--service", "705", "-s", "16KiB",
             "-n", "300", "-t", "16", "-q", "2", "-b", "--json"),
    )  # fmt: skip
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    c, s = one_json(cli.stdout), one_json(srv.stdout)
    size = 16384
    assert c["bidirectional"]["sent"] == {"writes": 600, "bytes": 600 * size}
    assert s["bidirectional"]["received"] == c["bidirectional"]["sent"]
    back = s["bidirectional"]["sent"]["writes"]
    assert back > 0 and c["bidirectional"]["received"]["writes"] == back  # every one arrived
    for doc in (c, s):
        both = (600 + back) * size
        rate = both / doc["duration_s"] / 2**20
        assert doc["bw_average_MB_s"] == pytest.approx(rate, rel=0.01), doc
    assert "bidirectional" not in one_json(run_pair(
        "write_bw",
        tool("write_bw", "--socket", s3, "--service", "706", "--json"),
        tool("write_bw", "--socket", s0, "--server-host", "3", "--service", "706", "-n", "10",
             "--json"),
    )[1].stdout)  # fmt: skip


def test_loopback_bw_run_infinitely_until_ctrl_c(loop_daemons: Daemons) -> None:
    """--run_infinitely -D 0.5: a JSON line per period until SIGINT, then the run's report
    (interrupted) with the server's verified counts; both tools exit 0."""
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    size = 65536
    srv = subprocess.Popen(
        tool("write_bw", "--socket", s3, "--service", "711", "--json"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    cli = subprocess.Popen(
        tool("write_bw", "--socket", s0, "--server-host", "3", "--service", "711",
             "-s", str(size), "--verify", "--run_infinitely", "-D", "0.5", "--json"),
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert cli.stdout is not None
        for line in cli.stdout:
            lines.put(line)
        lines.put("")  # end of output

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        periods = []
        while len(periods) < 2:  # two periods of 0.5 s, then Ctrl-C
            line = lines.get(timeout=WAIT)
            assert line, f"the client ended early: {cli.wait(WAIT)} {cli.stderr.read()}"  # type: ignore[union-attr]
            periods.append(json.loads(line))
        cli.send_signal(signal.SIGINT)
        assert cli.wait(WAIT) == 0, cli.stderr.read()  # type: ignore[union-attr]
        reader.join(WAIT)
        rest = []
        while (line := lines.get_nowait()) != "":
            rest.append(json.loads(line))
        s_out, s_err = srv.communicate(timeout=WAIT)
    finally:
        for proc in (cli, srv):
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert srv.returncode == 0, s_err
    *more_periods, final = rest
    for p in periods + more_periods:
        assert p["report"] == "period" and p["role"] == "client" and p["size"] == size
        assert p["iterations"] > 0 and p["bytes"] == p["iterations"] * size
        assert p["bw_average_MB_s"] > 0 and p["bw_peak_MB_s"] >= p["bw_average_MB_s"]
    assert "report" not in final and final["interrupted"] is True
    assert final["iterations"] >= sum(p["iterations"] for p in periods + more_periods)
    assert final["bytes"] == final["iterations"] * size
    assert final["server"]["verified"] == final["iterations"]
    assert final["server"]["mismatches"] == 0
    s = one_json(s_out)
    assert s["verified"] == final["iterations"] and s["mismatches"] == 0


def test_loopback_lat_json(loop_daemons: Daemons) -> None:
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    srv, cli = run_pair(
        "write_lat",
        tool("write_lat", "--socket", s3, "--service", "702", "--json"),
        tool(
            "write_lat",
            "--socket",
            s0,
            "--server-host",
            "3",
            "--service",
            "702",
            "-n",
            "100",
            "-s",
            "4096",
            "--verify",
            "--json",
        ),
    )
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    c, s = one_json(cli.stdout), one_json(srv.stdout)
    assert c["iterations"] == 100 and s["iterations"] == 100
    assert c["mismatches"] == 0 and c["server"]["mismatches"] == 0 and s["mismatches"] == 0
    assert 0 < c["t_min_us"] <= c["t_typical_us"] <= c["t_max_us"]
    assert c["t_99_us"] <= c["t_99_9_us"] <= c["t_max_us"]


def _hand_made_bw_run(
    daemons: Daemons, service: int, *, more: bool, bad: bool, server_args: Sequence[str] = ()
) -> tuple[common.Result | None, subprocess.CompletedProcess[str]]:
    """A hand-made bw client: writes 0 and 1 with --verify checksums (write 1's is wrong if
    ``bad``), END, the server's counts; its hello says another run follows if ``more``
    (none does).  Returns the counts and the server's outcome (it must exit within WAIT s
    of them)."""
    size = 4096
    server = tool(
        "write_bw", "--socket", str(daemons.sockets[3]), "--service", str(service), "--json"
    )
    srv = subprocess.Popen(
        [*server, *server_args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        with Device.open(daemons.sockets[0]) as dev, dev.create_context() as ctx:
            mr = ctx.reg_mr(2 * size + common.REPLY_AREA)
            cq = ctx.create_cq()
            qp = ctx.create_qp(cq, cap=QpCap(max_recv_wr=64))
            qp.post_recv(range(64))
            reply = 2 * size
            hello = Hello(KIND_BW, True, 1, 0, size, 2, 1, 1, mr.addr + reply, mr.rkey, more=more)
            w = common.connect(qp, 3, service, hello, 30)
            pattern = Pattern(size)
            good = pattern.fill(mr.buf[:size], 0, 0) & MASK31
            second = pattern.fill(mr.buf[size : 2 * size], 0, 1) & MASK31
            qp.post_send(
                [
                    WriteWr(0, (mr, 0, size), w.slots_addr, w.rkey, good),
                    WriteWr(1, (mr, size, size), w.slots_addr + size, w.rkey, second + bad),
                ]
            )
            qp.post_send(WriteWr(1 << 62, (mr, 0, 8), w.ctrl_addr, w.rkey, END | 2))
            result = None
            deadline = time.monotonic() + WAIT
            while result is None and time.monotonic() < deadline:
                for wc in cq.poll_wait(16, timeout=1):
                    assert wc.ok, wc
                    if wc.opcode is WcOpcode.RECV_RDMA_WITH_IMM and (wc.imm or 0) & END:
                        result = common.Result.unpack_from(mr.buf, reply + common.RESULT_CELL)
        out, err = srv.communicate(timeout=WAIT)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    return result, subprocess.CompletedProcess(server, srv.returncode, out, err)


@pytest.mark.parametrize("more", [False, True])
def test_verify_catches_a_write_that_did_not_land_as_sent(
    loop_daemons: Daemons, more: bool
) -> None:
    """Write 0 is fine, write 1 claims a checksum its bytes do not have.  In the middle of
    -a (``more``) the server stops there too, naming the size, without waiting for the
    next run."""
    # A --timeout far beyond WAIT: a server that waited for the next run would not exit
    # within WAIT s, and communicate() would fail the test (no clock compared here).
    result, srv = _hand_made_bw_run(
        loop_daemons, 703 + more, more=more, bad=True, server_args=["--timeout", str(10 * WAIT)]
    )
    assert result == common.Result(writes=2, bytes=2 * 4096, verified=2, mismatches=1)
    assert srv.returncode == 1
    doc = one_json(srv.stdout)
    assert doc["mismatches"] == 1 and doc["first_mismatch"] == {"qp": 0, "write": 1}
    assert ("run" in doc) is more
    where = "size 4096: " if more else ""
    last = srv.stderr.strip().splitlines()[-1]
    assert last.startswith(f"mrc-write-bw: error: {where}verify: 1 writes"), srv.stderr


def test_all_sizes_server_gives_up_when_the_next_run_does_not_come(
    loop_daemons: Daemons,
) -> None:
    result, srv = _hand_made_bw_run(
        loop_daemons, 705, more=True, bad=False, server_args=["--timeout", "1"]
    )
    assert result == common.Result(writes=2, bytes=2 * 4096, verified=2, mismatches=0)
    assert srv.returncode == 1
    assert json_lines(srv.stdout)[0]["run"] == 0  # the run itself was reported
    assert srv.stderr.strip().splitlines() == [
        "mrc-write-bw: error: the client's next run (after size 4096) did not come within 1 s"
    ]


@pytest.mark.parametrize("name", ["write_bw", "write_lat"])
def test_a_server_with_a_timeout_gives_up_waiting_for_its_first_client(
    loop_daemons: Daemons, name: str
) -> None:
    """--timeout bounds the wait for the first client too (without it, a server waits on)."""
    start = time.monotonic()
    srv = subprocess.run(
        tool(name, "--socket", str(loop_daemons.sockets[3]), "--service", "733", "--timeout", "3"),
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
    )  # fmt: skip
    took = time.monotonic() - start
    print(f"\n{name}: gave up after {took:.2f} s (interpreter start included)")
    assert srv.returncode == 1
    assert srv.stderr.strip().splitlines()[-1] == (
        f"mrc-{name.replace('_', '-')}: error: a client did not come within 3 s"
    )
    assert took < 20  # (it waited for ever before; measured about 3.5 s)


def test_the_peak_is_a_rate_over_enough_writes() -> None:
    """16 MiB writes at 207 MB/s, 0.1 s intervals: an interval holds one or two of them, so
    a per-interval peak could only read 160 or 320 MB/s.  Windows of at least
    PEAK_MIN_WRITES writes read the real rate; too few writes in all: no peak."""
    size, rate, interval = 16 << 20, 207 * (1 << 20), 0.1
    done = [(i + 1) * size / rate for i in range(40)]  # completion times of 40 writes
    entries = [
        {"bytes": n * size, "writes": n}
        for k in range(int(done[-1] / interval))
        for n in [sum(1 for t in done if k * interval <= t < (k + 1) * interval)]
    ]
    assert max(e["bytes"] / interval for e in entries) / (1 << 20) == 320  # the old figure
    fig = bw_figures(40 * size, 40, done[-1], entries, interval)
    assert fig["bw_peak_MB_s"] == pytest.approx(207, rel=0.1)
    few = bw_figures(5 * size, 5, done[4], entries[:4], interval)
    assert few["bw_peak_MB_s"] is None and few["bw_average_MB_s"] > 0
    assert bw_figures_row(size, 5, few, gbits=False).split()[2] == "-"
    assert "held 10 writes" in (peak_note([fig, few]) or "") and peak_note([fig]) is None


def test_a_16mib_write_run_prints_no_meaningless_peak(loop_daemons: Daemons) -> None:
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    srv, cli = run_pair(
        "write_bw",
        tool("write_bw", "--socket", s3, "--service", "734", "--json"),
        tool("write_bw", "--socket", s0, "--server-host", "3", "--service", "734",
             "-s", "16MiB", "-D", "2", "--json"),
    )  # fmt: skip
    assert cli.returncode == 0 and srv.returncode == 0, cli.stderr + srv.stderr
    for doc in (one_json(cli.stdout), one_json(srv.stdout)):
        peak, avg = doc["bw_peak_MB_s"], doc["bw_average_MB_s"]
        print(f"\n16 MiB writes: peak {peak} MB/s, average {avg} MB/s, {doc['iterations']} writes")
        assert peak is None or avg <= peak <= 1.25 * avg, doc


def sweep_client(name: str, socket_path: str, service: int, n: int) -> list[str]:
    """A client of the server on h3: -a up to 64 KiB, ``n`` writes a size, verified, JSON."""
    return tool(
        name,
        *("--socket", socket_path, "--server-host", "3", "--service", str(service)),
        *("-a", "--max-size", "64KiB", "-n", str(n), "--verify", "--json"),
    )


def test_loopback_all_sizes_bw_verify_json(loop_daemons: Daemons) -> None:
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    n = 20
    srv, cli = run_pair(
        "write_bw",
        # -a on the server too, as with perftest: accepted, ignored
        tool("write_bw", "--socket", s3, "--service", "706", "-a", "--json"),
        sweep_client("write_bw", s0, 706, n),
    )
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    *runs, summary = json_lines(cli.stdout)
    assert [d["size"] for d in runs] == SWEEP_64K
    assert [d["run"] for d in runs] == list(range(len(SWEEP_64K)))
    for d in runs:
        size = d["size"]
        assert (d["iterations"], d["bytes"], d["tx_depth"], d["verify"]) == (n, n * size, 128, True)
        assert d["server"] == {"writes": n, "bytes": n * size, "verified": n, "mismatches": 0}
        assert d["bw_average_MB_s"] > 0 and d["bw_peak_MB_s"] >= d["bw_average_MB_s"]
        assert d["msg_rate_mpps"] > 0 and d["duration_s"] > 0 and not d["interrupted"]
    assert summary["report"] == "all" and summary["sizes"] == SWEEP_64K
    assert [r["size"] for r in summary["rows"]] == SWEEP_64K
    assert [r["bw_average_MB_s"] for r in summary["rows"]] == [d["bw_average_MB_s"] for d in runs]
    assert all(r["verified"] == n and r["mismatches"] == 0 for r in summary["rows"])
    total = len(SWEEP_64K) * n
    assert summary["server"] == {
        "writes": total,
        "bytes": n * sum(SWEEP_64K),
        "verified": total,
        "mismatches": 0,
    }
    assert not summary["interrupted"] and summary["duration_s"] > 0
    served = json_lines(srv.stdout)
    assert [d["size"] for d in served] == SWEEP_64K
    assert all(d["verified"] == n and d["mismatches"] == 0 for d in served)
    assert srv.stderr == ""


def test_loopback_all_sizes_lat_verify_json(loop_daemons: Daemons) -> None:
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    n = 10
    srv, cli = run_pair(
        "write_lat",
        tool("write_lat", "--socket", s3, "--service", "707", "--json"),
        sweep_client("write_lat", s0, 707, n),
    )
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    *runs, summary = json_lines(cli.stdout)
    assert [d["size"] for d in runs] == SWEEP_64K
    for d in runs:
        assert d["iterations"] == n and d["mismatches"] == 0 and d["verify"]
        assert d["server"] == {"writes": n, "bytes": n * d["size"], "verified": n, "mismatches": 0}
        assert 0 < d["t_min_us"] <= d["t_typical_us"] <= d["t_max_us"]
        assert d["t_min_us"] <= d["t_avg_us"] <= d["t_max_us"]
    assert summary["report"] == "all" and summary["sizes"] == SWEEP_64K
    assert [r["t_typical_us"] for r in summary["rows"]] == [d["t_typical_us"] for d in runs]
    assert summary["mismatches"] == 0 == summary["server_mismatches"]
    served = json_lines(srv.stdout)
    assert [d["size"] for d in served] == SWEEP_64K
    assert all(d["iterations"] == n and d["mismatches"] == 0 for d in served)


def test_loopback_all_sizes_text_table(loop_daemons: Daemons) -> None:
    """Text: the header once, one column line, a row per size in order, one table end."""
    s0, s3 = str(loop_daemons.sockets[0]), str(loop_daemons.sockets[3])
    for name, service in (("write_bw", "708"), ("write_lat", "709")):
        srv, cli = run_pair(
            name,
            tool(name, "--socket", s3, "--service", service),
            tool(
                name,
                *("--socket", s0, "--server-host", "3", "--service", service),
                *("-a", "--max-size", "16", "-n", "5", "--verify"),
            ),
        )
        assert cli.returncode == 0, cli.stderr
        assert srv.returncode == 0, srv.stderr
        lines = cli.stdout.splitlines()
        assert sum("RDMA_Write" in x for x in lines) == 1
        assert sum("#bytes" in x for x in lines) == 1
        assert ": all: 2 .. 16 [B], a connection each" in cli.stdout
        head = next(i for i, x in enumerate(lines) if "#bytes" in x)
        rows = [x.split() for x in lines[head + 1 : head + 5]]
        assert [(r[0], r[1]) for r in rows] == [(str(s), "5") for s in (2, 4, 8, 16)]
        assert lines[head + 5].startswith("-----") and " over 4 sizes, 0 mismatches" in cli.stdout
        assert sum("RDMA_Write" in x for x in srv.stdout.splitlines()) == 1


# Testbed ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bed(testbeds: Testbeds) -> Bed:
    return testbeds.up("tt", Fabric(planes=2, racks=2, hosts_per_rack=1, t1_per_plane=2),
                       cluster=True)  # fmt: skip


def _on_bed(
    bed: Bed,
    name: str,
    service: int,
    server: Sequence[str],
    client: Sequence[str],
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    state, cluster = bed.state, bed.cluster
    assert cluster is not None
    s0, s1 = str(cluster.daemons[0].api_socket), str(cluster.daemons[1].api_socket)
    common_args = ["--service", str(service)]
    return run_pair(
        name,
        tool(name, "--socket", s1, *common_args, *server, netns=state.ns("h1")),
        tool(
            name, "--socket", s0, "--server-host", "1", *common_args, *client, netns=state.ns("h0")
        ),
    )


def test_bw_between_racks_verified(bed: Bed) -> None:
    srv, cli = _on_bed(
        bed,
        "write_bw",
        801,
        ["--json"],
        ["-s", "256KiB", "-D", "2", "-q", "2", "--verify", "--json", "--interval", "0.1"],
    )
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    c, s = one_json(cli.stdout), one_json(srv.stdout)
    print(f"\nmrc-write-bw h0 -> h1, 2 QPs, 256 KiB, --verify: {c['bw_average_gbit_s']:.2f} Gbit/s")
    for key in (
        "iterations",
        "bytes",
        "duration_s",
        "bw_peak_MB_s",
        "bw_average_MB_s",
        "bw_peak_gbit_s",
        "bw_average_gbit_s",
        "msg_rate_mpps",
        "start_time",
        "interval_s",
        "series",
        "qpns",
        "server",
        "events",
        "qp_attr",
    ):
        assert key in c, key
    assert c["bytes"] > 0 and c["iterations"] * 262144 == c["bytes"]
    assert c["server"]["verified"] == c["iterations"] == s["verified"]
    assert c["server"]["mismatches"] == 0 == s["mismatches"]
    assert c["series"] and all(e["t"] > 0 for e in c["series"])
    assert sum(e["bytes"] for e in c["series"]) > 0
    assert 1.5 < c["duration_s"] < 30


def test_bw_text_table_and_report_gbits(bed: Bed) -> None:
    srv, cli = _on_bed(bed, "write_bw", 802, [], ["-s", "1MiB", "-n", "50", "--report_gbits"])
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    lines = cli.stdout.splitlines()
    head = next(i for i, x in enumerate(lines) if "#bytes" in x)
    assert "BW peak[Gb/sec]" in lines[head] and "MsgRate[Mpps]" in lines[head]
    size, iters, _peak, avg, rate = lines[head + 1].split()
    assert (size, iters) == ("1048576", "50") and float(avg) > 0 and float(rate) > 0
    assert "RDMA_Write BW Test" in cli.stdout and "waiting for a client" in srv.stdout


def test_lat_between_racks(bed: Bed) -> None:
    srv, cli = _on_bed(
        bed, "write_lat", 803, ["--json"], ["-n", "300", "--verify", "--json", "--interval", "0.1"]
    )
    assert cli.returncode == 0, cli.stderr
    assert srv.returncode == 0, srv.stderr
    c = one_json(cli.stdout)
    print(f"\nmrc-write-lat h0 -> h1: t_typical {c['t_typical_us']:.1f} us")
    assert c["iterations"] == 300 and c["mismatches"] == 0 and c["server"]["writes"] == 300
    assert c["t_typical_us"] > 0 and c["series"]


def test_unknown_profile_is_one_line(bed: Bed) -> None:
    cluster = bed.cluster
    assert cluster is not None
    r = subprocess.run(
        tool(
            "write_bw",
            "--socket",
            str(cluster.daemons[0].api_socket),
            "--server-host",
            "1",
            "--ev-profile",
            "77",
            "--timeout",
            "5",
        ),
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert r.returncode == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("mrc-write-bw: error: ") and "77" in lines[0]


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
    assert f"torn down: testbed {DEMO_BED}, daemons, Prometheus" in err
    assert not exists(DEMO_BED) and not leftovers(DEMO_BED)
    assert not _processes_mentioning(workdir)  # no Prometheus, no mrcd of this demo
    assert not Path(workdir).exists()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
