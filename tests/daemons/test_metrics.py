"""mrcd's metrics: histograms, the snapshot contract, the exposition (linted by promtool),
the /metrics endpoint on loopback, and a real Prometheus server scraping it."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import math
import shutil
import socket
import subprocess
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from mrcstack.core.config import ConnectionStats
from mrcstack.daemons.mrcd.control.auth import Credentials
from mrcstack.daemons.mrcd.control.client import ControlClient
from mrcstack.daemons.mrcd.control.records import ControlError
from mrcstack.daemons.mrcd.control.server import REJECT_REASONS as CONTROL_REJECT_REASONS
from mrcstack.daemons.mrcd.datapath.probes import ProbeAuth
from mrcstack.daemons.mrcd.node.snapshot import (
    DEFAULT_BOUNDS,
    Buckets,
    HistogramSnapshot,
    NodeSnapshot,
    Totals,
    TrafficCounters,
    count_evs,
)
from mrcstack.daemons.mrcd.ops.metrics import (
    EV_STATES,
    MAX_REASONS,
    RETRANSMIT_REASONS,
    ListenAddressError,
    make_registry,
    parse_listen_address,
    serve,
)
from mrcstack.daemons.mrcd.ops.promserver import prometheus_config, run_prometheus
from tests.support import REPO
from tests.support.apiharness import Daemons, wait_for

ROOT = REPO
PROMTOOL = shutil.which("promtool")
LABELS = {"plane", "reason", "state", "host", "version", "le", "worker", "auth"}  # bounded sets


def populated(planes: int = 4) -> NodeSnapshot:
    """A snapshot as a busy node would give it, built through the node-side helpers."""
    stats = []
    for k in (1, 2):
        st = ConnectionStats(planes=planes)
        for p in range(planes):
            st.packets_sent[p] = 1000 * k + p
            st.bytes_sent[p] = 8192 * (1000 * k + p)
            st.packets_received[p] = 500 * k + p
            st.bytes_received[p] = 64 * (500 * k + p)
        st.data_bytes_placed = 1 << 20
        st.retransmissions.update(timeout=3 * k, trim=7, sack=2)
        st.nacks_received.update(trimmed=7, remote_access=1)
        st.rejected.update(bad_auth=2, replay=1, rkey=k)
        st.trims_received, st.ecn_echoes, st.duplicates = 5, 11, 1
        stats.append(st)
    retired = Totals(planes)
    retired.add(stats[0])  # a closed connection's counters stay
    totals = retired.copy()
    totals.add(stats[1])
    totals.add_reasons("rejections", {"unknown_qpn": 100_000, "malformed": 3})
    totals.add_send_errors(2)
    rtt, wct = Buckets(), Buckets()
    for us in (3, 40, 40, 250, 900, 12_000):
        rtt.observe(us * 1e-6)
    for s in (1e-4, 0.02, 1.5, 30.0):
        wct.observe(s)
    ev_states = [(p, "good") for p in range(planes) for _ in range(6)]
    ev_states += [(1, "assumed_bad"), (2, "skip"), (3, "unknown"), (3, "unknown")]
    return NodeSnapshot(
        host="h0",
        version="0.1.0",
        planes=planes,
        start_time=1.7e9,
        port_link_up=(True, True, False, True),
        port_admin_up=(True, False, True, True),
        connections=2,
        evs=count_evs(planes, ev_states),
        traffic=totals.freeze(),
        rtt=rtt.snapshot(),
        write_completion=wct.snapshot(),
        control_auth_failures=1,
        control_rejections={"timeout": 4, "eof": 2},
        probe_answers={"sealed": 40, "icrc": 650},
        workers=2,
        worker_qps=(1, 1),
        worker_cpu=(12.5, 3.25),
    )


def exposition(snapshot_fn: Callable[[], NodeSnapshot]) -> str:
    """mrcd's own families only (no process_* or python_gc_*: those are the test runner's)."""
    return generate_latest(make_registry(snapshot_fn, runtime=False)).decode()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


# Histograms -------------------------------------------------------------------------------------
def test_default_bounds_span_microseconds_to_seconds() -> None:
    assert DEFAULT_BOUNDS[0] == 1e-6 and DEFAULT_BOUNDS[-1] == 10.0
    assert list(DEFAULT_BOUNDS) == sorted(set(DEFAULT_BOUNDS))
    ratios = [b / a for a, b in itertools.pairwise(DEFAULT_BOUNDS)]
    assert all(1.9 < r < 2.6 for r in ratios)  # 1-2-5: no bucket wider than 2.5x


def test_buckets_are_cumulative_and_le_inclusive() -> None:
    b = Buckets()
    for v in (1e-6, 1.5e-6, 2e-6, 0.7, 10.0, 11.0, -1.0, math.nan):
        b.observe(v)
    h = b.snapshot()
    at = dict(zip(h.bounds, h.cumulative, strict=False))
    assert at[1e-6] == 2  # -1 counts as 0 (clamped); 1e-6 equals its bound
    assert at[2e-6] == 4
    assert at[0.5] == 4 and at[1.0] == 5
    assert at[10.0] == 6 and h.count == 7  # 11 s only in +Inf; NaN ignored
    assert h.cumulative == tuple(sorted(h.cumulative))
    assert h.sum == pytest.approx(1e-6 + 1.5e-6 + 2e-6 + 0.7 + 10 + 11)
    both = h + h
    assert both.count == 14 and both.sum == pytest.approx(2 * h.sum)
    with pytest.raises(ValueError):
        h + HistogramSnapshot((1.0,), (0, 0), 0.0)
    for bad in ((), (2.0, 1.0), (1.0, 1.0), (1.0, math.inf)):
        with pytest.raises(ValueError):
            Buckets(bad)


def test_snapshot_rejects_wrong_plane_counts() -> None:
    with pytest.raises(ValueError, match="port_link_up"):
        NodeSnapshot(host="h0", version="x", planes=2, port_link_up=(True,))
    with pytest.raises(ValueError, match="bytes_sent"):
        NodeSnapshot(
            host="h0", version="x", planes=2, traffic=TrafficCounters(bytes_sent=(1, 2, 3))
        )


def test_totals_keep_closed_connections_and_copy_is_independent() -> None:
    a = Totals(2)
    st = ConnectionStats(planes=2)
    st.bytes_sent[1] = 10
    st.retransmissions["timeout"] = 1
    a.add(st)
    b = a.copy()
    b.add(st)
    assert a.freeze().bytes_sent == (0, 10) and b.freeze().bytes_sent == (0, 20)
    assert a.freeze().retransmissions == {"timeout": 1}
    assert b.freeze().retransmissions == {"timeout": 2}
    assert count_evs(2, [(0, "good"), (1, "good"), (5, "good")]) == {"good": (1, 1)}


# The exposition ---------------------------------------------------------------------------------
@pytest.mark.requires_program("promtool")
def test_promtool_accepts_the_exposition(tmp_path: Path) -> None:
    text = exposition(populated)
    (tmp_path / "metrics.txt").write_text(text)
    assert PROMTOOL is not None
    res = subprocess.run(
        [PROMTOOL, "check", "metrics"],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.strip() == "" and res.stderr.strip() == "", "promtool lint warnings"


def test_exposition_names_labels_and_values() -> None:
    snap = populated()
    got = samples(exposition(lambda: snap))
    names = {name for name, _ in got}
    assert all(n.startswith("mrc_") for n in names)
    for (name, labels), _ in got.items():
        assert {k for k, _ in labels} <= LABELS, name
    for n in names:  # counters carry _total; no unit-less byte or second names
        assert "bytes" not in n or n.endswith(("_bytes_total", "_bytes"))
    assert got[("mrc_sent_bytes_total", (("plane", "3"),))] == 8192 * (1003 + 2003)
    assert got[("mrc_received_packets_total", (("plane", "0"),))] == 500 + 1000
    assert got[("mrc_retransmissions_total", (("reason", "timeout"),))] == 9
    assert got[("mrc_retransmissions_total", (("reason", "port"),))] == 0  # known: always there
    assert got[("mrc_nacks_received_total", (("reason", "trimmed"),))] == 14
    assert got[("mrc_rejected_packets_total", (("reason", "unknown_qpn"),))] == 100_000
    assert got[("mrc_rejected_packets_total", (("reason", "bad_auth"),))] == 4
    assert got[("mrc_rejected_packets_total", (("reason", "rkey"),))] == 3
    assert got[("mrc_send_errors_total", ())] == 2
    assert got[("mrc_probe_answers_total", (("auth", "icrc"),))] == 650
    assert got[("mrc_probe_answers_total", (("auth", "icrc_no_key"),))] == 0  # known: always
    assert {lab[0][1] for (n, lab) in got if n == "mrc_probe_answers_total"} == {
        a.value for a in ProbeAuth
    }
    rejected = {lab[0][1] for (n, lab) in got if n == "mrc_rejected_packets_total"}
    assert {"probe_rate", "probe_source"} <= rejected  # refused probes, shown as 0
    assert not {"probe_unauthenticated", "probe_no_key"} & rejected  # answered: not refused
    assert got[("mrc_control_auth_failures_total", ())] == 1
    assert got[("mrc_control_rejections_total", (("reason", "timeout"),))] == 4
    assert got[("mrc_control_rejections_total", (("reason", "busy"),))] == 0  # known: always
    assert {lab[0][1] for (n, lab) in got if n == "mrc_control_rejections_total"} == set(
        CONTROL_REJECT_REASONS
    )
    assert got[("mrc_connections", ())] == 2
    assert got[("mrc_workers", ())] == 2
    assert [got[("mrc_worker_qps", (("worker", w),))] for w in "01"] == [1, 1]
    assert [got[("mrc_worker_cpu_seconds_total", (("worker", w),))] for w in "01"] == [12.5, 3.25]
    up = [got[("mrc_plane_up", (("plane", str(p)),))] for p in range(4)]
    assert up == [1, 0, 0, 1]
    assert got[("mrc_evs", (("plane", "1"), ("state", "assumed_bad")))] == 1
    assert got[("mrc_evs", (("plane", "3"), ("state", "unknown")))] == 2
    assert got[("mrc_evs", (("plane", "0"), ("state", "denied")))] == 0
    assert {s for (n, lab) in got if n == "mrc_evs" for k, s in lab if k == "state"} == set(
        EV_STATES
    )
    assert got[("mrc_rtt_seconds_count", ())] == 6
    assert got[("mrc_rtt_seconds_bucket", (("le", "5e-05"),))] == 3
    assert got[("mrc_rtt_seconds_bucket", (("le", "+Inf"),))] == 6
    assert got[("mrc_write_completion_seconds_bucket", (("le", "10.0"),))] == 3
    assert got[("mrc_daemon_info", (("host", "h0"), ("version", "0.1.0")))] == 1


def test_readme_lists_every_metric_family() -> None:
    text = exposition(populated)
    families = {fam.name for fam in text_string_to_metric_families(text)}
    readme = (ROOT / "README.md").read_text()
    for name in families:
        suffix = "_total" if f"{name}_total" in text else ""
        assert f"`{name}{suffix}`" in readme, name


def test_reason_labels_stay_bounded() -> None:
    flood = {f"r{i}": 1 for i in range(500)}
    snap = NodeSnapshot(host="h0", version="x", planes=1, traffic=TrafficCounters(rejections=flood))
    got = samples(exposition(lambda: snap))
    series = {lab for (n, lab) in got if n == "mrc_rejected_packets_total"}
    assert len(series) <= MAX_REASONS + 1
    total = sum(v for (n, _), v in got.items() if n == "mrc_rejected_packets_total")
    assert total == 500  # folded into "other", not lost
    retx = {lab[0][1] for (n, lab) in got if n == "mrc_retransmissions_total"}
    assert retx == set(RETRANSMIT_REASONS)


def test_control_auth_failures_count_only_failed_authentication(tmp_path: Path) -> None:
    """A real mrcd: a wrong cluster key is an authentication failure; a connection closed
    before its handshake or one that sends junk is a rejection, counted by its reason."""
    d = Daemons(tmp_path, hosts=(0,)).start()
    try:
        node = d.nodes[0]
        assert node.control_server is not None
        address = node.control_server.address

        async def wrong_key() -> None:
            cli = ControlClient("h3", Credentials.from_psk("h3", bytes(32)))
            try:
                with pytest.raises(ControlError, match="refuses our credentials"):
                    await cli.open_session("h0", address)
            finally:
                await cli.close()

        d.run(wrong_key())
        for junk in (b"", b"GET /metrics HTTP/1.1\r\n\r\n"):
            with socket.create_connection(address) as sock:
                sock.sendall(junk)
                sock.shutdown(socket.SHUT_WR)
                assert sock.recv(64) == b""  # mrcd says nothing, then hangs up
        expected = {"eof": 1, "oversized": 1}

        def counted() -> bool:
            return dict(node.control_stats.rejected) == expected

        d.run(wait_for(counted))
        got = samples(exposition(lambda: d.on_loop(node.snapshot)))
    finally:
        d.stop()
    assert got[("mrc_control_auth_failures_total", ())] == 1
    rejections = {
        lab[0][1]: v for (n, lab), v in got.items() if n == "mrc_control_rejections_total"
    }
    assert {k: v for k, v in rejections.items() if v} == expected


def test_a_failing_snapshot_does_not_break_the_scrape() -> None:
    def broken() -> NodeSnapshot:
        raise KeyError("node is half stopped")

    registry = make_registry(broken, runtime=False)
    for n in (1, 2):
        got = samples(generate_latest(registry).decode())
        assert got == {("mrc_snapshot_errors_total", ()): n}


def test_the_daemon_registry_adds_its_process_and_gc() -> None:
    """What every Prometheus exporter has: the process's CPU, memory and descriptors, and
    Python's collections by generation (here the test runner's own)."""
    got = samples(generate_latest(make_registry(populated)).decode())
    assert got[("process_cpu_seconds_total", ())] > 0
    assert got[("process_resident_memory_bytes", ())] > 1 << 20
    assert got[("process_open_fds", ())] >= 3
    assert {lab for (n, lab) in got if n == "python_gc_collections_total"} == {
        (("generation", str(g)),) for g in range(3)
    }
    assert got[("mrc_worker_cpu_seconds_total", (("worker", "0"),))] == 12.5  # mrcd's too


def test_registry_is_explicit() -> None:
    make_registry(populated)
    assert "mrc_" not in generate_latest(REGISTRY).decode()
    a = samples(exposition(populated))
    b = samples(exposition(lambda: NodeSnapshot(host="h1", version="x", planes=4)))
    assert a != b  # two nodes in one process do not share state


# Listen addresses and the HTTP endpoint ----------------------------------------------------------
def test_parse_listen_address() -> None:
    assert parse_listen_address("127.0.0.1:9464") == ("127.0.0.1", 9464)
    assert parse_listen_address("[::1]:9464") == ("::1", 9464)
    assert parse_listen_address("[fd00::2]:0") == ("fd00::2", 0)
    assert parse_listen_address("localhost:80") == ("localhost", 80)
    assert parse_listen_address(":9464") == ("", 9464)
    for bad in ("9464", "::1:9464", "[::1]", "[::1]9464", "[nope]:1", "h:99999", "h:x", "a b:1"):
        with pytest.raises(ListenAddressError) as info:
            parse_listen_address(bad)
        assert "\n" not in str(info.value) and repr(bad) in str(info.value)


def fetch(url: str, headers: dict[str, str] | None = None, method: str = "GET") -> tuple:  # type: ignore[type-arg]
    req = urllib.request.Request(url, headers=headers or {}, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), exc.read()


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "[::1]:0"])
async def test_http_endpoint_serves_and_stops(listen: str) -> None:
    scrapes = 0

    def snap() -> NodeSnapshot:
        nonlocal scrapes
        scrapes += 1
        return populated()

    server = await serve(make_registry(snap), listen)
    try:
        url = server.url
        assert server.address[1] > 0
        status, headers, body = await asyncio.to_thread(fetch, url)
        assert status == 200 and headers["Content-Type"].startswith("text/plain")
        assert b"mrc_sent_bytes_total" in body and scrapes == 1
        status, headers, body = await asyncio.to_thread(fetch, url, {"Accept-Encoding": "gzip"})
        assert headers.get("Content-Encoding") == "gzip"
        assert b"mrc_rtt_seconds_bucket" in gzip.decompress(body)
        om = "application/openmetrics-text; version=1.0.0"
        status, headers, body = await asyncio.to_thread(fetch, url, {"Accept": om})
        assert headers["Content-Type"].startswith("application/openmetrics-text")
        assert body.rstrip().endswith(b"# EOF")
        base = url.removesuffix("/metrics")
        assert (await asyncio.to_thread(fetch, base + "/nope"))[0] == 404
        assert (await asyncio.to_thread(fetch, base + "/"))[0] == 200
        assert (await asyncio.to_thread(fetch, url, None, "POST"))[0] == 405
        status, _, body = await asyncio.to_thread(fetch, url, None, "HEAD")
        assert status == 200 and body == b""
        # garbage and a half request: the server shrugs and keeps serving
        host, port = server.address
        for junk in (b"\x00\xff garbage\r\n\r\n", b"GET /metrics HTTP/1.1\r\nHost: x"):
            _, writer = await asyncio.open_connection(host, port)
            writer.write(junk)
            await writer.drain()
            writer.close()
        assert (await asyncio.to_thread(fetch, url))[0] == 200
        # a second exporter cannot take the same port: one clear line
        with pytest.raises(ListenAddressError, match="cannot listen"):
            await serve(
                make_registry(snap), f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            )
    finally:
        await server.stop()
    await server.stop()  # idempotent
    with pytest.raises(OSError):
        socket.create_connection((host, port), timeout=2).close()


async def test_bad_listen_addresses_fail_with_one_line() -> None:
    registry = make_registry(populated)
    for bad in ("nope", "192.0.2.1:9464", "[::1]:70000"):
        with pytest.raises(ListenAddressError) as info:
            await serve(registry, bad)
        assert "\n" not in str(info.value)


# Prometheus itself ------------------------------------------------------------------------------
@pytest.mark.requires_program("promtool")
def test_example_and_generated_configs_are_valid(tmp_path: Path) -> None:
    assert PROMTOOL is not None
    generated = tmp_path / "prometheus.yml"
    generated.write_text(prometheus_config(["127.0.0.1:9464", "[fd00::2]:9464"], 0.5))
    for path in (ROOT / "examples" / "prometheus.yml", generated):
        res = subprocess.run(
            [PROMTOOL, "check", "config", str(path)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert res.returncode == 0, res.stdout + res.stderr
    with pytest.raises(ValueError):
        prometheus_config([":9464"])
    with pytest.raises(ValueError):
        prometheus_config([])


@pytest.mark.requires_program("prometheus")
async def test_real_prometheus_scrapes_the_exporter(tmp_path: Path) -> None:
    """The local version of the testbed acceptance test: scrape, then query the API."""
    scrapes = 0

    def snap() -> NodeSnapshot:
        nonlocal scrapes
        scrapes += 1
        return populated()

    exporter = await serve(make_registry(snap), "127.0.0.1:0")
    try:
        host, port = exporter.address
        with run_prometheus([f"{host}:{port}"], tmp_path / "prom", scrape_interval=0.5) as prom:
            up = await asyncio.to_thread(prom.wait_for, 'up{job="mrcd"} == 1')
            assert up[0]["metric"]["instance"] == f"{host}:{port}"  # type: ignore[index]
            sent = await asyncio.to_thread(prom.wait_for, "mrc_sent_bytes_total", 30.0, 4)
            by_plane = {s["metric"]["plane"]: float(s["value"][1]) for s in sent}  # type: ignore[index]
            assert by_plane["3"] == 8192 * (1003 + 2003)
            names = await asyncio.to_thread(prom.api, "label/__name__/values")
            assert isinstance(names, list)
            ours = sorted(n for n in names if n.startswith("mrc_"))
            for want in (
                "mrc_retransmissions_total",
                "mrc_rejected_packets_total",
                "mrc_evs",
                "mrc_plane_up",
                "mrc_rtt_seconds_bucket",
                "mrc_write_completion_seconds_count",
            ):
                assert want in ours
            p99 = await asyncio.to_thread(
                prom.query, "histogram_quantile(0.5, mrc_rtt_seconds_bucket)"
            )
            assert 1e-5 < float(p99[0]["value"][1]) < 1e-3  # type: ignore[index]
            print(f"\nprometheus scraped {scrapes} times; {len(ours)} mrc_ series names")
    finally:
        await exporter.stop()
