"""The mapper's status as text (``mrcstack mapper status``), from its ``/status`` JSON."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any


def _clock(t: float | None, now: float) -> str:
    if t is None:
        return "?"
    stamp = time.strftime("%H:%M:%S", time.localtime(t)) + f".{int(t * 1000) % 1000:03d}"
    return f"{stamp} ({now - t:.1f} s ago)"


def denied_on(doc: dict[str, Any], link: str) -> list[str]:
    """The hosts whose mrcd holds a denylist of this mapper that names ``link``."""
    versions = {v["version"]: set(v["links"]) for v in doc["denylist"]["history"]}
    versions[doc["denylist"]["version"]] = set(doc["denylist"]["links"])
    return [a["host"] for a in doc["agents"] if link in versions.get(a["applied_version"], set())]


def render(doc: dict[str, Any], every: bool = False) -> str:
    """Each plane's links: how many are up (each one with ``every``), then every other
    link: lossy with its loss, down with when and on which hosts its EVs are denied."""
    now = doc["now"]
    agents = doc["agents"]
    up = sum(1 for a in agents if a["connected"])
    listing = doc["denylist"]
    lines = [
        f"mrcmapper {doc['mapper']} (instance {doc['instance']}): {up}/{len(agents)} agents "
        f"connected, denylist v{listing['version']}: "
        + (", ".join(listing["links"]) if listing["links"] else "empty"),
    ]
    by_plane: dict[int, list[dict[str, Any]]] = {}
    for link in doc["links"]:
        by_plane.setdefault(link["plane"], []).append(link)
    for plane, links in sorted(by_plane.items()):
        counts: dict[str, int] = {}
        for link in links:
            counts[link["state"]] = counts.get(link["state"], 0) + 1
        summary = ", ".join(f"{n} {state}" for state, n in sorted(counts.items()))
        lines.append(f"plane {plane}: {len(links)} links: {summary}")
        for link in links:
            if link["state"] != "up" or every:
                lines.append("  " + _link_line(doc, link, now))
    if doc["switches_down"]:
        lines.append("switches down: " + " ".join(doc["switches_down"]))
    lines.append("agents:")
    lines += ["  " + _agent_line(a, listing["version"]) for a in agents]
    return "\n".join(lines) + "\n"


def _link_line(doc: dict[str, Any], link: dict[str, Any], now: float) -> str:
    state = link["state"]
    text = f"{link['link']:<14} {state:<6}"
    if link["loss"] is not None and state != "down":
        text += f" loss {link['loss'] * 100:.2f}%"
    if link["rtt_s"] is not None and state == "up":
        text += f" rtt {link['rtt_s'] * 1e6:.0f} us"
    if state != "up":
        text += f" since {_clock(link['since'], now)}"
        hosts = denied_on(doc, link["link"])
        text += "; EVs denied on " + (" ".join(hosts) if hosts else "no host yet")
    if state == "held" and link["hold_until"] is not None:
        text += f"; back at {_clock(link['hold_until'], now).split(' (')[0]}"
    return text


def _agent_line(agent: dict[str, Any], version: int) -> str:
    if not agent["connected"]:
        state = "not connected"
    else:
        state = f"connected, every {agent['interval'] * 1e3:g} ms"
    held = "current" if agent["applied_version"] == version else "behind"
    return (
        f"{agent['host']:<5} {state}; denylist v{agent['applied_version']} ({held}): "
        f"{agent['denied_evs']} EVs denied on {agent['qps']} QPs"
    )


def flagged(doc: dict[str, Any]) -> Sequence[str]:
    """The links that are not up."""
    return [link["link"] for link in doc["links"] if link["state"] != "up"]


def denied_everywhere(doc: dict[str, Any], links: Sequence[str]) -> float | None:
    """When every connected host had taken a denylist naming all of ``links`` (unix time,
    as the mapper saw each host say so); None while some host has not."""
    versions = {v["version"]: set(v["links"]) for v in doc["denylist"]["history"]}
    wanted = set(links)
    times = []
    for agent in doc["agents"]:
        if not agent["connected"]:
            continue
        if not wanted <= versions.get(agent["applied_version"], set()):
            return None
        times.append(agent["applied_at"])
    return max(times) if times else None


def cleared(doc: dict[str, Any]) -> bool:
    """Every link up, the denylist empty, and every connected host holding it."""
    return (
        not doc["denylist"]["links"]
        and all(link["state"] == "up" for link in doc["links"])
        and all(a["current"] for a in doc["agents"] if a["connected"])
    )
