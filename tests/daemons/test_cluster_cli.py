"""``mrcstack cluster``: mrcd on every host of a testbed from one command, found by the tools
inside each host's namespace with no flags, stopped gracefully by ``down``."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from mrcstack.daemons import cluster_cli
from mrcstack.fabric import Fabric
from mrcstack.netns import testbed
from tests.support import REPO
from tests.support.isolation import run_name

pytestmark = pytest.mark.requires_kernel("netns")
ROOT = REPO
WRITE_BW = str(Path(sys.executable).with_name("mrc-write-bw"))


def mrcstack(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrcstack", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def alive(pid: int) -> bool:
    """Running (a zombie waiting for init to reap it has exited)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def test_cluster_up_write_bw_between_racks_then_down() -> None:
    name = run_name("cl")
    testbed.up(Fabric(), name)
    follow: subprocess.Popen[str] | None = None
    try:
        bad = mrcstack("cluster", "up", "--name", name, "--set", "plnes=4")
        assert bad.returncode == 1 and bad.stderr.count("\n") == 1, bad.stderr
        assert "mrcd.plnes: unknown key" in bad.stderr
        assert json.loads(mrcstack("cluster", "status", "--name", name, "--json").stdout) == {
            "name": name,
            "up": False,
            "daemons": [],
        }  # nothing started
        up = mrcstack("cluster", "up", "--name", name, "--json",
                      "--set", "packet_auth=false", "--set", "ack_coalesce=8")  # fmt: skip
        assert up.returncode == 0, up.stderr
        record = json.loads(up.stdout)
        daemons = record["daemons"]
        assert record["settings"] == {"log_level": "info", "packet_auth": False, "ack_coalesce": 8}
        config = Path(daemons[0]["config"]).read_text()
        assert "packet_auth = false" in config and "ack_coalesce = 8" in config
        assert [d["host"] for d in daemons] == ["h0", "h1", "h2", "h3"]
        assert all(alive(d["pid"]) for d in daemons)
        again = mrcstack("cluster", "up", "--name", name)
        assert again.returncode == 1 and "already up" in again.stderr
        status = json.loads(mrcstack("cluster", "status", "--name", name, "--json").stdout)
        assert status["up"] and {d["api_socket"] for d in status["daemons"]} == {
            d["api_socket"] for d in daemons
        }
        # logs -f: each new line of h0's log as it comes, until the cluster goes down.
        follow = subprocess.Popen(
            [sys.executable, "-m", "mrcstack", "cluster", "logs", "--name", name, "-f", "-n", "0",
             "h0"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        # The tools find their host's mrcd with no socket flag, from inside its namespace.
        server = subprocess.Popen(
            [sys.executable, "-m", "mrcstack", "testbed", "exec", "--name", name, "h3", "--",
             WRITE_BW, "--verify"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            client = mrcstack("testbed", "exec", "--name", name, "h0", "--", WRITE_BW,
                              "--server-host", "h3", "--verify", "-D", "1")  # fmt: skip
            assert client.returncode == 0, client.stdout + client.stderr
            assert " 0 mismatches" in client.stdout
            out, err = server.communicate(timeout=60)
            assert server.returncode == 0, out + err
            assert " 0 mismatches" in out
        finally:
            if server.poll() is None:
                server.kill()
                server.wait()
        logs = mrcstack("cluster", "logs", "--name", name, "h3")
        assert logs.returncode == 0 and "== h3" in logs.stdout
        down = mrcstack("cluster", "down", "--name", name, "--json")
        assert down.returncode == 0, down.stderr
        followed, err = follow.communicate(timeout=30)  # it ends with the cluster
        assert follow.returncode == 0, err
        ready = [line for line in followed.splitlines() if "event=qp_ready" in line]
        assert ready and all(line.startswith("h0: ") for line in followed.splitlines())
        assert "keyed=False" in ready[0]  # packet_auth = false: the QP carries the ICRC
        assert json.loads(down.stdout) == {
            "name": name,
            "stopped": ["h0", "h1", "h2", "h3"],
            "killed_after_timeout": [],  # every daemon stopped on SIGTERM
        }
        assert not any(alive(d["pid"]) for d in daemons)
        assert not any(Path(d["api_socket"]).exists() for d in daemons)
        gone = mrcstack("cluster", "down", "--name", name)
        assert gone.returncode == 1 and "no cluster is up" in gone.stderr
    finally:
        if follow is not None and follow.poll() is None:
            follow.kill()
            follow.wait()
        testbed.clean(name)


def test_cluster_up_with_the_mapper_status_picture_then_down(tmp_path: Path) -> None:
    """``cluster up --mapper``: mrcmapper in h0's namespace, every mrcd's agent reporting to
    it, ``mrcstack mapper status|picture --name`` find it, ``down`` stops it after the mrcds."""
    name = run_name("cp")
    testbed.up(Fabric(), name)
    try:
        up = mrcstack("cluster", "up", "--name", name, "--mapper", "--json")
        assert up.returncode == 0, up.stderr
        mapper = json.loads(up.stdout)["mapper"]
        assert mapper["netns"].endswith("-h0") and alive(mapper["pid"])
        deadline = time.monotonic() + 30
        while True:  # every agent connects and the mapper judges every link up
            status = mrcstack("mapper", "status", "--name", name)
            assert status.returncode == 0, status.stderr
            planes = [ln for ln in status.stdout.splitlines() if ln.startswith("plane ")]
            if (
                "4/4 agents connected" in status.stdout
                and len(planes) == 4
                and all(ln.endswith("12 links: 12 up") for ln in planes)
            ):
                break
            assert time.monotonic() < deadline, status.stdout
            time.sleep(0.25)
        png = tmp_path / "fabric.png"
        picture = mrcstack("mapper", "picture", "--name", name, "--out", str(png))
        assert picture.returncode == 0, picture.stderr
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        down = mrcstack("cluster", "down", "--name", name, "--json")
        assert down.returncode == 0, down.stderr
        assert json.loads(down.stdout)["mapper"] == "stopped"  # on SIGTERM, after the mrcds
        assert not alive(mapper["pid"])
        gone = mrcstack("mapper", "status", "--name", name)
        assert gone.returncode != 0 and gone.stderr.count("\n") == 1, gone.stderr
    finally:
        testbed.clean(name)


def test_testbed_down_stops_a_cluster_left_running() -> None:
    name = run_name("cm")
    testbed.up(Fabric(), name)
    try:
        doc = cluster_cli.up(name, log_level="warning")
    finally:
        report = testbed.clean(name)
    pids = [d["pid"] for d in doc["daemons"]]
    assert set(pids) <= set(report.killed)
    assert not any(alive(pid) for pid in pids)
    assert not any(Path(d["api_socket"]).exists() for d in doc["daemons"])
    assert not cluster_cli.cluster_dir(name).exists()


def test_cluster_up_without_a_testbed_is_one_line() -> None:
    proc = mrcstack("cluster", "up", "--name", "nobed9")
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1 and "no testbed 'nobed9'" in proc.stderr


def test_set_is_any_mrcd_setting_as_toml() -> None:
    assert cluster_cli.settings(["packet_auth=false", "mrcd.encrypt=true", "data_mode=srv6",
                                 "interfaces=['a', 'b']", "drain_timeout=0.5"]) == {
        "packet_auth": False, "encrypt": True, "data_mode": "srv6",
        "interfaces": ["a", "b"], "drain_timeout": 0.5,
    }  # fmt: skip
    for item, needle in (("packet_auth", "expected KEY=VALUE"), ("host=3", "sets it")):
        with pytest.raises(cluster_cli.ClusterError, match=needle):
            cluster_cli.settings([item])
