"""The socket-less data-path benchmark: a short run has every phase and moved real packets."""

from __future__ import annotations

from bench import datapath_bench


def test_a_short_run_reports_every_phase_per_data_packet() -> None:
    out = datapath_bench.run(packets=300)
    for phase in (*datapath_bench.PHASES, "total"):
        assert out[f"{phase}_us_per_packet"] > 0
    assert out["data_packets"] >= 300
    assert out["writes"] == 3  # 300 packets of 8 KiB, rounded up to whole 1 MiB writes
    # One ACK per ACK_COALESCE data packets at most, and at least one per write.
    assert out["writes"] <= out["acks"] <= out["data_packets"]
    assert out["total_us_per_packet"] == sum(
        out[f"{phase}_us_per_packet"] for phase in datapath_bench.PHASES
    )
