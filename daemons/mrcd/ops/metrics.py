"""Prometheus metrics for mrcd: a collector that reads one :class:`NodeSnapshot` per scrape.

The node keeps plain integers on the hot path (:mod:`mrcstack.daemons.mrcd.node.snapshot`);
nothing here counts twice. At scrape time :class:`MetricsCollector` calls
``snapshot_fn()`` once and turns the frozen snapshot into metric families.  Labels are
bounded sets only (``plane``, ``state``, ``reason``): never an EV, a QP or an address.

The HTTP side is an asyncio server on the daemon's own loop (not prometheus_client's
threaded WSGI server), so ``snapshot_fn`` always runs on the loop that owns the node's state.
:mod:`mrcstack.daemons.mrcd.ops.promserver` runs a real Prometheus server against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import logging
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client import GCCollector, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from prometheus_client.utils import floatToGoString

from mrcstack.core.events import EvState
from mrcstack.core.reasons import NACK_NAMES, RejectReason, RetxReason
from mrcstack.daemons.mrcd.agent.agent import AgentSnapshot
from mrcstack.daemons.mrcd.agent.linkprobes import REASONS as LINK_PROBE_REASONS
from mrcstack.daemons.mrcd.control.server import REJECT_REASONS as CONTROL_REJECT_REASONS
from mrcstack.daemons.mrcd.control.server import bound_address
from mrcstack.daemons.mrcd.datapath.probes import REASONS as PROBE_REASONS
from mrcstack.daemons.mrcd.datapath.probes import ProbeAuth
from mrcstack.daemons.mrcd.node.peers import SIGNALS as PEER_SIGNALS
from mrcstack.daemons.mrcd.node.snapshot import HistogramSnapshot, NodeSnapshot
from mrcstack.wire import DecodeReason

log = logging.getLogger("mrcd.metrics")

DEFAULT_LISTEN = "127.0.0.1:9464"

#: Reasons always exported (as 0 until they happen) so ``rate()`` works from the start.
RETRANSMIT_REASONS = tuple(r.value for r in RetxReason)
NACK_REASONS = tuple(NACK_NAMES.values())
REJECT_REASONS = (
    *(r.name.lower() for r in DecodeReason),  # the core counts DecodeReason names
    *(r.value for r in RejectReason),
    "unknown_qpn",  # transport: no QP with that number
    "malformed",  # transport: not even a BTH
    "wrong_worker",  # a data-path worker got another's QP's datagram (dropped)
    *PROBE_REASONS,  # QPN 0: refused EV probes (daemons/mrcd/datapath/probes.py)
)
PROBE_AUTHS = tuple(a.value for a in ProbeAuth)
EV_STATES = tuple(s.value for s in EvState)
#: At most this many distinct reasons per family; more fold into "other" (bounded labels).
MAX_REASONS = 32


def _bounded(known: Sequence[str], table: Mapping[str, int]) -> list[tuple[str, int]]:
    """Known reasons first (zeros included), then others, folding past MAX_REASONS."""
    values = dict.fromkeys(known, 0)
    other = 0
    for key, n in table.items():
        if key in values or len(values) < MAX_REASONS:
            values[key] = values.get(key, 0) + n
        else:
            other += n
    if other:
        values["other"] = values.get("other", 0) + other
    return list(values.items())


class MetricsCollector:
    """prometheus_client custom collector over ``snapshot_fn`` (called once per scrape)."""

    def __init__(self, snapshot_fn: Callable[[], NodeSnapshot]) -> None:
        self.snapshot_fn = snapshot_fn
        self.errors = 0

    def describe(self) -> list[Metric]:
        return []  # no describe-time call of snapshot_fn at registration

    def collect(self) -> Iterator[Metric]:
        try:
            snap = self.snapshot_fn()
        except Exception:  # a broken snapshot must not break the exporter
            self.errors += 1
            if self.errors == 1:
                log.exception("event=metrics_snapshot_failed")
            snap = None
        yield CounterMetricFamily(
            "mrc_snapshot_errors",
            "Scrapes whose node snapshot failed (the node's metrics were left out).",
            value=self.errors,
        )
        if snap is not None:
            yield from _families(snap)


def _per_plane(
    family: CounterMetricFamily | GaugeMetricFamily, values: Sequence[float]
) -> CounterMetricFamily | GaugeMetricFamily:
    for plane, v in enumerate(values):
        family.add_metric([str(plane)], float(v))
    return family


def _le(bound: float) -> str:
    """A bucket bound as Prometheus clients write it (Go's float formatting: 1e-06, 0.5)."""
    return str(floatToGoString(bound))  # type: ignore[no-untyped-call]


def _histogram(name: str, doc: str, h: HistogramSnapshot) -> HistogramMetricFamily:
    buckets = [(_le(b), float(c)) for b, c in zip(h.bounds, h.cumulative[:-1], strict=True)]
    buckets.append(("+Inf", float(h.count)))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=h.sum)


