"""What ``mrcstack testbed status`` shows of the traffic: rates over an interval, per link,
per switch and per plane, as text that fits a terminal and as a plot.

It reads two of :func:`mrcstack.netns.testbed.status`'s documents taken ``seconds`` apart,
so every figure is what happened in that interval, as ``ip -s link`` twice would show it.
Counters since the build also hold the few packets a port sent before its veth peer was up
(MLD reports the kernel counts as ``tx_dropped``): the interval leaves them out, and a
drop shown here is one that happened in it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from mrcstack.addrplan import HOST, T1, parse_node

Doc = dict[str, Any]
_DROPS = ("rx_dropped", "tx_dropped")


def _num(end: Mapping[str, Any], key: str) -> int:
    value = end.get(key)
    return value if isinstance(value, int) else 0


def _drops(end: Mapping[str, Any]) -> int:
    qdisc = end.get("qdisc") or {}
    return sum(_num(end, k) for k in _DROPS) + (qdisc.get("drops") or 0)


def _rate(after: int, before: int, seconds: float) -> float:
    return max(0, after - before) / seconds


def with_rates(before: Doc, after: Doc, seconds: float) -> Doc:
    """``after`` with ``interval_s``, each link's ``rates`` (a->b and b->a packets/s and
    bits/s from each sender's tx counters, drops in the interval), each uN SID's
    ``packets_per_s`` and the per-plane summary ``planes``."""
    old = {link["name"]: link for link in before["links"]}
    for link in after["links"]:
        prev = old.get(link["name"], link)
        rates: dict[str, Any] = {}
        for key, sender in (("a_to_b", "a"), ("b_to_a", "b")):
            now, then = link[sender], prev[sender]
            rates[key] = {
                "packets_per_s": _rate(_num(now, "tx_packets"), _num(then, "tx_packets"), seconds),
                "bits_per_s": 8 * _rate(_num(now, "tx_bytes"), _num(then, "tx_bytes"), seconds),
            }
        drops = sum(max(0, _drops(link[e]) - _drops(prev[e])) for e in ("a", "b"))
        link["rates"] = rates | {"drops": drops}
    for switch, sid in after["sids"].items():
        prev_sid = before["sids"].get(switch, sid)
        sid["packets_per_s"] = _rate(sid["packets"] or 0, prev_sid["packets"] or 0, seconds)
    after["interval_s"] = seconds
    after["planes"] = plane_summary(after)
    return after


def _plane(link: Mapping[str, Any]) -> int:
    return int(str(link["name"]).split(":", 1)[0][1:])


def _toward(link: Mapping[str, Any], kind: str) -> tuple[str, str] | None:
    """``(rates key, node)`` of the direction into the end of ``kind`` (T1, host), if any."""
    for key, end in (("a_to_b", "b"), ("b_to_a", "a")):
        if parse_node(link[end]["node"]).kind == kind:
            return key, str(link[end]["node"])
    return None


def plane_summary(doc: Doc) -> list[dict[str, Any]]:
    """Per plane: links up, what its hosts sent into it (packets/s, bits/s), drops in the
    interval, and each T1's share of the packets the T0s sent up (the ECMP or EV spread)."""
    out = []
    for plane in range(int(doc["fabric"]["planes"])):
        links = [link for link in doc["links"] if _plane(link) == plane]
        sent = {"packets_per_s": 0.0, "bits_per_s": 0.0}
        t1_up: dict[str, float] = {}
        t1_total: dict[str, int] = {}
        for link in links:
            if not link["host_facing"] and (up := _toward(link, T1)) is not None:
                sender = link["a" if up[0] == "a_to_b" else "b"]
                t1_total[up[1]] = t1_total.get(up[1], 0) + _num(sender, "tx_packets")
            rates = link.get("rates")
            if rates is None:
                continue
            if link["host_facing"]:
                into_host = _toward(link, HOST)
                key = "b_to_a" if into_host and into_host[0] == "a_to_b" else "a_to_b"
                for k in sent:
                    sent[k] += rates[key][k]
            elif (up := _toward(link, T1)) is not None:
                t1_up[up[1]] = t1_up.get(up[1], 0.0) + rates[up[0]]["packets_per_s"]
        total = sum(t1_up.values())
        since_up = sum(t1_total.values())
        out.append(
            {
                "plane": plane,
                "links": len(links),
                "links_up": sum(link["state"] == "up" for link in links),
                "sent": sent,
                "drops": sum((link.get("rates") or {}).get("drops", 0) for link in links),
                "t1_share": {t1: (n / total if total else 0.0) for t1, n in sorted(t1_up.items())},
                "t1_share_since_up": {
                    t1: (n / since_up if since_up else 0.0) for t1, n in sorted(t1_total.items())
                },
            }
        )
    return out


# Text --------------------------------------------------------------------------------------
def _mbit(bps: float) -> str:
    return f"{bps / 1e6:.1f}"


def _header(doc: Doc) -> list[str]:
    fab, spaces = doc["fabric"], doc["namespaces"]
    missing = f", missing {' '.join(spaces['missing'])}" if spaces["missing"] else ""
    over = f"; rates over {doc['interval_s']:.1f} s" if doc.get("interval_s") else ""
    return [
        f"testbed {doc['name']}: {'healthy' if doc['healthy'] else 'NOT healthy'}"
        f"{'' if doc['complete'] else ' (build incomplete)'}; {fab['planes']} planes, "
        f"{fab['racks']} racks x {fab['hosts_per_rack']} hosts, {fab['t1_per_plane']} "
        f"T1/plane{over}",
        f"namespaces {spaces['present']}/{spaces['expected']}{missing}; "
        f"mgmt {doc['mgmt']['bridge']} {doc['mgmt']['prefix']}",
    ]


