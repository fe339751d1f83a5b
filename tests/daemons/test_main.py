"""The mrcd command: config errors, --check, real processes serving metrics and the API,
SIGTERM with writes in flight, restarts on the same config."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from mrcstack import native
from mrcstack.api import (
    ApiError,
    AsyncEvent,
    AsyncEventType,
    Context,
    Device,
    MemoryRegion,
    QpAttr,
    QueuePair,
    WcStatus,
    WorkCompletion,
    WriteWr,
)
from mrcstack.daemons.mrcd.config import MrcdConfig
from tests.support.isolation import control_port, free_base, free_tcp_port

MRCD = [sys.executable, "-m", "mrcstack.daemons.mrcd.ops.main"]


def write_config(tmp: Path, extra: str = "") -> Path:
    psk = tmp / "cluster.key"
    psk.write_text(os.urandom(32).hex())
    base = free_base((0,), planes=2)
    cfg = tmp / "mrcd.toml"
    cfg.write_text(
        f"""
[mrcd]
host = 0
data_mode = "loopback"
data_port = {base}
control_address = "[::1]:{control_port(base, 0)}"
api_socket = "{tmp / "mrcd.sock"}"
{extra}
[mrcd.auth]
mode = "psk"
psk_file = "{psk}"
[fabric]
planes = 2
racks = 2
hosts_per_rack = 1
t1_per_plane = 2
"""
    )
    return cfg


@pytest.mark.parametrize(
    "body,message",
    [
        ("[mrcd]\nhost = 0\nplnes = 3\n", "mrcd.plnes: unknown key"),
        ("[mrcd]\nhost = 99\n", "mrcd.host: must be in"),
        ("[mrcd]\nhost = 0\n[fabric]\nplanes = 0\n", "fabric.planes"),
        ("[mrcd\n", "toml:"),
        ("[mrcd]\nhost = 0\nlog_level = 'loud'\n", "mrcd.log_level"),
        ("[mrcd]\nhost = 0\ndrain_timeout = -1\n", "mrcd.drain_timeout: must be a number"),
        ("[mrcd]\nhost = 0\ndrain_timeout = '2s'\n", "mrcd.drain_timeout: must be a number"),
        (
            "[mrcd]\nhost = 0\nack_delay = 0.01\n",
            "mrcd.ack_delay: must be a number of seconds in 0..0.005",
        ),
        ("[mrcd]\nhost = 0\ninterfaces = ['ens1f0']\n", "mrcd.interfaces: 1 names for 4 planes"),
        ("[mrcd]\nhost = 0\ninterfaces = 'ens1f0'\n", "mrcd.interfaces: must be a list"),
        ("[mrcd]\nhost = 0\npacket_auth = 1\n", "mrcd.packet_auth: must be true or false"),
        ("[mrcd]\nhost = 0\ninterfaces = ['a', 'b', 'c', 'd/e']\n", "mrcd.interfaces[3]: not an"),
        ("[mrcd]\nhost = 0\ninterfaces = ['a', 'b', 'a', 'd']\n", "mrcd.interfaces[2]: 'a' is"),
        ("[mrcd]\nhost = 0\n[mrcd.interfaces]\n0 = 'a'\n", "mrcd.interfaces.1: missing"),
        ("[mrcd]\nhost = 0\n[mrcd.interfaces]\n4 = 'a'\n", "mrcd.interfaces.4: not a plane"),
        ("[mrcd]\nhost = 0\nworkers = 0\n", "mrcd.workers: must be in 1..64, got 0"),
        ("[mrcd]\nhost = 0\nworkers = 'two'\n", "mrcd.workers: must be an integer"),
    ],
)
def test_bad_config_is_one_line_and_exit_2(tmp_path: Path, body: str, message: str) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text(body)
    proc = subprocess.run(
        [*MRCD, "--config", str(cfg)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


@pytest.mark.parametrize(
    "text,names",
    [
        ("", ("nic0", "nic1")),  # the testbed's ports
        ('interfaces = ["ens1f0", "ens1f1np1"]', ("ens1f0", "ens1f1np1")),
        ('[mrcd.interfaces]\n1 = "eth1"\n0 = "eth0"', ("eth0", "eth1")),
    ],
)
def test_interfaces_default_to_the_testbeds_and_follow_the_config(
    text: str, names: tuple[str, ...]
) -> None:
    head = "[mrcd]\nhost = 0\n[mrcd.auth]\npsk_file = '/k'\n"
    if not text.startswith("["):
        head = head.replace("host = 0\n", f"host = 0\n{text}\n")
        text = ""
    cfg = MrcdConfig.from_toml(f"{head}{text}\n[fabric]\nplanes = 2\n")
    assert cfg.interfaces == names


def test_bad_flag_and_missing_file(tmp_path: Path) -> None:
    proc = subprocess.run([*MRCD, "--nope"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
    proc = subprocess.run(
        [*MRCD, "--config", str(tmp_path / "absent.toml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2 and "cannot read" in proc.stderr


def test_check_validates_and_exits(tmp_path: Path) -> None:
    proc = subprocess.run(
        [*MRCD, "--config", str(write_config(tmp_path)), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0 and "ok" in proc.stdout


@pytest.mark.parametrize(
    ("key_text", "needle"),
    [
        (None, "cannot read cluster key"),
        ("abc", "cluster key must be 64 hex digits"),
    ],
)
def test_check_loads_the_key_files_and_names_the_key(
    tmp_path: Path, key_text: str | None, needle: str
) -> None:
    """A missing or malformed key file fails --check (exit 2), and a real start (exit 1),
    with one line naming the config key and the file."""
    cfg = write_config(tmp_path)
    psk = tmp_path / "cluster.key"
    if key_text is None:
        psk.unlink()
    else:
        psk.write_text(key_text)
    for extra, status in ((["--check"], 2), ([], 1)):
        proc = subprocess.run(
            [*MRCD, "--config", str(cfg), *extra],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        assert proc.returncode == status, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert lines[-1].startswith(f"mrcd: mrcd.auth.psk_file: {psk}: {needle}"), proc.stderr
        assert proc.stdout == ""


def test_daemon_serves_metrics_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_tcp_port()
    cfg = write_config(tmp_path)
    proc = subprocess.Popen(
        [*MRCD, "--config", str(cfg), f"--web.listen-address=127.0.0.1:{port}"],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        body = ""
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
                    body = r.read().decode()
                break
            except OSError:
                time.sleep(0.1)
        assert "mrc_planes 2.0" in body
        got = {
            (s.name, tuple(s.labels.items())): s.value
            for fam in text_string_to_metric_families(body)
            for s in fam.samples
        }
        # One worker: the daemon's own process, whose start-up alone takes CPU time.
        assert got[("mrc_worker_cpu_seconds_total", (("worker", "0"),))] > 0
        assert got[("process_cpu_seconds_total", ())] > 0
        assert ("python_gc_collections_total", (("generation", "2"),)) in got
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=20)
        assert proc.returncode == 0
        assert "event=stopping" in err and "event=stopped" in err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# Real daemons on loopback: SIGTERM with writes in flight, and restarts -----------------------
WAIT = 60.0  # safety limit for what should happen; never a timing assertion
KIB = 1 << 10
MIB = 1 << 20
PAIR_FABRIC = "[fabric]\nplanes = 2\nracks = 2\nhosts_per_rack = 1\nt1_per_plane = 2\n"


class Mrcd:
    """One mrcd process (h0 or h1 of a 2-host loopback fabric) started from its config file."""

    def __init__(self, tmp: Path, host: int, base: int, drain: float) -> None:
        """``base``: the pair's :func:`free_base` (data and control ports)."""
        psk = tmp / "cluster.key"
        if not psk.exists():
            psk.write_text(os.urandom(32).hex())
        self.sock = tmp / f"h{host}.sock"
        self.log = tmp / f"h{host}-{drain:g}.log"
        self.config = tmp / f"h{host}-{drain:g}.toml"
        peers = "\n".join(f'h{h} = "[::1]:{control_port(base, h)}"' for h in (0, 1))
        self.config.write_text(
            f"""[mrcd]
host = {host}
data_mode = "loopback"
data_port = {base}
control_address = "[::1]:{control_port(base, host)}"
api_socket = "{self.sock}"
web_listen_address = "127.0.0.1:0"
drain_timeout = {drain}
[mrcd.peers]
{peers}
[mrcd.auth]
mode = "psk"
psk_file = "{psk}"
{PAIR_FABRIC}"""
        )
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Mrcd:
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen([*MRCD, "--config", str(self.config)], stderr=log)
        self.wait_log("event=ready")
        return self

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_log(self, what: str) -> None:
        deadline = time.monotonic() + WAIT
        while what not in self.text():
            assert self.proc is not None and self.proc.poll() is None, self.text()
            assert time.monotonic() < deadline, f"no {what!r} in {WAIT} s: {self.text()}"
            time.sleep(0.01)

    def exit_after_sigterm(self) -> tuple[int, float]:
        """SIGTERM; (exit code, seconds until it exited)."""
        assert self.proc is not None
        t0 = time.monotonic()
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(WAIT)
        return code, time.monotonic() - t0

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def shared_mappings(self) -> int:
        """Mappings of clients' regions (sealed memfds) in the daemon."""
        maps = Path(f"/proc/{self.pid}/maps").read_text()
        return sum("/memfd:" in line for line in maps.splitlines())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)  # in case a test stopped it
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def daemons(*ds: Mrcd) -> Iterator[None]:
    try:
        yield
    finally:
        for d in ds:
            d.kill()