def _families(s: NodeSnapshot) -> Iterator[Metric]:
    t = s.traffic
    info = InfoMetricFamily("mrc_daemon", "The mrcd daemon: version and fabric host.")
    info.add_metric([], {"host": s.host, "version": s.version})
    yield info
    yield GaugeMetricFamily("mrc_planes", "Planes in the fabric.", value=s.planes)
    yield GaugeMetricFamily(
        "mrc_start_time_seconds", "Unix time the daemon started.", value=s.start_time
    )
    for name, doc, values in (
        ("mrc_sent_bytes", "Bytes of MRC datagrams sent, by plane.", t.bytes_sent),
        ("mrc_received_bytes", "Bytes of MRC datagrams received, by plane.", t.bytes_received),
        ("mrc_sent_packets", "MRC datagrams sent, by plane.", t.packets_sent),
        ("mrc_received_packets", "MRC datagrams received, by plane.", t.packets_received),
    ):
        yield _per_plane(CounterMetricFamily(name, doc, labels=["plane"]), values)
    yield CounterMetricFamily(
        "mrc_placed_bytes",
        "Payload bytes placed into registered memory.",
        value=t.data_bytes_placed,
    )
    link = s.port_link_up or (True,) * s.planes
    admin = s.port_admin_up or (True,) * s.planes
    usable = tuple(a and b for a, b in zip(link, admin, strict=True))
    for gauge, doc, flags in (
        ("mrc_plane_up", "1 if the plane's NIC port is usable (link up and admin up).", usable),
        ("mrc_plane_link_up", "1 if the plane's NIC port has carrier (netlink).", link),
        ("mrc_plane_admin_up", "1 if the plane's NIC port is administratively enabled.", admin),
    ):
        yield _per_plane(GaugeMetricFamily(gauge, doc, labels=["plane"]), [int(v) for v in flags])
    yield GaugeMetricFamily("mrc_connections", "Live (connected) QPs.", value=s.connections)
    yield GaugeMetricFamily(
        "mrc_retry_budget_seconds",
        "The longest retry budget of a live QP: how long a QP waits without progress "
        "before it fails on its own (0 with no QP).",
        value=s.retry_budget,
    )
    yield GaugeMetricFamily(
        "mrc_workers", "Data-path worker processes (1: the daemon's own).", value=s.workers
    )
    per_worker = GaugeMetricFamily(
        "mrc_worker_qps", "Live QPs each data-path worker carries.", labels=["worker"]
    )
    for worker, n in enumerate(s.worker_qps):
        per_worker.add_metric([str(worker)], float(n))
    yield per_worker
    cpu = CounterMetricFamily(
        "mrc_worker_cpu_seconds",
        "CPU seconds (user + system) each data-path worker has used, its restarted "
        "processes' included; with one worker, the daemon's own process. A rate near 1 is "
        "a worker on a full core.",
        labels=["worker"],
    )
    for worker, seconds in enumerate(s.worker_cpu):
        cpu.add_metric([str(worker)], seconds)
    yield cpu
    yield CounterMetricFamily(
        "mrc_worker_restarts",
        "Data-path workers that died and were started again (their QPs failed).",
        value=s.worker_restarts,
    )

    reasons: list[tuple[str, str, Sequence[str], Mapping[str, int]]] = [
        (
            "mrc_retransmissions",
            "Packets retransmitted, by why they were deemed lost.",
            RETRANSMIT_REASONS,
            t.retransmissions,
        ),
        ("mrc_nacks_received", "NACKs received, by NACK reason.", NACK_REASONS, t.nacks_received),
        (
            "mrc_rejected_packets",
            "Received datagrams rejected, by reason (decode, auth, replay, rkey, qpn, ...).",
            REJECT_REASONS,
            t.rejections,
        ),
        (
            "mrc_control_rejections",
            "Control-channel connections closed for a reason other than failed authentication "
            "(busy, timeout, eof, a bad frame or record, ...).",
            CONTROL_REJECT_REASONS,
            s.control_rejections,
        ),
        (
            "mrc_peer_failures",
            "Times a peer was found gone and our QPs to it failed at once, by the signal "
            "(control_refused, restarted, unreachable, ports_down, silent).",
            PEER_SIGNALS,
            s.peer_failures,
        ),
    ]
    for name, doc, known, table in reasons:
        fam = CounterMetricFamily(name, doc, labels=["reason"])
        for reason, n in _bounded(known, table):
            fam.add_metric([reason], n)
        yield fam
    answers = CounterMetricFamily(
        "mrc_probe_answers",
        "EV probes answered, by how the probe was authenticated: sealed (with the key of "
        "the pair of hosts; the answer carries our port bitmap), icrc (the ICRC only, from "
        "a host we share a key with: its QPs' own EV probes), icrc_no_key (the ICRC, from a "
        "host we share no key with). Refused probes count in mrc_rejected_packets_total.",
        labels=["auth"],
    )
    for auth, n in _bounded(PROBE_AUTHS, s.probe_answers):
        answers.add_metric([auth], n)
    yield answers
    for name, doc, value in (
        (
            "mrc_spurious_retransmissions",
            "Packets declared lost and resent that the receiver already had.",
            t.spurious_retransmissions,
        ),
        (
            "mrc_tlp_unneeded",
            "Tail-loss probes that found the tail had arrived (nothing was lost).",
            t.tlp_unneeded,
        ),
        ("mrc_trims_received", "Trimmed data packets received.", t.trims_received),
        ("mrc_ecn_echoes", "ECN echoes received (our packets were marked).", t.ecn_echoes),
        ("mrc_ecn_marks_received", "CE-marked data packets received.", t.ecn_received),
        ("mrc_duplicate_packets", "Duplicate data packets received.", t.duplicates),
        ("mrc_ev_state_changes", "EV state transitions.", t.ev_state_changes),
        ("mrc_probes_sent", "EV probes sent.", t.probes_sent),
        ("mrc_probe_replies", "EV probe replies received.", t.probe_replies),
        ("mrc_send_errors", "Datagrams the kernel refused to send.", t.send_errors),
        (
            "mrc_control_auth_failures",
            "Control-channel peers that failed mutual authentication.",
            s.control_auth_failures,
        ),
    ):  # fmt: skip
        yield CounterMetricFamily(name, doc, value=value)

    evs = GaugeMetricFamily(
        "mrc_evs", "EVs of live connections, by plane and state.", labels=["plane", "state"]
    )
    states = [*EV_STATES, *sorted(k for k in s.evs if k not in EV_STATES)][:MAX_REASONS]
    for state in states:
        counts = s.evs.get(state, (0,) * s.planes)
        for plane, n in enumerate(counts):
            evs.add_metric([str(plane), state], n)
    yield evs
    yield _histogram("mrc_rtt_seconds", "Round-trip time samples.", s.rtt)
    yield _histogram(
        "mrc_write_completion_seconds",
        "Time from posting a write to its completion.",
        s.write_completion,
    )