def summary_text(doc: Doc) -> str:
    """Per plane, one line: links up, what the hosts sent, drops, the T1 spread (of the
    interval; of everything since the build when nothing moved in the interval)."""
    planes = doc.get("planes") or plane_summary(doc)
    busy = any(any(p["t1_share"].values()) for p in planes)
    key, when = ("t1_share", "in the interval") if busy else ("t1_share_since_up", "since up")
    lines = [*_header(doc), ""]
    lines.append(f"{'plane':<6}{'links up':>8}{'pkt/s':>9}{'Mbit/s':>10}{'drops':>7}  T1 share")
    for p in planes:
        shares = p[key] if any(p[key].values()) else {}
        share = " ".join(f"{t1.split('-')[-1]} {v:.0%}" for t1, v in shares.items())
        lines.append(
            f"{p['plane']:<6}{str(p['links_up']) + '/' + str(p['links']):>8}"
            f"{p['sent']['packets_per_s']:>9.0f}{_mbit(p['sent']['bits_per_s']):>10}"
            f"{p['drops']:>7}  {share or '-'}"
        )
    lines += [
        "",
        f"pkt/s, Mbit/s: what the plane's hosts sent; T1 share: of what T0s sent up {when};",
        "--plane N or --switch S for links and switches, --plot FILE for a picture, --json",
    ]
    return "\n".join(lines)


def _link_rows(links: Iterable[Mapping[str, Any]]) -> list[str]:
    rows = [
        f"{'link':<13}{'state':<6}{'a->b pkt/s':>11}{'Mbit/s':>8}{'b->a pkt/s':>11}"
        f"{'Mbit/s':>8}{'drops':>6}"
    ]
    for link in links:
        r = link.get("rates")
        if r is None:
            figures = f"{'-':>11}{'-':>8}{'-':>11}{'-':>8}{'-':>6}"
        else:
            ab, ba = r["a_to_b"], r["b_to_a"]
            figures = (
                f"{ab['packets_per_s']:>11.0f}{_mbit(ab['bits_per_s']):>8}"
                f"{ba['packets_per_s']:>11.0f}{_mbit(ba['bits_per_s']):>8}{r['drops']:>6}"
            )
        rows.append(f"{link['name']:<13}{link['state']:<6}{figures}")
    return rows


def _sid_rows(sids: Mapping[str, Mapping[str, Any]]) -> list[str]:
    rows = [f"{'switch':<9}{'uN SID':<22}{'next-csid':<10}{'pkt/s':>8}{'packets':>12}"]
    for switch, sid in sids.items():
        rate = sid.get("packets_per_s")
        rows.append(
            f"{switch:<9}{sid['sid']:<22}{'yes' if sid['next_csid'] else 'NO':<10}"
            f"{'-' if rate is None else f'{rate:.0f}':>8}"
            f"{'-' if sid['packets'] is None else sid['packets']:>12}"
        )
    return rows


def detail_text(doc: Doc, plane: int | None, switch: str | None) -> str:
    """The links and uN SIDs of one plane, or of one switch (its ports), in a terminal."""
    if switch is not None:
        links = [link for link in doc["links"] if switch in (link["a"]["node"], link["b"]["node"])]
        sids = {s: v for s, v in doc["sids"].items() if s == switch}
        what = f"switch {switch}"
    else:
        links = [link for link in doc["links"] if _plane(link) == plane]
        sids = {s: v for s, v in doc["sids"].items() if parse_node(s).plane == plane}
        what = f"plane {plane}"
    up = sum(link["state"] == "up" for link in links)
    over = f"rates over {doc['interval_s']:.1f} s" if doc.get("interval_s") else "no rates"
    head = f"testbed {doc['name']} {what}: {up}/{len(links)} links up; {over}"
    return "\n".join([head, *_link_rows(links), *_sid_rows(sids)])


# The picture -------------------------------------------------------------------------------
def plot(doc: Doc, path: Path) -> None:
    """A PNG of each link's load per plane over the interval (Mbit/s each way), one panel
    per plane: a skewed spread over the T1s is seen at a glance."""
    import matplotlib  # noqa: PLC0415 (only this command draws)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    planes = int(doc["fabric"]["planes"])
    fig, axes = plt.subplots(planes, 1, figsize=(10, 2.6 * planes), squeeze=False)
    for plane in range(planes):
        ax = axes[plane][0]
        links = [link for link in doc["links"] if _plane(link) == plane]
        names = [str(link["name"]).split(":", 1)[1] for link in links]
        for offset, key, label in ((-0.2, "a_to_b", "a -> b"), (0.2, "b_to_a", "b -> a")):
            values = [
                (link.get("rates") or {}).get(key, {}).get("bits_per_s", 0.0) / 1e6
                for link in links
            ]
            ax.bar([i + offset for i in range(len(links))], values, width=0.4, label=label)
        ax.set_xticks(range(len(links)), names, rotation=45, ha="right", fontsize=8)
        ax.set_ylabel("Mbit/s")
        ax.set_title(f"plane {plane}", fontsize=10)
        ax.legend(fontsize=8, loc="upper right")
    fig.suptitle(f"testbed {doc['name']}: link load over {doc.get('interval_s', 0):.1f} s")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
