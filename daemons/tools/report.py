"""Results of mrc-write-bw and mrc-write-lat: interval series, perftest-like tables, JSON.

Units are perftest's: MB/sec is 2**20 bytes per second, Gb/sec 10**9 bits per second,
latencies in microseconds (one way: half the round trip).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from mrcstack.qpn import qpn_text
from mrcstack.stats import Method, quantile

MB = 1 << 20  # perftest's MB/sec is MiB/s
#: Completions a window must hold for its rate to count as a peak: a window of one or two
#: large writes can only read as a multiple of one write's size per interval.
PEAK_MIN_WRITES = 10
GBIT = 1e9
LINE = "-" * 87


class Series:
    """Fixed-length intervals from ``start``: whatever is added lands in the current one."""

    def __init__(self, interval: float, start: float) -> None:
        self.interval = interval
        self.start = start
        self.next_tick = start + interval
        self.entries: list[dict[str, Any]] = []
        self.count = 0
        self.bytes = 0
        self.samples: list[float] = []

    def tick(self, now: float, close: Callable[[Series, float], dict[str, Any]]) -> None:
        while now >= self.next_tick:
            self.entries.append(close(self, self.next_tick - self.start))
            self.count, self.bytes, self.samples = 0, 0, []
            self.next_tick += self.interval


def bw_series_entry(s: Series, t: float) -> dict[str, Any]:
    return {
        "t": round(t, 6),
        "bytes": s.bytes,
        "writes": s.count,
        "gbit_s": round(s.bytes * 8 / s.interval / GBIT, 6),
    }


def peak_rate(entries: Sequence[dict[str, Any]], interval: float) -> float | None:
    """The best rate (bytes/s) over windows of whole intervals that each hold at least
    PEAK_MIN_WRITES completions (consecutive intervals are merged until they do); None when
    the run never held that many."""
    best: float | None = None
    nbytes = writes = spans = 0
    for e in entries:
        nbytes, writes, spans = nbytes + e["bytes"], writes + e["writes"], spans + 1
        if writes >= PEAK_MIN_WRITES:
            rate = nbytes / (spans * interval)
            best = rate if best is None else max(best, rate)
            nbytes = writes = spans = 0
    return best


def bw_figures(
    nbytes: int, writes: int, elapsed: float, entries: Sequence[dict[str, Any]], interval: float
) -> dict[str, float | None]:
    """The run's figures; the peak is None when no window held enough writes to mean it
    (:func:`peak_rate`)."""
    avg = nbytes / elapsed if elapsed > 0 else 0.0
    peak = peak_rate(entries, interval)
    if peak is None and writes >= PEAK_MIN_WRITES:
        peak = avg  # every write fell in one window: the run itself is the window
    if peak is not None:
        peak = max(peak, avg)  # the average also counts the last, partial interval
    return {
        "duration_s": round(elapsed, 6),
        "bw_peak_MB_s": None if peak is None else round(peak / MB, 3),
        "bw_average_MB_s": round(avg / MB, 3),
        "bw_peak_gbit_s": None if peak is None else round(peak * 8 / GBIT, 6),
        "bw_average_gbit_s": round(avg * 8 / GBIT, 6),
        "msg_rate_mpps": round(writes / elapsed / 1e6 if elapsed > 0 else 0.0, 9),
    }


def per_qp_figures(qpn: int, writes: int, size: int, elapsed: float) -> dict[str, Any]:
    """One QP's share of a run: its completed writes and their goodput."""
    rate = writes * size / elapsed if elapsed > 0 else 0.0
    return {
        "qpn": qpn,
        "writes": writes,
        "bytes": writes * size,
        "bw_average_MB_s": round(rate / MB, 3),
        "bw_average_gbit_s": round(rate * 8 / GBIT, 6),
    }


def per_qp_lines(entries: Sequence[dict[str, Any]], gbits: bool) -> list[str]:
    """Each QP's line under the run's (aggregate) row."""
    unit = "Gb/sec" if gbits else "MB/sec"
    return [
        f"   QP {qpn_text(e['qpn']):<10} {e['writes']:<14} "
        f"{e['bw_average_gbit_s'] if gbits else e['bw_average_MB_s']:.2f} {unit} average"
        for e in entries
    ]


def bw_interval_line(entry: dict[str, Any], interval: float, gbits: bool) -> str:
    t0 = entry["t"] - interval
    rate = (
        f"{entry['gbit_s']:.3f} Gb/sec" if gbits else f"{entry['bytes'] / interval / MB:.2f} MB/sec"
    )
    return f" [{t0:7.2f}-{entry['t']:7.2f} s] {entry['bytes']:>12} bytes {rate:>16}"


def bw_columns(gbits: bool) -> str:
    unit = "Gb/sec" if gbits else "MB/sec"
    return (
        f" {'#bytes':<10} {'#iterations':<14} {'BW peak[' + unit + ']':<18} "
        f"{'BW average[' + unit + ']':<21} {'MsgRate[Mpps]'}"
    )


def bw_row(
    size: int, iters: int, peak_bps: float | None, avg_bps: float, rate: float, gbits: bool
) -> str:
    def fmt(bytes_per_s: float | None) -> str:
        if bytes_per_s is None:
            return "-"  # too few writes per window for a peak
        return f"{bytes_per_s * 8 / GBIT:.2f}" if gbits else f"{bytes_per_s / MB:.2f}"

    return f" {size:<10} {iters:<14} {fmt(peak_bps):<18} {fmt(avg_bps):<21} {rate / 1e6:.6f}"


