"""The perftest-style tools' pure parts: the handshake structs, patterns, figures, the
bandwidth peak, flags (a bad one is one line and exit 2), no daemon (one line, exit 1)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mrcstack.api import AsyncEvent, AsyncEventType, WcOpcode, WcStatus, WorkCompletion
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
from tests.support import REPO
from tests.support.tools import tool

ROOT = REPO
SWEEP_64K = [1 << k for k in range(1, 17)]  # -a --max-size 64KiB: 2 .. 65536


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


def _wc(wr_id: int, status: WcStatus, opcode: WcOpcode = WcOpcode.RDMA_WRITE) -> WorkCompletion:
    return WorkCompletion(wr_id, status, opcode, qpn=0x1234, byte_len=0)


def test_a_servers_unacknowledged_counts_are_a_warning_and_nothing_else_is(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The client goes once it has read the counts: if its acknowledgement is lost the
    server's counts write fails, which the server reports but does not fail on; any other
    failure, or the same one on the client's side, still ends the run."""
    owners, sent = {0x1234: "peer"}, {0x1234}  # the server sent that QP its counts
    failed_counts = _wc(common.END_WR | 3, WcStatus.RETRY_EXC_ERR)
    flushed = _wc(5, WcStatus.WR_FLUSH_ERR, WcOpcode.RECV_RDMA_WITH_IMM)  # a receive, with it
    got = list(common.completions([flushed, failed_counts], owners, "mrc-write-bw", sent))
    assert got == [("peer", common.Done.ENDED, failed_counts)]
    err = capsys.readouterr().err
    assert err.startswith("mrc-write-bw: warning: QP ") and "RETRY_EXC_ERR" in err
    for other in (
        _wc(7, WcStatus.RETRY_EXC_ERR),  # a data write
        _wc(common.CREDIT_WR, WcStatus.WR_FLUSH_ERR),  # a credit
        flushed,
        failed_counts,
    ):
        with pytest.raises(common.ToolError):  # before the counts were sent
            list(common.completions([other], owners, "mrc-write-bw"))
    with pytest.raises(common.ToolError):  # a client's END that failed
        list(common.completions([failed_counts], owners, None, sent))
    ok = _wc(common.END_WR, WcStatus.SUCCESS)
    assert list(common.completions([ok], owners, "mrc-write-bw", sent)) == [
        ("peer", common.Done.ENDED, ok)
    ]
    assert capsys.readouterr().err == ""


class _EventSource:
    """What Events reads: a context's asynchronous events, in order."""

    def __init__(self, events: list[AsyncEvent]) -> None:
        self.events = events

    def get_async_event(self, timeout: float = 0) -> AsyncEvent | None:
        return self.events.pop(0) if self.events else None


def test_a_finished_qps_failure_is_recorded_not_fatal() -> None:
    fatal = AsyncEvent(AsyncEventType.QP_FATAL, qpn=0x1234, reason="retry budget spent")
    events = common.Events(_EventSource([fatal]), 0.0)  # type: ignore[arg-type]
    events.finished.add(0x1234)
    events.check()
    assert [e["type"] for e in events.seen] == [AsyncEventType.QP_FATAL.value]
    other = AsyncEvent(AsyncEventType.QP_FATAL, qpn=0x99, reason="retry budget spent")
    events = common.Events(_EventSource([other]), 0.0)  # type: ignore[arg-type]
    events.finished.add(0x1234)
    with pytest.raises(common.ToolError, match="retry budget spent"):
        events.check()