class AgentCollector:
    """The fabric mapper's probing agent (``[mrcd.mapper]``): its probes, refusals, session
    and the denylist it holds, read once per scrape."""

    def __init__(self, snapshot_fn: Callable[[], AgentSnapshot]) -> None:
        self.snapshot_fn = snapshot_fn

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        a = self.snapshot_fn()
        yield GaugeMetricFamily(
            "mrc_link_probe_interval_seconds", "Seconds between two rounds of link probes.",
            value=a.interval,
        )  # fmt: skip
        yield GaugeMetricFamily("mrc_link_probe_loops", "Loops this host probes.", value=a.loops)
        for name, doc, value in (
            ("mrc_link_probes_sent", "Link probes sent.", a.probes_sent),
            ("mrc_link_probes_back", "Link probes back in time.", a.probes_back),
            ("mrc_link_probes_lost", "Link probes not back in time.", a.probes_lost),
            (
                "mrc_link_probe_rounds_void",
                "Rounds none of whose probes came back on any plane: no result (the host's "
                "own stack held them up, not its links).",
                a.rounds_void,
            ),
            ("mrc_link_probe_send_errors", "Link probes the kernel refused.", a.send_errors),
            ("mrc_mapper_sessions", "Sessions opened to the mapper.", a.sessions),
            (
                "mrc_mapper_reports_dropped",
                "Messages to the mapper dropped: no session, or the mapper not keeping up.",
                a.reports_dropped,
            ),
        ):
            yield CounterMetricFamily(name, doc, value=value)
        refused = CounterMetricFamily(
            "mrc_link_probe_refusals",
            "Datagrams on the link probe sockets refused, by reason (forged, misrouted, "
            "replayed, late, unknown).",
            labels=["reason"],
        )
        for reason, n in _bounded(LINK_PROBE_REASONS, a.refused):
            refused.add_metric([reason.removeprefix("link_probe_")], n)
        yield refused
        ended = CounterMetricFamily(
            "mrc_mapper_sessions_ended", "Sessions to the mapper that ended, by reason.",
            labels=["reason"],
        )  # fmt: skip
        for reason, n in _bounded((), a.sessions_ended):
            ended.add_metric([reason], n)
        yield ended
        yield GaugeMetricFamily(
            "mrc_mapper_connected", "1 while a session to the mapper is open.",
            value=int(a.connected),
        )  # fmt: skip
        yield GaugeMetricFamily(
            "mrc_link_denylist_links", "Links on the denylist in force.", value=a.denylist_links
        )
        yield GaugeMetricFamily(
            "mrc_link_denylist_version", "Version of the denylist in force.",
            value=a.denylist_version,
        )  # fmt: skip
        yield GaugeMetricFamily(
            "mrc_link_denied_evs",
            "EVs of live QPs denied because their path crosses a link of the denylist.",
            value=a.denied_evs,
        )


