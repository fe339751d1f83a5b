"""What a run produced: :class:`SimResult`, :class:`FlowResult` and the records they hold,
and the JSON shaping behind :meth:`SimResult.to_json` (the stable, byte-for-byte form).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from mrcstack.sim.config import SimConfig
from mrcstack.sim.probing import MapperResult

#: Significant digits kept for every float in the JSON form (byte-stable output).
JSON_FLOAT_DIGITS = 9


@dataclass(frozen=True, slots=True)
class FlowResult:
    index: int
    src: int
    dst: int
    bytes: int
    work_requests: int
    complete: bool  # sender saw every completion and the receiver the immediate
    verified: bool  # complete, data identical, completions once each and in order
    completion_time_s: float | None
    goodput_bps: float
    arrival_time_s: float | None  # the receiver had the last immediate (None: it never did)
    failed: str | None  # ConnectionFailed reason or a non-success completion status
    failure_time_s: float | None  # when it failed (virtual time), None if it did not
    retransmissions: dict[str, int]
    spurious_retransmissions: int  # the receiver already had the packet (it says so)
    tlp_unneeded: int  # tail-loss probes that found the tail had arrived
    nacks_received: dict[str, int]
    trims_received: int  # at the receiver
    ecn_echoes: int  # at the sender
    per_plane_bytes: tuple[int, ...]
    # A latency probe's writes: seconds from post to completion, in order (else empty).
    write_latency_s: tuple[float, ...] = ()
    group: str = ""  # the flow spec's label
    start_time_s: float | None = None  # when its first write was posted (None: never)
    fct_s: float | None = None  # flow completion time: start to completion
    ideal_fct_s: float = 0.0  # floor: payload at line rate on its planes + propagation RTT
    slowdown: float | None = None  # fct_s / ideal_fct_s
    # Sampled one-way latencies of full data packets (SimConfig.packet_latency_every).
    packet_latency_s: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class GroupResult:
    """The flows sharing a label (a collective's step, an incast) taken together."""

    name: str
    flows: int
    complete: bool  # every flow of the group completed
    start_s: float | None  # the first flow's start (None: none started)
    end_s: float | None  # the last flow's completion (None: not all completed)
    duration_s: float | None
    bytes: int


@dataclass(frozen=True, slots=True)
class EvRecord:
    t_s: float
    flow: int
    side: str  # "sender" or "receiver": whose EV table changed
    ev: int
    plane: int
    old: str
    new: str
    reason: str
    drop_count: int


@dataclass(frozen=True, slots=True)
class PortRecord:
    t_s: float
    flow: int
    side: str
    port: int
    up: bool
    remote: bool


@dataclass(frozen=True, slots=True)
class TimelineBin:
    t_s: float  # interval start
    bytes: int  # payload bytes newly placed at receivers during the interval
    goodput_bps: float
    flow_bytes: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SimResult:
    """What a run produced; :meth:`to_json` is the stable form (see the package docs)."""

    bytes_delivered: int
    verified: bool
    completion_time_s: float
    goodput_bps: float
    capacity_bps: float
    goodput_fraction: float
    arrival_time_s: float
    arrival_fraction: float
    retransmissions: dict[str, int]
    spurious_retransmissions: int
    tlp_unneeded: int
    trims: int
    ecn_marks: int
    drops: dict[str, int]
    ev_state_changes: int
    per_plane_bytes: tuple[int, ...]
    flows: tuple[FlowResult, ...]
    groups: tuple[GroupResult, ...]
    fct_p50_s: float | None  # over completed flows
    fct_p99_s: float | None
    slowdown_p50: float | None
    slowdown_p99: float | None
    receiver_utilization: dict[str, float]  # "h<N>": bytes into the host / (time x rate)
    events: tuple[EvRecord, ...]
    events_truncated: int
    port_events: tuple[PortRecord, ...]
    timeline: tuple[TimelineBin, ...]
    links: dict[str, dict[str, int]]
    packets_sent: int
    packets_delivered: int
    sim_time_s: float
    sim_events: int
    config: SimConfig
    seed: int
    mapper: MapperResult | None = None  # with a mapper in the scenario

    def to_json(self) -> dict[str, Any]:
        """Plain JSON types, floats rounded to JSON_FLOAT_DIGITS significant digits."""
        out = {f.name: _jsonable(getattr(self, f.name)) for f in fields(self)}
        out["config"]["pairs"] = [list(p) for p in self.config.flows()]
        out["config"]["retry_budget_s"] = _jsonable(self.config.retry_budget_s())
        return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, bool | int | str) or value is None:
        return value
    if isinstance(value, float):
        return float(f"{value:.{JSON_FLOAT_DIGITS}g}")
    if isinstance(value, enum.Enum):
        return _jsonable(value.value)
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    raise TypeError(f"cannot put {type(value).__name__} into JSON")


def sum_counts(tables: Sequence[dict[str, int]]) -> dict[str, int]:
    """Add up per-reason counters; keys sorted so the JSON form is stable."""
    out: dict[str, int] = {}
    for table in tables:
        for key, n in table.items():
            out[key] = out.get(key, 0) + n
    return dict(sorted(out.items()))
