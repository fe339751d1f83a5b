"""mrcmapper's /metrics: links, hosts and the mapper itself, read from one status per scrape.

Per link, labelled ``plane`` and the node at each end (``a``: the host or T0, ``b``: the T0
or T1): ``mrc_link_state`` (0 up, 1 held, 2 lossy, 3 down), ``mrc_link_probe_loss_ratio``
(loss per crossing over the last 5 s of probes; NaN without results) and
``mrc_link_rtt_seconds`` (mean round trip of the link's loops).  Per ``host``: the EVs its
mrcd denies (``mrc_host_denied_evs``), whether it holds the current denylist and whether
its agent is connected.  Labels come from the fabric only: bounded.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import GCCollector, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from mrcstack.mapper.linkstate import GAUGE, LinkState

log = logging.getLogger("mrcmapper.metrics")


def _value(x: float | None) -> float:
    return math.nan if x is None else float(x)


class MapperCollector:
    """prometheus_client collector over ``status_fn`` (one call per scrape)."""

    def __init__(self, status_fn: Callable[[], dict[str, Any]]) -> None:
        self.status_fn = status_fn

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        s = self.status_fn()
        info = InfoMetricFamily("mrc_mapper", "The fabric mapper: version and instance.")
        info.add_metric([], {"version": s["version"], "instance": s["instance"]})
        yield info
        labels = ["plane", "a", "b"]
        state = GaugeMetricFamily(
            "mrc_link_state",
            "Link state: 0 up, 1 held (recovered, still denied), 2 lossy, 3 down.",
            labels=labels,
        )
        loss = GaugeMetricFamily(
            "mrc_link_probe_loss_ratio",
            "Probe loss per crossing of the link over the last 5 s of results.",
            labels=labels,
        )
        rtt = GaugeMetricFamily(
            "mrc_link_rtt_seconds", "Mean round trip of the link's probe loops.", labels=labels
        )
        for link in s["links"]:
            key = [str(link["plane"]), link["a"], link["b"]]
            state.add_metric(key, GAUGE[LinkState(link["state"])])
            loss.add_metric(key, _value(link["loss"]))
            rtt.add_metric(key, _value(link["rtt_s"]))
        yield state
        yield loss
        yield rtt
        denied = GaugeMetricFamily(
            "mrc_host_denied_evs",
            "EVs of live QPs a host denies for the denylist.",
            labels=["host"],
        )
        current = GaugeMetricFamily(
            "mrc_host_denylist_current", "1 if the host holds the newest denylist.", labels=["host"]
        )
        connected = GaugeMetricFamily(
            "mrc_agent_connected", "1 while the host's agent has a session.", labels=["host"]
        )
        for agent in s["agents"]:
            host = [agent["host"]]
            denied.add_metric(host, agent["denied_evs"])
            current.add_metric(host, int(agent["current"]))
            connected.add_metric(host, int(agent["connected"]))
        yield denied
        yield current
        yield connected
        listing = s["denylist"]
        yield GaugeMetricFamily(
            "mrc_mapper_denylist_links", "Links on the denylist.", value=len(listing["links"])
        )
        yield GaugeMetricFamily(
            "mrc_mapper_denylist_version", "The denylist's version.", value=listing["version"]
        )
        yield GaugeMetricFamily(
            "mrc_mapper_switches_down", "Switches every link of which is down.",
            value=len(s["switches_down"]),
        )  # fmt: skip
        counters = s["counters"]
        yield CounterMetricFamily(
            "mrc_mapper_reports", "Reports taken from agents.", value=counters["reports"]
        )
        yield CounterMetricFamily(
            "mrc_mapper_probe_results", "Probe results in those reports.", value=counters["results"]
        )
        yield CounterMetricFamily(
            "mrc_mapper_pushes", "Denylists sent to agents.", value=counters["pushes"]
        )
        rejected = CounterMetricFamily(
            "mrc_mapper_rejected",
            "Agent connections and messages refused, by reason (credentials, a forged "
            "or replayed record, a bad message, ...).",
            labels=["reason"],
        )
        for reason, n in counters["rejected"].items():
            rejected.add_metric([reason], n)
        yield rejected


def make_registry(status_fn: Callable[[], dict[str, Any]]) -> CollectorRegistry:
    """An explicit registry (never the global one): the mapper's collector and
    prometheus_client's ``process_*`` and ``python_gc_*`` families of its process."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(MapperCollector(status_fn))
    ProcessCollector(registry=registry)
    GCCollector(registry=registry)
    return registry
