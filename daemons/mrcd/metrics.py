"""Prometheus metrics for mrcd: a collector that reads one :class:`NodeSnapshot` per scrape.

The node keeps plain integers on the hot path (the core's ``ConnectionStats``, the
transport's ``TransportStats``, two :class:`Buckets` histograms); nothing here counts twice.
At scrape time :class:`MetricsCollector` calls ``snapshot_fn()`` once and turns the frozen
snapshot into metric families.  Labels are bounded sets only (``plane``, ``state``,
``reason``): never an EV, a QP or an address.

The HTTP side is an asyncio server on the daemon's own loop (not prometheus_client's
threaded WSGI server), so ``snapshot_fn`` always runs on the loop that owns the node's state.
:mod:`daemons.mrcd.promserver` runs a real Prometheus server against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import ipaddress
import logging
import math
import urllib.parse
from bisect import bisect_left
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

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

from daemons.mrcd.controlserver import REJECT_REASONS as CONTROL_REJECT_REASONS
from mrcstack.core.config import ConnectionStats
from mrcstack.core.events import EvState
from mrcstack.wire import DecodeReason, NackReason

log = logging.getLogger("mrcd.metrics")

DEFAULT_LISTEN = "127.0.0.1:9464"

#: Histogram bounds in seconds, 1-2-5 per decade from 1 us to 10 s (22 buckets plus +Inf).
DEFAULT_BOUNDS: tuple[float, ...] = (
    *(float(f"{m}e{e}") for e in range(-6, 1) for m in (1, 2, 5)),
    10.0,
)

#: Reasons always exported (as 0 until they happen) so ``rate()`` works from the start.
RETRANSMIT_REASONS = ("timeout", "nack", "trim", "sack", "rack", "port")
NACK_REASONS = tuple(r.name.lower() for r in NackReason)
REJECT_REASONS = (
    *(r.name.lower() for r in DecodeReason),  # the core counts DecodeReason names
    "port",
    "qpn",
    "replay",
    "rkey",
    "psn_window",
    "no_reverse_path",
    "unknown_qpn",  # transport: no QP with that number
    "malformed",  # transport: not even a BTH
    "probe_source",  # QPN 0: a probe from no host's NIC (daemons/mrcd/probes.py)
    "probe_unexpected",  # QPN 0: a well-formed packet that is no probe
)
EV_STATES = tuple(s.value for s in EvState)
#: At most this many distinct reasons per family; more fold into "other" (bounded labels).
MAX_REASONS = 32


# Histograms ---------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class HistogramSnapshot:
    """Cumulative bucket counts: ``cumulative[i]`` counts observations <= ``bounds[i]``;
    the last entry (one more than ``bounds``) is the +Inf bucket, i.e. the total count."""

    bounds: tuple[float, ...] = DEFAULT_BOUNDS
    cumulative: tuple[int, ...] = (0,) * (len(DEFAULT_BOUNDS) + 1)
    sum: float = 0.0

    def __post_init__(self) -> None:
        if len(self.cumulative) != len(self.bounds) + 1:
            raise ValueError("cumulative needs one count per bound plus +Inf")

    @property
    def count(self) -> int:
        return self.cumulative[-1]

    def __add__(self, other: HistogramSnapshot) -> HistogramSnapshot:
        if self.bounds != other.bounds:
            raise ValueError("cannot add histograms with different bounds")
        return HistogramSnapshot(
            self.bounds,
            tuple(a + b for a, b in zip(self.cumulative, other.cumulative, strict=True)),
            self.sum + other.sum,
        )


class Buckets:
    """A histogram cheap enough for the hot path: one bisect and two additions."""

    __slots__ = ("_counts", "_sum", "bounds")

    def __init__(self, bounds: Sequence[float] = DEFAULT_BOUNDS) -> None:
        b = tuple(float(x) for x in bounds)
        if not b or any(not math.isfinite(x) for x in b) or list(b) != sorted(set(b)):
            raise ValueError("bounds must be finite, strictly increasing and not empty")
        self.bounds = b
        self._counts = [0] * (len(b) + 1)
        self._sum = 0.0

    def observe(self, seconds: float) -> None:
        if math.isnan(seconds):  # nothing sensible to count
            return
        if seconds < 0.0:
            seconds = 0.0
        # bisect_left: a value equal to a bound belongs to that bucket (le is inclusive).
        self._counts[bisect_left(self.bounds, seconds)] += 1
        self._sum += seconds

    def snapshot(self) -> HistogramSnapshot:
        total = 0
        cumulative = []
        for n in self._counts:
            total += n
            cumulative.append(total)
        return HistogramSnapshot(self.bounds, tuple(cumulative), self._sum)


# The snapshot: the contract between the node and the metrics -------------------------------
def _empty() -> Mapping[str, int]:
    return MappingProxyType({})


@dataclass(frozen=True, slots=True)
class TrafficCounters:
    """Cumulative data-path counters, summed over live and closed connections.

    Per-plane tuples are indexed by plane.  Reason maps use the core's reason names (see
    ``RETRANSMIT_REASONS``, ``NACK_REASONS``, ``REJECT_REASONS``).
    """

    packets_sent: tuple[int, ...] = ()
    bytes_sent: tuple[int, ...] = ()
    packets_received: tuple[int, ...] = ()
    bytes_received: tuple[int, ...] = ()
    data_bytes_placed: int = 0
    retransmissions: Mapping[str, int] = field(default_factory=_empty)
    spurious_retransmissions: int = 0
    trims_received: int = 0
    nacks_received: Mapping[str, int] = field(default_factory=_empty)
    ecn_echoes: int = 0
    ecn_received: int = 0
    duplicates: int = 0
    rejections: Mapping[str, int] = field(default_factory=_empty)
    ev_state_changes: int = 0
    probes_sent: int = 0
    probe_replies: int = 0
    send_errors: int = 0


@dataclass(frozen=True, slots=True)
class NodeSnapshot:
    """What one scrape sees of a node (``Node.snapshot()``); built on the loop, read once."""

    host: str  # the fabric host name, e.g. "h0"
    version: str
    planes: int
    start_time: float = 0.0  # unix time the daemon started
    port_link_up: tuple[bool, ...] = ()  # per plane: carrier (netlink)
    port_admin_up: tuple[bool, ...] = ()  # per plane: the controller's admin state
    connections: int = 0  # live (RTS) connections
    #: EV state value (EvState.value) -> number of EVs in that state, per plane, summed
    #: over live connections (EVs not in use count as "unknown").
    evs: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: MappingProxyType({}))
    traffic: TrafficCounters = field(default_factory=TrafficCounters)
    rtt: HistogramSnapshot = field(default_factory=HistogramSnapshot)
    write_completion: HistogramSnapshot = field(default_factory=HistogramSnapshot)
    control_auth_failures: int = 0  # control-channel peers that failed authentication
    #: Other control-channel connections closed, by reason (controlserver.REJECT_REASONS).
    control_rejections: Mapping[str, int] = field(default_factory=_empty)

    def __post_init__(self) -> None:
        if self.planes < 0:
            raise ValueError("planes must be >= 0")
        t = self.traffic
        per_plane = {
            "port_link_up": self.port_link_up,
            "port_admin_up": self.port_admin_up,
            "traffic.packets_sent": t.packets_sent,
            "traffic.bytes_sent": t.bytes_sent,
            "traffic.packets_received": t.packets_received,
            "traffic.bytes_received": t.bytes_received,
            **{f"evs[{k!r}]": v for k, v in self.evs.items()},
        }
        for name, values in per_plane.items():
            if values and len(values) != self.planes:
                raise ValueError(f"{name} has {len(values)} entries for {self.planes} planes")


class Totals:
    """Mutable sums of ``ConnectionStats``: keep one for closed connections (counters never
    go down), copy it at scrape time, add the live connections, :meth:`freeze`."""

    __slots__ = (
        "bytes_received",
        "bytes_sent",
        "ints",
        "maps",
        "packets_received",
        "packets_sent",
        "planes",
    )
    _INTS = (
        "data_bytes_placed",
        "spurious_retransmissions",
        "trims_received",
        "ecn_echoes",
        "ecn_received",
        "duplicates",
        "ev_state_changes",
        "probes_sent",
        "probe_replies",
    )

    def __init__(self, planes: int) -> None:
        self.planes = planes
        self.packets_sent = [0] * planes
        self.bytes_sent = [0] * planes
        self.packets_received = [0] * planes
        self.bytes_received = [0] * planes
        self.ints = dict.fromkeys((*self._INTS, "send_errors"), 0)
        self.maps: dict[str, dict[str, int]] = {
            "retransmissions": {},
            "nacks_received": {},
            "rejections": {},
        }

    def add(self, stats: ConnectionStats) -> None:
        for mine, theirs in (
            (self.packets_sent, stats.packets_sent),
            (self.bytes_sent, stats.bytes_sent),
            (self.packets_received, stats.packets_received),
            (self.bytes_received, stats.bytes_received),
        ):
            for i, n in enumerate(theirs[: self.planes]):
                mine[i] += n
        for name in self._INTS:
            self.ints[name] += getattr(stats, name)
        for name, table in (
            ("retransmissions", stats.retransmissions),
            ("nacks_received", stats.nacks_received),
            ("rejections", stats.rejected),
        ):
            self.add_reasons(name, table)

    def add_reasons(self, name: str, table: Mapping[str, int]) -> None:
        """Add ``table`` to the reason map ``name`` (retransmissions, nacks_received,
        rejections); e.g. the transport's ``unknown_qpn`` and ``malformed`` rejections."""
        mine = self.maps[name]
        for key, n in table.items():
            mine[key] = mine.get(key, 0) + n

    def add_send_errors(self, n: int) -> None:
        self.ints["send_errors"] += n

    def copy(self) -> Totals:
        other = Totals(self.planes)
        for name in ("packets_sent", "bytes_sent", "packets_received", "bytes_received"):
            setattr(other, name, list(getattr(self, name)))
        other.ints = dict(self.ints)
        other.maps = {k: dict(v) for k, v in self.maps.items()}
        return other

    def freeze(self) -> TrafficCounters:
        return TrafficCounters(
            packets_sent=tuple(self.packets_sent),
            bytes_sent=tuple(self.bytes_sent),
            packets_received=tuple(self.packets_received),
            bytes_received=tuple(self.bytes_received),
            retransmissions=MappingProxyType(dict(self.maps["retransmissions"])),
            nacks_received=MappingProxyType(dict(self.maps["nacks_received"])),
            rejections=MappingProxyType(dict(self.maps["rejections"])),
            **self.ints,
        )


