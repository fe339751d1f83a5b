"""The daemon bench: its before/after comparison runs each side's own code; its window readings."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import daemon_bench, sim_bench

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_started_for_the_before_side_imports_the_before_tree(tmp_path: Path) -> None:
    """Started from the repository's root (where a bench is run) inside
    ``pythonpath(tree)``: mrcstack comes from ``tree``, not from the current directory,
    which ``python -m`` (how the daemons start) and ``-c`` would otherwise put first on
    ``sys.path``; outside it, from this tree."""
    tree = tmp_path / "tree"
    assert sim_bench.export("HEAD", tree)
    where = [sys.executable, "-c", "import mrcstack; print(mrcstack.__file__)"]
    with daemon_bench.pythonpath(tree):
        inside = subprocess.run(where, cwd=ROOT, capture_output=True, text=True, check=True)
    outside = subprocess.run(where, cwd=ROOT, capture_output=True, text=True, check=True)
    assert Path(inside.stdout.strip()).is_relative_to(tree), inside.stdout
    assert Path(outside.stdout.strip()).is_relative_to(ROOT), outside.stdout


def test_window_readings_summed_over_rounds_become_means() -> None:
    """Two rounds' readings (3 and 1 of them) average per reading, not per round; the busy
    fractions are CPU time over wall time of both rounds; counters printed as they are
    leave the readings' sums out; a run without readings prints only the busy fractions."""
    rounds = [
        {"window_samples": 3.0, "cwnd_kib_sum": 3 * 512.0, "srtt_ms_sum": 6.0,
         "inflight_kib_sum": 3 * 500.0, "src_cpu_s": 2.9, "dst_cpu_s": 2.0, "timed_s": 3.0},
        {"window_samples": 1.0, "cwnd_kib_sum": 2048.0, "srtt_ms_sum": 6.0,
         "inflight_kib_sum": 1000.0, "src_cpu_s": 1.0, "dst_cpu_s": 0.5, "timed_s": 1.0},
    ]  # fmt: skip
    total: dict[str, float] = {}
    for r in rounds:
        daemon_bench._add(total, r)
    assert daemon_bench.wait_figures(total) == {
        "sender_busy": 3.9 / 4,
        "receiver_busy": 2.5 / 4,
        "cwnd_kib": (3 * 512 + 2048) / 4,
        "inflight_kib": (3 * 500 + 1000) / 4,
        "srtt_ms": 12.0 / 4,
    }
    assert set(daemon_bench._counters_only(total)) == {"src_cpu_s", "dst_cpu_s", "timed_s"}
    assert set(daemon_bench.wait_figures({"src_cpu_s": 1.0, "dst_cpu_s": 1.0, "timed_s": 2.0})) == {
        "sender_busy",
        "receiver_busy",
    }


def test_cpu_per_packet_splits_each_sender_into_user_space_and_the_kernel() -> None:
    """Per packet: each side's CPU over its own packets; the senders' kernel part is what is
    left of their CPU after user space, and mrcd's over the blast's compares those parts."""
    mrcd = {"src_cpu_s": 3.0, "src_user_s": 2.0, "dst_cpu_s": 1.5, "dst_user_s": 1.0,
            "sent_packets": 100_000.0, "dst_received_packets": 100_000.0,
            "dst_sent_packets": 10_000.0}  # fmt: skip
    blast = {"sender_cpu_s": 2.4, "sender_user_s": 0.4, "receiver_cpu_s": 1.0,
             "receiver_user_s": 0.2, "sent": 200_000.0, "received": 100_000.0}  # fmt: skip
    got = daemon_bench.cpu_per_packet(mrcd, blast)
    assert got["unshaped_mrcd_sender_us_per_data_packet"] == 30.0
    assert got["unshaped_mrcd_sender_user_us_per_data_packet"] == 20.0
    assert got["unshaped_mrcd_sender_kernel_us_per_data_packet"] == 10.0
    assert got["unshaped_mrcd_receiver_us_per_data_packet"] == 15.0
    assert got["unshaped_mrcd_receiver_us_per_ack"] == 150.0
    assert got["unshaped_udp_blast_sender_us_per_packet"] == 12.0
    assert got["unshaped_udp_blast_sender_user_us_per_packet"] == 2.0
    assert got["unshaped_udp_blast_sender_kernel_us_per_packet"] == 10.0
    assert got["unshaped_mrcd_sender_cpu_over_blast"] == 2.5
    assert got["unshaped_mrcd_sender_kernel_over_blast"] == 1.0
    # Without a blast (the shaped runs): mrcd's own figures only.
    alone = daemon_bench.cpu_per_packet(mrcd, {})
    assert set(alone) == {k for k in got if k.startswith("unshaped_mrcd_")} - {
        "unshaped_mrcd_sender_cpu_over_blast",
        "unshaped_mrcd_receiver_cpu_over_blast",
        "unshaped_mrcd_sender_kernel_over_blast",
    }
