"""Figures with matplotlib's Agg backend (no display): labelled axes with units, fault
times marked, MRC and its baselines in one figure.  Legends name each stack and the paths it
uses (``labels``), a dashed line shows the capacity, and a transfer that ended is marked
where it ended rather than drawn as a drop to zero (``ends``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from mrcstack.experiments.base import Table

Draw = Callable[[Path, dict[str, Table]], None]


def lines(
    table: str,
    x: str,
    ys: Sequence[str],
    *,
    xlabel: str,
    ylabel: str,
    title: str,
    marks: Sequence[tuple[float, str]] = (),
    spans: Sequence[tuple[float, float, str]] = (),
    labels: Mapping[str, str] | None = None,
    capacity: tuple[float, str] | None = None,
    ends: Mapping[str, float] | None = None,
    bands: Mapping[str, tuple[str, str]] | None = None,
) -> Draw:
    """One line per column of ``ys`` against ``x``, named in the legend by ``labels``
    (default: the column); vertical lines at ``marks`` (x, label), shaded ``spans`` (start,
    end, label), a dashed ``capacity`` line (y, label), each column's transfer ended at
    ``ends[column]`` (x: marked, not drawn on), and ``bands`` (column: its low and high
    columns) shaded around a line."""

    def draw(path: Path, tables: dict[str, Table]) -> None:
        t = tables[table]
        fig, ax = plt.subplots(figsize=(8, 4.2))
        xs = t.column(x)
        step = xs[1] - xs[0] if len(xs) > 1 else 0.0  # a bin's width: one ending past `end`
        for y in ys:  # is partly empty, and is not drawn
            end = (ends or {}).get(y)
            keep = [end is None or at + step <= end + 1e-9 for at in xs]
            line = ax.plot(
                [a for a, k in zip(xs, keep, strict=True) if k],
                [v for v, k in zip(t.column(y), keep, strict=True) if k],
                label=(labels or {}).get(y, y),
                linewidth=1.4,
            )[0]
            if bands and y in bands:
                lo, hi = (t.column(c) for c in bands[y])
                ax.fill_between(xs, lo, hi, color=line.get_color(), alpha=0.15, linewidth=0)
            if end is not None and xs and end <= xs[-1] + step:
                ax.axvline(end, color=line.get_color(), linestyle=":", linewidth=1.2)
                _upright(ax, "transfer done", end, 0.5, line.get_color(), va="center", ha="left")
        if capacity is not None:
            ax.axhline(capacity[0], color="grey", linestyle="--", linewidth=1, label=capacity[1])
        for at, label in marks:
            ax.axvline(at, color="red", linestyle="--", linewidth=1)
            _upright(ax, label, at, 1.0, "red", va="top", ha="right", fontsize=8)
        for start, end, label in spans:
            ax.axvspan(start, end, color="red", alpha=0.08)
            _upright(ax, label, start, 0.03, "red", va="bottom")
        _finish(fig, ax, path, xlabel, ylabel, title)

    return draw


def bars(
    table: str,
    label: str,
    ys: Sequence[str],
    *,
    ylabel: str,
    title: str,
    errs: Mapping[str, tuple[str, str]] | None = None,
    labels: Mapping[str, str] | None = None,
    capacity: tuple[float, str] | None = None,
) -> Draw:
    """Grouped bars: one group per row (named by column ``label``), one bar per ``ys``
    (named in the legend by ``labels``); ``errs`` maps a bar's column to the columns of its
    low and high ends (error bars); ``capacity`` a dashed line (y, label)."""

    def draw(path: Path, tables: dict[str, Table]) -> None:
        t = tables[table]
        names = [str(v) for v in t.column(label)]
        fig, ax = plt.subplots(figsize=(9, 4.6))
        width = 0.8 / max(1, len(ys))
        for k, y in enumerate(ys):
            xs = [i + (k - (len(ys) - 1) / 2) * width for i in range(len(names))]
            heights = [float(v) for v in t.column(y)]
            yerr = None
            if errs and y in errs:
                lo, hi = (t.column(c) for c in errs[y])
                # A mean of equal values can round an ulp past them: no negative bar ends.
                yerr = [
                    [max(0.0, h - float(v)) for h, v in zip(heights, lo, strict=True)],
                    [max(0.0, float(v) - h) for h, v in zip(heights, hi, strict=True)],
                ]
            name = (labels or {}).get(y, y)
            ax.bar(xs, heights, width, label=name, yerr=yerr, capsize=3 if yerr else 0)
        if capacity is not None:
            ax.axhline(capacity[0], color="grey", linestyle="--", linewidth=1, label=capacity[1])
        ax.set_xticks(range(len(names)), names, rotation=15 if len(names) > 4 else 0)
        _finish(fig, ax, path, label, ylabel, title)

    return draw


def cdf(
    table: str,
    value: str,
    group: str,
    *,
    xlabel: str,
    title: str,
    ylabel: str = "fraction of flows",
    logx: bool = False,
    labels: Mapping[str, str] | None = None,
) -> Draw:
    """The empirical CDF of ``value`` for each distinct ``group`` (named by ``labels``)."""

    def draw(path: Path, tables: dict[str, Table]) -> None:
        t = tables[table]
        fig, ax = plt.subplots(figsize=(8, 4.2))
        groups: dict[str, list[float]] = {}
        for g, v in zip(t.column(group), t.column(value), strict=True):
            groups.setdefault(str(g), []).append(float(v))
        for g, vs in groups.items():
            vs.sort()
            label = (labels or {}).get(g, g)
            ax.step(vs, [(i + 1) / len(vs) for i in range(len(vs))], where="post", label=label)
        if logx:
            ax.set_xscale("log")
        _finish(fig, ax, path, xlabel, ylabel, title)

    return draw


def _upright(
    ax: object, text: str, x: float, y: float, color: object, fontsize: int = 7, **align: str
) -> None:
    """A label written upwards at data ``x``, ``y`` of the way up the axes."""
    ax.annotate(  # type: ignore[attr-defined]
        text, (x, y), xycoords=("data", "axes fraction"), rotation=90, fontsize=fontsize,
        color=color, **align,
    )  # fmt: skip


def _finish(fig: object, ax: object, path: Path, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)  # type: ignore[attr-defined]
    ax.set_ylabel(ylabel)  # type: ignore[attr-defined]
    ax.set_title(title)  # type: ignore[attr-defined]
    ax.grid(True, alpha=0.3)  # type: ignore[attr-defined]
    ax.legend(fontsize=8)  # type: ignore[attr-defined]
    fig.tight_layout()  # type: ignore[attr-defined]
    fig.savefig(path, dpi=110)  # type: ignore[attr-defined]
    plt.close(fig)  # type: ignore[arg-type]