def count_evs(planes: int, states: Iterable[tuple[int, str]]) -> Mapping[str, tuple[int, ...]]:
    """``(plane, EvState.value)`` pairs -> the ``NodeSnapshot.evs`` table (out of range
    planes are ignored)."""
    table: dict[str, list[int]] = {}
    for plane, state in states:
        if 0 <= plane < planes:
            table.setdefault(state, [0] * planes)[plane] += 1
    return MappingProxyType({k: tuple(v) for k, v in table.items()})


# The collector ------------------------------------------------------------------------------
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
    ]
    for name, doc, known, table in reasons:
        fam = CounterMetricFamily(name, doc, labels=["reason"])
        for reason, n in _bounded(known, table):
            fam.add_metric([reason], n)
        yield fam
    for name, doc, value in (
        ("mrc_spurious_retransmissions", "Needless retransmissions.", t.spurious_retransmissions),
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


def make_registry(snapshot_fn: Callable[[], NodeSnapshot]) -> CollectorRegistry:
    """An explicit registry holding only mrcd's collector (never the global one)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MetricsCollector(snapshot_fn))
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


class MetricsServer:
    """Serves ``/metrics`` from ``registry`` on the running loop; :meth:`stop` closes it."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    @property
    def address(self) -> tuple[str, int]:
        """The first bound (host, port): useful after asking for port 0."""
        if self._server is None or not self._server.sockets:
            raise RuntimeError("metrics server is not running")
        name = self._server.sockets[0].getsockname()
        return str(name[0]), int(name[1])

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
            return "200 OK", "text/html; charset=utf-8", _INDEX, []
        if path != "/metrics":
            return "404 Not Found", plain, b"not found; try /metrics\n", []
        encoder, ctype = choose_encoder(headers.get("accept", ""))
        body = encoder(self.registry)
        extra: list[str] = []
        if "gzip" in headers.get("accept-encoding", ""):
            body = gzip.compress(body, compresslevel=1)
            extra.append("Content-Encoding: gzip")
        return "200 OK", ctype, body, extra


async def serve(registry: CollectorRegistry, listen: str = DEFAULT_LISTEN) -> MetricsServer:
    """Start serving ``/metrics``; raises :class:`ListenAddressError` (one line) on a bad or
    unusable address.  ``await server.stop()`` closes the listener and open connections."""
    server = MetricsServer(registry)
    await server.start(listen)
    return server
