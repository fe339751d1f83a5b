"""mrc-write-bw and mrc-write-lat on testbed ``tt`` (root; 2 planes, 2 racks x 1 host,
2 T1 per plane) with mrcd on both hosts, the tools in the hosts' namespaces."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence

import pytest

from mrcstack.fabric import Fabric
from tests.support import REPO
from tests.support.testbeds import Bed, Testbeds
from tests.support.tools import WAIT, one_json, run_pair, tool

ROOT = REPO


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