def bw_figures_row(size: int, iters: int, fig: dict[str, Any], gbits: bool) -> str:
    """:func:`bw_row` of the figures of :func:`bw_figures` (or of a document carrying them)."""
    peak = None if fig["bw_peak_MB_s"] is None else fig["bw_peak_MB_s"] * MB
    avg = fig["bw_average_MB_s"] * MB
    return bw_row(size, iters, peak, avg, fig["msg_rate_mpps"] * 1e6, gbits)


def peak_note(docs: Sequence[dict[str, Any]]) -> str | None:
    """What a "-" in the peak column means, under a table that has one."""
    if not any(d.get("bw_peak_MB_s", 0) is None for d in docs):
        return None
    return f" BW peak -: no run of intervals held {PEAK_MIN_WRITES} writes (a longer run has one)"


BW_ALL_KEYS = (
    "size",
    "tx_depth",
    "iterations",
    "bytes",
    "duration_s",
    "bw_peak_MB_s",
    "bw_average_MB_s",
    "bw_peak_gbit_s",
    "bw_average_gbit_s",
    "msg_rate_mpps",
)


def bw_all_row(doc: dict[str, Any]) -> dict[str, Any]:
    """One size of -a's summary document: the figures of that run's document."""
    row = {k: doc[k] for k in BW_ALL_KEYS}
    row["verified"] = doc["server"]["verified"]
    row["mismatches"] = doc["server"]["mismatches"]
    return row


LAT_ALL_KEYS = (
    "size",
    "iterations",
    "duration_s",
    "t_min_us",
    "t_max_us",
    "t_typical_us",
    "t_avg_us",
    "t_stdev_us",
    "t_99_us",
    "t_99_9_us",
    "mismatches",
)


def lat_all_row(doc: dict[str, Any]) -> dict[str, Any]:
    row = {k: doc.get(k) for k in LAT_ALL_KEYS}
    row["server_mismatches"] = doc["server"]["mismatches"]
    return row


LAT_COLUMNS = (
    f" {'#bytes':<7} {'#iterations':<12} {'t_min[usec]':<12} {'t_max[usec]':<12} "
    f"{'t_typical[usec]':<16} {'t_avg[usec]':<12} {'t_stdev[usec]':<14} "
    f"{'99% percentile[usec]':<21} {'99.9% percentile[usec]'}"
)


def lat_stats(samples: Sequence[float]) -> dict[str, float]:
    """perftest's latency figures (microseconds) of one-way samples in seconds."""
    if not samples:
        return {}
    n = len(samples)
    avg = sum(samples) / n
    var = sum((x - avg) ** 2 for x in samples) / n
    us = 1e6

    def at(q: float) -> float:  # a measured sample, as perftest reports its percentiles
        value = quantile(samples, q, method=Method.NEAREST_RANK)
        return math.nan if value is None else value * us

    return {
        "t_min_us": min(samples) * us,
        "t_max_us": max(samples) * us,
        "t_typical_us": at(0.5),
        "t_avg_us": avg * us,
        "t_stdev_us": math.sqrt(var) * us,
        "t_99_us": at(0.99),
        "t_99_9_us": at(0.999),
    }


def rounded(stats: dict[str, float]) -> dict[str, float]:
    """Latency figures as the JSON documents carry them (nanosecond resolution)."""
    return {k: round(v, 3) for k, v in stats.items()}


def lat_series_entry(s: Series, t: float) -> dict[str, Any]:
    st = lat_stats(s.samples)
    return {
        "t": round(t, 6),
        "iterations": len(s.samples),
        "t_typical_us": round(st.get("t_typical_us", 0.0), 3),
        "t_avg_us": round(st.get("t_avg_us", 0.0), 3),
        "t_max_us": round(st.get("t_max_us", 0.0), 3),
    }


def lat_interval_line(entry: dict[str, Any], t: float, interval: float) -> str:
    return (
        f" [{t - interval:7.2f}-{t:7.2f} s] {entry['iterations']:>8} iterations "
        f"t_typical {entry['t_typical_us']:.2f} usec"
    )


def lat_row(size: int, iters: int, st: dict[str, float]) -> str:
    return (
        f" {size:<7} {iters:<12} {st['t_min_us']:<12.2f} {st['t_max_us']:<12.2f} "
        f"{st['t_typical_us']:<16.2f} {st['t_avg_us']:<12.2f} {st['t_stdev_us']:<14.2f} "
        f"{st['t_99_us']:<21.2f} {st['t_99_9_us']:.2f}"
    )


#: A header's QPN line under -a: each size has a connection of its own.
QPNS_PER_SIZE = "new for every size (in --json)"


def qpns_text(qpns: Sequence[int], sweep: bool) -> str:
    """A header's QPN(s)."""
    return QPNS_PER_SIZE if sweep else " ".join(qpn_text(qpn) for qpn in qpns)


def server_size_text(size: int, sweep: bool) -> str:
    """A server header's message size: the client's."""
    return f"the client's: from {size} [B], a connection each" if sweep else f"{size} [B]"


def header(title: str, lines: Sequence[tuple[str, object]]) -> str:
    out = [LINE, f"{'':20}{title}"]
    out += [f" {k:<16}: {v}" for k, v in lines]
    out.append(LINE)
    return "\n".join(out)


def emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc, separators=(",", ":")), flush=True)


def say(text: str) -> None:
    print(text, flush=True)