def make_registry(
    snapshot_fn: Callable[[], NodeSnapshot], *, runtime: bool = True
) -> CollectorRegistry:
    """An explicit registry (never the global one) of mrcd's collector and, with
    ``runtime``, prometheus_client's usual ``process_*`` and ``python_gc_*`` families of
    the daemon's own process (its data-path workers' CPU is ``mrc_worker_cpu_seconds``)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(snapshot_fn))
    if runtime:
        ProcessCollector(registry=registry)
        GCCollector(registry=registry)
    return registry


# The /metrics endpoint ----------------------------------------------------------------------
class ListenAddressError(ValueError):
    """A bad ``--web.listen-address`` (one line, names the address)."""


def parse_listen_address(text: str) -> tuple[str, int]:
    """``"127.0.0.1:9464"``, ``"[::1]:9464"``, ``"host:9464"`` or ``":9464"`` (all
    addresses: only when asked) -> (host, port); host "" means all."""
    if not isinstance(text, str):
        raise ListenAddressError(f"bad listen address {text!r}: not a string")
    if text.startswith("["):
        host, sep, rest = text[1:].partition("]")
        if not sep or not rest.startswith(":"):
            raise ListenAddressError(f"bad listen address {text!r}: expected [v6]:port")
        port_text = rest[1:]
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise ListenAddressError(f"bad listen address {text!r}: {host!r} is not IPv6") from None
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ListenAddressError(f"bad listen address {text!r}: expected host:port")
        if ":" in host:
            raise ListenAddressError(
                f"bad listen address {text!r}: put IPv6 addresses in brackets, e.g. [::1]:9464"
            )
        if host and not all(c.isalnum() or c in ".-_" for c in host):
            raise ListenAddressError(f"bad listen address {text!r}: bad host {host!r}")
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ListenAddressError(f"bad listen address {text!r}: port must be 0..65535")
    return host, int(port_text)


#: Limits for the tiny HTTP server: Prometheus sends one small GET per scrape.
MAX_REQUEST_HEAD = 16384
REQUEST_TIMEOUT = 10.0
_INDEX = b'<html><body><h1>mrcd</h1><p><a href="/metrics">metrics</a></p></body></html>\n'


#: A page besides /metrics: called per request, returns (content type, body).
Page = Callable[[], tuple[str, bytes]]


class MetricsServer:
    """Serves ``/metrics`` from ``registry`` on the running loop, and ``pages`` (path ->
    :data:`Page`) beside it; :meth:`stop` closes it."""

    def __init__(
        self,
        registry: CollectorRegistry,
        pages: Mapping[str, Page] | None = None,
        index: bytes = _INDEX,
    ) -> None:
        self.registry = registry
        self.pages = dict(pages or {})
        self.index = index
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> tuple[str, int]:
        """The first bound (host, port): useful after asking for port 0."""
        return bound_address(self._server, "metrics server")

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}/metrics" if ":" in host else f"http://{host}:{port}/metrics"

    async def start(self, listen: str) -> None:
        host, port = parse_listen_address(listen)
        try:
            self._server = await asyncio.start_server(
                self._handle, host or None, port, limit=MAX_REQUEST_HEAD, reuse_address=True
            )
        except (OSError, UnicodeError) as exc:  # in use, not an address of this host, ...
            reason = getattr(exc, "strerror", None) or str(exc)
            raise ListenAddressError(f"cannot listen on {listen!r}: {reason}") from None

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.close()
        await server.wait_closed()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), REQUEST_TIMEOUT)
            status, ctype, body, extra = self._respond(head)
            method = head.split(b" ", 1)[0]
            lines = [
                f"HTTP/1.1 {status}",
                f"Content-Type: {ctype}",
                f"Content-Length: {len(body)}",
                "Connection: close",
                *extra,
            ]
            writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1"))
            if method != b"HEAD":
                writer.write(body)
            await asyncio.wait_for(writer.drain(), REQUEST_TIMEOUT)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError):
            pass  # a client that sent no complete or an oversized request gets nothing
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    def _respond(self, head: bytes) -> tuple[str, str, bytes, list[str]]:
        text = head.decode("latin-1")
        request, *header_lines = text.split("\r\n")
        parts = request.split(" ")
        headers: dict[str, str] = {}
        for line in header_lines:
            key, sep, value = line.partition(":")
            if sep:
                headers[key.strip().lower()] = value.strip()
        plain = "text/plain; charset=utf-8"
        if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
            return "400 Bad Request", plain, b"bad request\n", []
        method, target = parts[0], parts[1]
        if method not in ("GET", "HEAD"):
            return "405 Method Not Allowed", plain, b"GET only\n", ["Allow: GET, HEAD"]
        path = urllib.parse.urlsplit(target).path
        if path == "/":
            return "200 OK", "text/html; charset=utf-8", self.index, []
        page = self.pages.get(path)
        if page is not None:
            ctype, body = page()
            return "200 OK", ctype, body, []
        if path != "/metrics":
            return "404 Not Found", plain, b"not found; try /metrics\n", []
        encoder, ctype = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra: list[str] = []
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            extra.append("Content-Encoding: gzip")
        return "200 OK", ctype, body, extra


async def serve(
    registry: CollectorRegistry,
    listen: str = DEFAULT_LISTEN,
    pages: Mapping[str, Page] | None = None,
    index: bytes = _INDEX,
) -> MetricsServer:
    """Start serving ``/metrics`` (and ``pages``); raises :class:`ListenAddressError` (one
    line) on a bad or unusable address.  ``await server.stop()`` closes the listener and
    open connections."""
    server = MetricsServer(registry, pages, index)
    await server.start(listen)
    return server
