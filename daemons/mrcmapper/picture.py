"""A picture of the fabric with each link coloured by its state (PNG, matplotlib's Agg
backend), drawn from the mapper's status: one panel per plane, its T1s on top, its T0s in
the middle, the hosts below; links that are not up drawn thick on top of the rest."""

from __future__ import annotations

import io
import math
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D

from mrcstack.fabric import letter_index, letters

COLOURS = {"up": "#2ca02c", "held": "#1f77b4", "lossy": "#ff7f0e", "down": "#d62728"}
ORDER = ("up", "held", "lossy", "down")  # drawn in this order: the worst on top
MAX_COLUMNS = 4
LABELLED = 16  # nodes named when a row has at most this many


def _position(node: str, fabric: dict[str, Any]) -> tuple[float, float]:
    """(x in 0..1, row) of a node: hosts row 0, T0s row 1, T1s row 2."""
    if node.startswith("h"):
        host = int(node[1:])
        count = fabric["racks"] * fabric["hosts_per_rack"]
        return (host + 0.5) / count, 0.0
    kind, letters = node.split("-")[1][:2], node.split("-")[1][2:]
    index = letter_index(letters)
    if kind == "t0":
        return (index + 0.5) / fabric["racks"], 1.0
    return (index + 0.5) / fabric["t1_per_plane"], 2.0


def draw(doc: dict[str, Any]) -> bytes:
    """The PNG of the fabric in ``doc`` (the mapper's status)."""
    fabric = doc["fabric"]
    planes = fabric["planes"]
    columns = min(MAX_COLUMNS, planes)
    rows = math.ceil(planes / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.2 * rows), squeeze=False)
    by_plane: dict[int, list[dict[str, Any]]] = {}
    for link in doc["links"]:
        by_plane.setdefault(link["plane"], []).append(link)
    hosts = fabric["racks"] * fabric["hosts_per_rack"]
    width = 1.5 if hosts * fabric["t1_per_plane"] <= 256 else 0.4
    for plane in range(rows * columns):
        ax = axes[plane // columns][plane % columns]
        ax.set_axis_off()
        if plane >= planes:
            continue
        for state in ORDER:
            segments = [
                [_position(link["a"], fabric), _position(link["b"], fabric)]
                for link in by_plane.get(plane, ())
                if link["state"] == state
            ]
            if segments:
                thick = width if state == "up" else max(2.5, 3 * width)
                ax.add_collection(LineCollection(segments, colors=COLOURS[state], linewidths=thick))
        for row, count, name in (
            (0, hosts, "h{}"),
            (1, fabric["racks"], "t0{}"),
            (2, fabric["t1_per_plane"], "t1{}"),
        ):
            xs = [(i + 0.5) / count for i in range(count)]
            ax.scatter(xs, [row] * count, s=12 if count > 32 else 30, color="black", zorder=3)
            if count <= LABELLED:
                for i, x in enumerate(xs):
                    label = name.format(i if row == 0 else letters(i))
                    ax.annotate(label, (x, row), textcoords="offset points", fontsize=7,
                                xytext=(0, 6 if row else -11), ha="center")  # fmt: skip
        ax.set_xlim(0, 1)
        ax.set_ylim(-0.4, 2.4)
        ax.set_title(f"plane {plane}", fontsize=9)
    handles = [Line2D([], [], color=COLOURS[s], linewidth=3, label=s) for s in ORDER]
    fig.legend(handles=handles, loc="lower center", ncol=len(ORDER), frameon=False)
    down = doc["switches_down"]
    fig.suptitle(
        f"mrcmapper {doc['mapper']}: denylist v{doc['denylist']['version']}, "
        f"{len(doc['denylist']['links'])} links denied"
        + (f"; switches down: {' '.join(down)}" if down else ""),
        fontsize=10,
    )
    fig.tight_layout(rect=(0, 0.06, 1, 0.95))
    out = io.BytesIO()
    fig.savefig(out, format="png", dpi=100)
    plt.close(fig)
    return out.getvalue()