def until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not predicate():
        assert time.monotonic() < deadline, f"not {what} after {WAIT} s"
        time.sleep(0.01)


_service = itertools.count(100)


def connected(
    a: Mrcd, b: Mrcd, size: int
) -> tuple[Context, Context, QueuePair, MemoryRegion, MemoryRegion]:
    """A context on each daemon, a region of ``size`` each, a QP from a to b (forever
    retrying: a stopped peer must not fail it)."""
    ca = Device.open(a.sock).create_context()
    cb = Device.open(b.sock).create_context()
    ma, mb = ca.reg_mr(size), cb.reg_mr(size)
    ma.buf[:] = os.urandom(size)
    service = next(_service)
    listener = cb.listen(service)
    qa = ca.create_qp(ca.create_cq(1024), attr=QpAttr(exp_cnt=25))
    qb = cb.create_qp(cb.create_cq(1024))
    t = threading.Thread(
        target=lambda: listener.accept(listener.get_request(WAIT), qb, timeout=WAIT)
    )
    t.start()
    qa.connect(1, service, timeout=WAIT)
    t.join(WAIT)
    return ca, cb, qa, ma, mb


def completions_until_closed(qp: QueuePair) -> list[WorkCompletion]:
    """Every completion the program gets until mrcd closes its connection."""
    out: list[WorkCompletion] = []
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        try:
            out += qp.send_cq.poll_wait(64, timeout=1.0)
        except ApiError:
            return out + qp.send_cq.poll(64)
    raise AssertionError(f"mrcd did not close the connection in {WAIT} s")


