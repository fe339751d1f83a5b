"""mrc-write-bw and mrc-write-lat over loopback (no root): two mrcds in this process
(tests/support/apiharness.py), the tools as subprocesses on their sockets; a hand-made
client proves --verify catches a bad write (and that a server in the middle of -a stops
there, or when the next run does not come); -a sweeps of both tools, every size verified.

No timing assertions: figures must be sensible (bytes > 0, verified), not fast.
"""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from mrcstack.api import Device, QpCap, WcOpcode, WriteWr
from mrcstack.daemons.tools import common, report
from mrcstack.daemons.tools.common import (
    END,
    KIND_BW,
    MASK31,
    Hello,
    Pattern,
)
from tests.support import REPO
from tests.support.apiharness import Daemons
from tests.support.tools import WAIT, json_lines, one_json, run_pair, tool

ROOT = REPO
SWEEP_64K = [1 << k for k in range(1, 17)]  # -a --max-size 64KiB: 2 .. 65536


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
    # Each QP's goodput; together they are the run's.
    assert [e["qpn"] for e in c["per_qp"]] == c["qpns"]
    assert [e["writes"] for e in c["per_qp"]] == [200, 200]
    total = sum(e["bw_average_gbit_s"] for e in c["per_qp"])
    assert total == pytest.approx(c["bw_average_gbit_s"], rel=1e-3)
    assert [(e["qpn"], e["writes"]) for e in s["per_qp"]] == [(q, 200) for q in s["qpns"]]


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
        series, interval = doc["series"], doc["interval_s"]
        print(f"\n16 MiB writes: peak {peak} MB/s, average {avg} MB/s, {doc['iterations']} writes")
        # A 0.1 s interval holds one or two 16 MiB writes: a per-interval peak would read
        # a multiple of 160 MiB/s.  The peak printed is the best window of the run's own
        # series that held PEAK_MIN_WRITES writes (or the average, if higher): checked
        # against the series, not against a bound on how steady this machine was.
        best = report.peak_rate(series, interval)
        assert peak is not None and avg <= peak, doc
        assert peak == pytest.approx(max(best or 0.0, avg * report.MB) / report.MB, abs=0.002)
        assert any(0 < e["writes"] < report.PEAK_MIN_WRITES for e in series), series


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
