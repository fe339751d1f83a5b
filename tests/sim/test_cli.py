"""The simulator's command line: argument errors, the JSON contract, determinism."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from mrcstack.fabric import Fabric
from mrcstack.sim import cli, summary

SMALL = ["--bytes", "256KiB", "--seed", "3"]
#: The documented, stable top-level keys (mrcstack/sim/__init__.py).
JSON_KEYS = {
    "bytes_delivered",
    "verified",
    "completion_time_s",
    "goodput_bps",
    "capacity_bps",
    "goodput_fraction",
    "retransmissions",
    "trims",
    "ecn_marks",
    "drops",
    "ev_state_changes",
    "per_plane_bytes",
    "flows",
    "events",
    "events_truncated",
    "port_events",
    "timeline",
    "links",
    "packets_sent",
    "packets_delivered",
    "sim_time_s",
    "sim_events",
    "config",
    "seed",
}
FLOW_KEYS = {
    "index",
    "src",
    "dst",
    "bytes",
    "work_requests",
    "complete",
    "verified",
    "completion_time_s",
    "goodput_bps",
    "failed",
    "retransmissions",
    "nacks_received",
    "trims_received",
    "ecn_echoes",
    "per_plane_bytes",
}


def run_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    pytest.importorskip("mrcstack.core.connection")
    code = cli.main([*argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--loss", "2"], "--loss"),
        (["--loss", "x"], "probability"),
        (["--bytes", "lots"], "--bytes"),
        (["--rate", "fast"], "--rate"),
        (["--delay", "3 parsecs"], "--delay"),
        (["--planes", "0"], "--planes"),
        (["--pairs", "0-3"], "SRC:DST"),
        (["--pairs", "0:9"], "host 9"),
        (["--pairs", "1:1"], "two different hosts"),
        (["--fail-link", "p0:t0a-t1c"], "TARGET@START"),
        (["--fail-link", "p0:t0a-t1z@1ms"], "not in this fabric"),
        (["--fail-link", "p0:h0-t1a@1ms"], "not a link"),
        (["--fail-link", "p0:t0a-t1a@3ms-1ms"], "start < end"),
        (["--fail-switch", "p9-t1a@1ms"], "no switch"),
        (["--fail-switch", "h0@1ms"], "host"),
        (["--nic-down", "h0@1ms"], "h<host>:p<plane>"),
        (["--nic-down", "h0:p7@1ms"], "plane 7"),
        (["--link-loss", "p0:t0a-t1a"], "LINK=P"),
        (["--ev-loss", "zz=0.1"], "EV=P"),
        (["--mode", "tcp"], "--mode"),
        (["--cc", "bbr"], "congestion control"),
        (["--trim-threshold", "4MiB"], "exceeds the queue"),
        (["--ecn-threshold", "64KiB:32KiB"], "kmax"),
        (["--fabric", "/nonexistent/fabric.toml"], "fabric.toml"),
        (["--series", "0s"], "series interval"),
        (["--no-such-flag"], "unrecognized"),
        (["--fail-plane", "x2@1ms"], "p<plane>"),
        (["--fail-plane", "p9@1ms"], "plane 9"),
        (["--loss-change", "0.1"], "P@TIME"),
        (["--loss-change", "2@1ms"], "probability"),
        (["--loss-change", "p0:t0a-t1z=0.1@1ms"], "not in this fabric"),
        (["--packet-latency-every", "0"], "positive"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(
    argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("mrcstack-sim: error: ")
    assert needle in lines[0]


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["--help"]) == 0
    assert "--fail-link" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("2ms", 2e-3), ("1us", 1e-6), ("1.5µs", 1.5e-6), ("500ns", 5e-7), ("0.25", 0.25)],
)
def test_parse_time(text: str, seconds: float) -> None:
    assert cli.parse_time(text) == pytest.approx(seconds)


def test_parse_failure_windows() -> None:
    assert cli.parse_link_failure("p0:t0a-t1c@2ms") == cli.LinkFailure("p0:t0a-t1c", 2e-3, None)
    nic = cli.parse_nic_down("h3:p1@1ms-3ms")
    assert (nic.host, nic.plane, nic.start, nic.end) == (3, 1, 1e-3, 3e-3)
    assert cli.parse_switch_failure("p0-t1a@0").switch == "p0-t1a"


def test_json_has_every_documented_key(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_json(capsys, *SMALL)
    assert code == 0
    assert set(out) >= JSON_KEYS
    assert out["verified"] is True
    assert out["bytes_delivered"] == 256 * 1024
    assert len(out["flows"]) == 1 and set(out["flows"][0]) >= FLOW_KEYS
    assert out["config"]["pairs"] == [[0, 3]]
    assert out["capacity_bps"] == 4 * 100e9
    assert 0 < out["goodput_fraction"] <= 1
    assert len(out["per_plane_bytes"]) == 4 and all(out["per_plane_bytes"])
    assert out["timeline"] == []


def test_same_seed_same_bytes_other_seed_differs(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mrcstack.core.connection")
    argv = [*SMALL, "--loss", "0.01", "--pairs", "0:3,1:2", "--json"]
    outputs = []
    for seed in ("3", "3", "4"):
        assert cli.main([*argv, "--seed", seed]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]
    assert outputs[0] != outputs[2]


def test_summary_and_series(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("mrcstack.core.connection")
    assert cli.main([*SMALL, "--series", "5us"]) == 0
    text = capsys.readouterr().out
    assert "verified           yes" in text and "flow 0: h0 -> h3" in text
    code, out = run_json(capsys, *SMALL, "--series", "5us")
    timeline = out["timeline"]
    assert code == 0 and timeline
    assert sum(row["bytes"] for row in timeline) == 256 * 1024
    assert timeline[1]["t_s"] == pytest.approx(5e-6)


def test_faults_are_applied(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_json(
        capsys,
        "--bytes",
        "2MiB",
        "--fail-link",
        "p0:t0a-t1a@0",
        "--nic-down",
        "h0:p1@10us-40us",
        "--fail-switch",
        "p2-t1b@0-20us",
    )
    assert code == 0 and out["verified"] is True
    assert out["drops"]["link_down"] > 0
    assert {(e["side"], e["port"], e["up"]) for e in out["port_events"] if not e["remote"]} >= {
        ("sender", 1, False),
        ("sender", 1, True),
    }
    assert out["links"].get("p0:t0a-t1a", {}).get("packets", 0) == 0


def test_plane_faults_loss_changes_and_last_hop_ecn_are_applied(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out = run_json(
        capsys,
        "--rate", "10gbit", "--bytes", "2MiB", "--pairs", "0:2,1:3",
        "--fail-plane", "p2@0.1ms-0.3ms",
        "--loss-change", "p0:t0a-t1a=0.2@0", "--loss-change", "p0:t0a-t1a=0@0.3ms",
        "--ecn-last-hop", "--packet-latency-every", "16",
    )  # fmt: skip
    assert code == 0 and out["verified"] is True
    down = {(e["flow"], e["side"]) for e in out["port_events"] if e["port"] == 2 and not e["up"]}
    assert len(down) == 4  # both ends of both flows lost plane 2
    lossy = {name for name, c in out["links"].items() if c["drops_loss"]}
    assert lossy and lossy <= {"p0:t0a-t1a", "p0:t1a-t0a"}
    assert out["config"]["ecn_last_hop"] is True
    assert len(out["flows"][0]["packet_latency_s"]) == (2 << 20) // 4096 // 16
    assert cli.parse_loss_change("0.01@1ms") == cli.LossChange(1e-3, 0.01, None)


def test_unfinished_run_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_json(capsys, *SMALL, "--max-time", "5us")
    assert code == 1
    assert out["verified"] is False and out["flows"][0]["complete"] is False
    assert out["completion_time_s"] == pytest.approx(5e-6)


def test_fabric_file_and_overrides(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "fabric.toml"
    path.write_text(Fabric(planes=2, racks=3, hosts_per_rack=1, t1_per_plane=2).to_toml())
    code, out = run_json(capsys, *SMALL, "--fabric", str(path), "--rate", "50gbit")
    fabric = out["config"]["fabric"]
    assert code == 0 and out["verified"] is True
    assert (fabric["planes"], fabric["racks"], fabric["host_link_bps"]) == (2, 3, 50e9)
    assert out["config"]["pairs"] == [[0, 2]]
    assert out["capacity_bps"] == 2 * 50e9


def test_roce_mode_uses_one_plane(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_json(capsys, *SMALL, "--mode", "roce", "--cc", "fixed")
    assert code == 0 and out["verified"] is True
    assert sum(1 for b in out["per_plane_bytes"] if b) == 1


def test_work_requests_complete_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run_json(capsys, "--bytes", "1000000", "--wr-size", "64KiB", "--pairs", "3:0")
    flow = out["flows"][0]
    assert code == 0 and flow["verified"] is True
    assert flow["work_requests"] == 16 and out["bytes_delivered"] == 1_000_000


def test_summary_puts_faults_and_ev_changes_on_a_timeline(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Few EV state changes are listed at their times between the faults; many are counted
    per slice of the run, each fault in the slice it falls in."""
    faults = ["--fail-link", "p0:t0a-t1a@20us-60us", "--nic-down", "h3:p1@30us"]
    assert cli.main(["--bytes", "2MiB", "--seed", "3", *faults]) == 0
    text = capsys.readouterr().out
    listed = text[text.index("  timeline") :].splitlines()
    assert "faults and EV state changes" in listed[0]
    times = [float(line.split()[0]) for line in listed[1:]]
    assert times == sorted(times)
    for fault in ("0.020 ms  fault: link p0:t0a-t1a down", "0.060 ms  fault: link p0:t0a-t1a up",
                  "0.030 ms  fault: h3 plane 1 NIC port down"):  # fmt: skip
        assert fault in text
    assert any("-> assumed_bad" in line for line in listed)
    assert cli.main(["--bytes", "2MiB", "--seed", "3", "--loss", "0.02", *faults]) == 0
    counted = capsys.readouterr().out
    rows = counted[counted.index("  timeline") :].splitlines()
    assert "EV state changes per" in rows[0] and len(rows) == 1 + summary.SLICES
    assert sum(int(row.split()[2]) for row in rows[1:]) > summary.LISTED
    assert sum("fault: link p0:t0a-t1a down" in row for row in rows) == 1