def events(ctx: Context) -> list[AsyncEvent]:
    out = []
    while (ev := ctx.get_async_event(timeout=0)) is not None:
        out.append(ev)
    return out


def test_sigterm_lets_pending_writes_finish_then_flushes_the_rest(tmp_path: Path) -> None:
    """Every posted write gets exactly one completion: writes that can finish within the
    drain period succeed, the rest fail with WR_FLUSH_ERR; then DEVICE_FATAL, exit 0."""
    base = free_base((0, 1), planes=2)
    b = Mrcd(tmp_path, 1, base, drain=30)
    patient = Mrcd(tmp_path, 0, base, drain=30)
    hasty = Mrcd(tmp_path, 0, base, drain=0.2)  # the same ports, after patient
    n, size = 8, 256 * KIB
    with daemons(b, patient, hasty):
        b.start()
        # The ready line says which copy of the per-packet modules runs (mrcstack.native).
        assert f"data_path={native.state()!r}" in b.text()
        for a, peer_answers in ((patient, True), (hasty, False)):
            a.start()
            ca, cb, qa, ma, mb = connected(a, b, n * size)
            os.kill(b.pid, signal.SIGSTOP)  # nothing is acknowledged until SIGCONT
            try:
                qa.post_send([WriteWr(i, (ma, i * size, size), mb.addr + i * size, mb.rkey)
                              for i in range(n)])  # fmt: skip
                t0 = time.monotonic()
                a.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
                a.wait_log("event=quiescing")  # a is draining with all n writes pending
                if peer_answers:
                    os.kill(b.pid, signal.SIGCONT)  # the writes can complete now
                wcs = completions_until_closed(qa)
            finally:
                os.kill(b.pid, signal.SIGCONT)
            code = a.proc.wait(WAIT)  # type: ignore[union-attr]
            took = time.monotonic() - t0
            seen = events(ca)
            print(f"\ndrain {a.config.name}: exit {code} {took:.2f} s after SIGTERM; "
                  f"{[wc.status.name for wc in wcs]}; {[e.type.name for e in seen]}")  # fmt: skip
            assert code == 0 and "event=stopped" in a.text()
            assert sorted(wc.wr_id for wc in wcs) == list(range(n))  # each exactly once
            if peer_answers:
                assert all(wc.status is WcStatus.SUCCESS for wc in wcs)
                assert mb.buf == ma.buf
            else:
                assert all(wc.status is WcStatus.WR_FLUSH_ERR for wc in wcs)
                assert (seen[0].type, seen[0].qpn) == (AsyncEventType.QP_FATAL, qa.qpn)
            fatal = [e for e in seen if e.type is AsyncEventType.DEVICE_FATAL]
            assert fatal and fatal[0].reason == "mrcd stopping"
            assert not a.sock.exists()
            for ctx in (ca, cb):
                ctx.close()
                ctx.device.close()
        assert b.proc is not None and b.proc.poll() is None


def test_restart_on_the_same_config_leaves_nothing_behind(tmp_path: Path) -> None:
    """Start, transfer, SIGTERM, start again on the same config: the same ports and API
    socket bind again, and neither daemon keeps a descriptor or a mapping it should not."""
    base = free_base((0, 1), planes=2)
    a = Mrcd(tmp_path, 0, base, drain=2)
    b = Mrcd(tmp_path, 1, base, drain=2)
    with daemons(a, b):
        b.start()
        b_fds = b.fds()
        a_fds: list[int] = []
        for round_ in range(2):
            a.start()
            a_fds.append(a.fds())
            assert a_fds[-1] == a_fds[0]  # a fresh daemon: what the first one had
            ca, cb, qa, ma, mb = connected(a, b, MIB)
            assert a.shared_mappings() == b.shared_mappings() == 1
            qa.post_send(WriteWr(1, (ma, 0, MIB), mb.addr, mb.rkey))
            assert qa.send_cq.poll_wait(1, WAIT)[0].status is WcStatus.SUCCESS
            assert mb.buf == ma.buf
            for ctx in (ca, cb):
                ctx.close()
                ctx.device.close()
            # All that stays is the control session a opened to b (kept for the next QP).
            until(lambda: a.fds() == a_fds[0] + 1, "a back to its descriptors")
            until(lambda: b.fds() == b_fds + 1, "b back to its descriptors")
            assert a.shared_mappings() == b.shared_mappings() == 0
            code, took = a.exit_after_sigterm()
            print(f"\nround {round_}: mrcd h0 exited {code} {took:.2f} s after SIGTERM")
            assert code == 0 and not a.sock.exists()
            until(lambda: b.fds() == b_fds, "b back to its fds (a's control session gone)")
        assert b.exit_after_sigterm()[0] == 0
