"""The controller API (``mrc_ctl.h`` in Python): mrcd is the node's one controller.

Operations arrive on the API socket as ``ctl.*`` requests.  Queries are open to every
client; anything that changes the node (ports, profiles, DENY, endpoint operations) needs a
privileged peer (uid 0 by SO_PEERCRED, like ``mrc_ctl.h`` asks CAP_NET_ADMIN).

=========================  ==================================================  ==========
operation                  mrc_ctl.h                                           privileged
=========================  ==================================================  ==========
ctl.query_device           mrc_ctl_query_device                                no
ctl.list_ports             mrc_ctl_query_port (every port)                     no
ctl.modify_port            mrc_ctl_modify_port (PORT_ADMIN_STATE)              yes
ctl.query_ev_fmt_profile   mrc_ctl_query_ev_fmt_profile                        no
ctl.create_ev_profile      mrc_ctl_modify_ev_profile INIT->OFFLINE->ONLINE     yes
ctl.modify_ev_profile      mrc_ctl_modify_ev_profile MIN_ACTIVE / EVENT_MASK   yes
ctl.modify_ev_state        mrc_ctl_modify_ev_profile EV_OP_MODIFY_EV_STATE     yes
ctl.destroy_ev_profile     mrc_ctl_modify_ev_profile ONLINE->OFFLINE->INIT     yes
ctl.query_ev_profile       mrc_ctl_query_ev_profile (+ QUERY_EV_ARRAY)         no
ctl.list_ev_profiles       (all profiles)                                      no
ctl.query_ev_states        mrc_ctl_query_ev_profile EV_OP_QUERY_EV_STATE       no
ctl.create_cc_profile      mrc_ctl_modify_cc_profile                           yes
ctl.destroy_cc_profile     mrc_ctl_modify_cc_profile ONLINE->OFFLINE->INIT     yes
ctl.query_cc_profile       mrc_ctl_query_cc_profile                            no
ctl.list_cc_profiles       (all profiles)                                      no
ctl.subscribe_ev_events    mrc_ctl_create_ev_event_cq + poll_ev_event          no
ctl.recent_ev_events       (the last events, without subscribing)              no
ctl.ep_batch               mrc_ctl_ep_batch_send_wait (EV_PROBE, PORT_STATUS)  yes
ctl.connect_qp             (ibv_modify_qp RTR/RTS of an application's QP)      yes
ctl.query_link_denylist    (the fabric mapper's links no path may cross)       no
ctl.set_link_denylist      (deny every EV over those links, on every QP)       yes
=========================  ==================================================  ==========
"""

from __future__ import annotations

import asyncio
import errno
import logging
import time
from collections import deque
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, Protocol

from mrcstack import addrplan
from mrcstack.api.errors import ApiError, invalid
from mrcstack.api.limits import U16, U32, U64
from mrcstack.core import cc as cc_mod
from mrcstack.core.events import EvStateChanged
from mrcstack.daemons.mrcd import apiargs as a
from mrcstack.daemons.mrcd.node.node import Node
from mrcstack.daemons.mrcd.node.profiles import (
    CC_ALIASES,
    EV_MAX_COUNT,
    EV_MAX_COUNT_PROFILE,
    MAX_CC_PROFILES,
    MAX_EV_PROFILES,
    ProfileStore,
)
from mrcstack.errors import LocalError
from mrcstack.fabric import Fabric
from mrcstack.qpn import qpn_text

log = logging.getLogger("mrcd.ctl")

RECENT_EVENTS = 1024
#: Bytes a subscriber may lag before its EV events are dropped (and counted).
SUBSCRIBER_LAG = 1 << 20
MAX_EP_REQUESTS = 256
MAX_DENIED_LINKS = 65536
MAX_SOURCE = 64
MAX_EP_TIMEOUT = 30.0


class Subscriber(Protocol):
    def push_ev_event(self, doc: dict[str, Any], limit: int) -> bool: ...


@dataclass(frozen=True, slots=True)
class EpResponse:
    """One endpoint-operation response (``mrc_ctl_ep_rsp``): RTT in seconds.

    ``via`` says what carried it: ``"control"`` for the control channel (management
    network), ``"data"`` for a probe along the EV's own path.
    """

    rtt: float
    port: int
    adj_svc_time: bool = False
    via: str = "control"
    path: str = ""


class EndpointOps(Protocol):
    """How endpoint operations reach the peer's mrcd (tests may stand in their own)."""

    async def ev_probe(self, host: int, plane: int, ev: int, timeout: float) -> EpResponse: ...

    async def port_status_update(
        self, host: int, port_status: int, timeout: float
    ) -> EpResponse: ...


class ControlChannelEndpointOps:
    """Endpoint operations over the authenticated control channel to the peer's mrcd.

    PORT_STATUS is the control channel's own message.  EV_PROBE is an MRC probe packet on the
    data path: it leaves on the EV's plane to the EV's uSID address and the peer's mrcd answers
    along the reverse path through the same T1, so the RTT is that path's.
    """

    def __init__(self, node: Node) -> None:
        self.node = node

    async def _session(self, host: int) -> Any:
        client = self.node.control_client
        if client is None:
            raise ApiError(errno.EOPNOTSUPP, "mrcd's control channel is not running")
        return await client.open_session(Fabric.host_name(host))

    async def ev_probe(self, host: int, plane: int, ev: int, timeout: float) -> EpResponse:
        try:
            path = addrplan.address(self.node.fabric, self.node.host, host, plane, ev)
        except ValueError as exc:
            raise ApiError(errno.EINVAL, str(exc)) from None
        try:
            rtt = await self.node.probe(host, plane, ev, timeout)
        except TimeoutError:
            raise ApiError(
                errno.ETIMEDOUT, f"no reply along plane {plane} EV {ev:#x} ({path})"
            ) from None
        except LocalError as exc:
            raise ApiError(errno.EINVAL, str(exc)) from None
        return EpResponse(rtt=rtt, port=plane, via="data", path=str(path))

    async def port_status_update(self, host: int, port_status: int, timeout: float) -> EpResponse:
        session = await self._session(host)
        loop = asyncio.get_running_loop()
        sent = loop.time()
        await session.port_status(self.node.host, port_status, timeout)
        return EpResponse(rtt=loop.time() - sent, port=0, via="control")


Handler = Callable[[dict[str, Any], Subscriber], Any]


class Controller:
    """The controller role of one mrcd (profiles, ports, EV events, endpoint ops)."""

    def __init__(self, node: Node, endpoint_ops: EndpointOps | None = None) -> None:
        self.node = node
        self.endpoint_ops = endpoint_ops
        # The node's store when it keeps one (connection setup builds connections from it).
        self.profiles: ProfileStore = node.profiles
        self.recent: deque[dict[str, Any]] = deque(maxlen=RECENT_EVENTS)
        self.subscribers: dict[Subscriber, int] = {}  # subscriber -> events dropped since last
        self.events_total = 0
        node.ev_listeners.append(self._on_ev_event)
        self._open: dict[str, Handler] = {
            "ctl.query_device": self.query_device,
            "ctl.list_ports": self.list_ports,
            "ctl.query_ev_fmt_profile": self.query_ev_fmt_profile,
            "ctl.query_ev_profile": self.query_ev_profile,
            "ctl.list_ev_profiles": self.list_ev_profiles,
            "ctl.query_ev_states": self.query_ev_states,
            "ctl.query_qps": self.query_qps,
            "ctl.query_cc_profile": self.query_cc_profile,
            "ctl.list_cc_profiles": self.list_cc_profiles,
            "ctl.subscribe_ev_events": self.subscribe_ev_events,
            "ctl.recent_ev_events": self.recent_ev_events,
            "ctl.query_link_denylist": self.query_link_denylist,
        }
        self._privileged: dict[str, Handler] = {
            "ctl.modify_port": self.modify_port,
            "ctl.create_ev_profile": self.create_ev_profile,
            "ctl.modify_ev_profile": self.modify_ev_profile,
            "ctl.modify_ev_state": self.modify_ev_state,
            "ctl.destroy_ev_profile": self.destroy_ev_profile,
            "ctl.create_cc_profile": self.create_cc_profile,
            "ctl.destroy_cc_profile": self.destroy_cc_profile,
            "ctl.ep_batch": self.ep_batch,
            "ctl.connect_qp": self.connect_qp,
            "ctl.set_link_denylist": self.set_link_denylist,
        }

    def close(self) -> None:
        if self._on_ev_event in self.node.ev_listeners:
            self.node.ev_listeners.remove(self._on_ev_event)
        self.subscribers.clear()

    def call(self, op: str, args: dict[str, Any], privileged: bool, who: Subscriber) -> Any:
        handler = self._open.get(op)
        if handler is None:
            handler = self._privileged.get(op)
            if handler is None:
                raise ApiError(errno.EOPNOTSUPP, f"unknown controller operation {op!r}")
            if not privileged:
                raise ApiError(errno.EPERM, f"{op} changes the node: only root (uid 0) may call it")
            log.info("event=ctl_call op=%s", op)
        return handler(args, who)

    # Device and ports -------------------------------------------------------------------------
    def query_device(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        node = self.node
        opt = ["ev_profile_modify_online", "ev_event", "ev_event_precise_drop_cnt"]
        if self._endpoint_ops() is not None:
            opt.append("ep_op_ev_probe")
        used = sum(len(p.evs or ()) for p in self.profiles.ev.values())
        return {
            "ctl_protocol_version": 1,
            "host": node.host,
            "host_name": node.cfg.host_name,
            "planes": node.fabric.planes,
            "ev": {
                "max_fmt_profiles": 1,
                "max_profiles": MAX_EV_PROFILES,
                "max_count": EV_MAX_COUNT,
                "free_count": EV_MAX_COUNT - used,
                "max_count_profile": EV_MAX_COUNT_PROFILE,
                "count_align": 0,
                "max_width": 32,
                "fmt_modes": ["srv6"],
                "ev_modes": ["explicit", "generated"],
                "op_max_entries": EV_MAX_COUNT_PROFILE,
            },
            "cc": {
                "max_profiles": MAX_CC_PROFILES,
                "algorithms": sorted({*cc_mod.REGISTRY, *CC_ALIASES}),
            },
            "port_mask": (1 << node.fabric.planes) - 1,
            "opt": opt,
        }

    def _port(self, plane: int) -> dict[str, Any]:
        node = self.node
        return {
            "port": plane,
            "admin": "enabled" if node.port_admin[plane] else "disabled",
            "link": "up" if node.port_link[plane] else "down",
            "state": "up" if node.port_up(plane) else "down",
        }

    def list_ports(self, args: dict[str, Any], who: Subscriber) -> list[dict[str, Any]]:
        return [self._port(p) for p in range(self.node.fabric.planes)]

    def modify_port(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        plane = a.get_int(args, "port", 0, self.node.fabric.planes - 1)
        enabled = a.get_bool(args, "enabled", True)
        self.node.set_port_admin(plane, enabled)
        return self._port(plane)

    # EV format and EV profiles ------------------------------------------------------------------
    def query_ev_fmt_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        return self.profiles.ev_format(a.get_int(args, "id", 0, U64, 0))

    def create_ev_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        return self.profiles.create_ev(self.node, args).to_json(with_evs=False)

    def modify_ev_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        return self.profiles.modify_ev(self.node, args).to_json(with_evs=False)

    def modify_ev_state(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        ident = a.get_int(args, "id", 0, U64)
        state = a.get_str(args, "state", ("denied", "allowed"), "denied")
        items = a.get_list(args, "evs", EV_MAX_COUNT_PROFILE)
        values = []
        for i, v in enumerate(items):
            if type(v) is not int or not 0 <= v <= U32:
                raise ApiError(errno.EINVAL, f"evs[{i}]: must be a 32-bit EV value")
            values.append(v)
        if not values:
            raise ApiError(errno.EINVAL, "evs: name at least one EV")
        changed = self.profiles.set_ev_state(self.node, ident, values, deny=state == "denied")
        log.info("event=ev_%s profile=%d evs=%d qp_changes=%d", state, ident, len(values), changed)
        return {"id": ident, "state": state, "evs": values, "changed": changed}

    def destroy_ev_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        self.profiles.destroy_ev(self.node, a.get_int(args, "id", 0, U64))
        return {}

    def query_ev_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        profile = self.profiles.ev_profile(a.get_int(args, "id", 0, U64, 0))
        doc = profile.to_json(with_evs=True)
        doc["qps"] = self.profiles.users(self.node, ev=profile.ident)
        return doc

    def list_ev_profiles(self, args: dict[str, Any], who: Subscriber) -> list[dict[str, Any]]:
        return [p.to_json(with_evs=False) for _, p in sorted(self.profiles.ev.items())]

    def query_ev_states(self, args: dict[str, Any], who: Subscriber) -> list[dict[str, Any]]:
        qpn = a.get_opt_int(args, "qpn", 0, U32)
        profile = a.get_opt_int(args, "id", 0, U64)
        rows = self.node.ev_states(qpn)
        if profile is None:
            return rows
        qpns = set(self.profiles.users(self.node, ev=profile))
        return [r for r in rows if r["qpn"] in qpns]

    def query_qps(self, args: dict[str, Any], who: Subscriber) -> list[dict[str, Any]]:
        """Every QP (or one): peer, state, RTO and retry budget."""
        qpn = a.get_opt_int(args, "qpn", 0, U32)
        rows = self.node.qp_info(qpn)
        if qpn is not None and not rows:
            raise ApiError(errno.ENOENT, f"no QP {qpn_text(qpn)}")
        return rows

    def connect_qp(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        """Set an application's QP (in RESET) up out of band, as ``ibv_modify_qp`` takes it:
        the peer's host, QPN and first PSN, and optionally an AES-GCM key; without
        mrcstack's extension unless ``extensions`` (a peer without mrcd has none)."""
        node = self.node
        qpn = a.get_int(args, "qpn", 1, (1 << 24) - 1)
        key = a.get_hex(args, "key", 32) or None
        if key is not None and len(key) not in (16, 32):
            raise invalid(f"key: AES-GCM takes 16 or 32 bytes, got {len(key)}")
        try:
            node.connect_manual(
                qpn,
                a.get_int(args, "remote_host", 0, node.fabric.hosts - 1),
                a.get_int(args, "remote_qpn", 1, (1 << 24) - 1),
                a.get_int(args, "remote_psn", 0, (1 << 24) - 1),
                key,
                a.get_bool(args, "extensions", False),
            )
        except LocalError as exc:
            raise ApiError(errno.EINVAL, str(exc)) from None
        self.profiles.apply_to_qp(node, qpn)
        return node.qp_info(qpn)[0]

    # CC profiles ------------------------------------------------------------------------------
    def create_cc_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        return self.profiles.create_cc(self.node, args).to_json()

    def destroy_cc_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        self.profiles.destroy_cc(self.node, a.get_int(args, "id", 0, U64))
        return {}

    def query_cc_profile(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        return self.profiles.cc_profile(a.get_int(args, "id", 0, U64, 0)).to_json()

    def list_cc_profiles(self, args: dict[str, Any], who: Subscriber) -> list[dict[str, Any]]:
        return [p.to_json() for _, p in sorted(self.profiles.cc.items())]

    # EV events --------------------------------------------------------------------------------
    def subscribe_ev_events(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        """Stream EV events to this client from now on; returns the recent ones too."""
        self.subscribers.setdefault(who, 0)
        return {"recent": list(self.recent) if a.get_bool(args, "recent", True) else []}

    def recent_ev_events(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        return {"recent": list(self.recent), "total": self.events_total}

    def unsubscribe(self, who: Subscriber) -> None:
        self.subscribers.pop(who, None)

    def _on_ev_event(self, qpn: int, event: EvStateChanged) -> None:
        profile = self.profiles.ev.get(event.profile_id)
        if profile is not None and event.new not in profile.event_mask:
            return
        self.events_total += 1
        doc: dict[str, Any] = {
            "type": "ev_event",
            "time": time.time(),
            "profile_id": event.profile_id,
            "qpn": qpn,
            "ev": event.ev,
            "port": event.port,
            "state": event.new.value,
            "old_state": event.old.value,
            "reason": event.reason,
            "drop_count": event.drop_count,
        }
        self.recent.append(doc)
        for who, dropped in list(self.subscribers.items()):
            if who.push_ev_event({**doc, "events_dropped": dropped}, SUBSCRIBER_LAG):
                self.subscribers[who] = 0
            else:
                self.subscribers[who] = dropped + 1

    # The link denylist ------------------------------------------------------------------------
    def query_link_denylist(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        return self.node.denylist.to_json()

    def set_link_denylist(self, args: dict[str, Any], who: Subscriber) -> dict[str, Any]:
        """``links``: link names (``p0:t0a-t1c``, either direction); ``version`` (default:
        one more than now) and ``source`` (default ``controller``) say whose list it is."""
        fabric = self.node.fabric
        links = set()
        for i, item in enumerate(a.get_list(args, "links", MAX_DENIED_LINKS)):
            if not isinstance(item, str):
                raise ApiError(errno.EINVAL, f"links[{i}]: must be a link name")
            try:
                addrplan.parse_link(item, fabric)
                links.add(addrplan.canonical_link(item))
            except ValueError as exc:
                raise ApiError(errno.EINVAL, f"links[{i}]: {exc}") from None
        denylist = self.node.denylist
        version = a.get_int(args, "version", 0, U64, denylist.version + 1)
        source = args.get("source", "controller")
        if not isinstance(source, str) or not 0 < len(source) <= MAX_SOURCE:
            raise ApiError(errno.EINVAL, f"source: a string of 1..{MAX_SOURCE} characters")
        done = denylist.set(frozenset(links), version, source)
        log.info(
            "event=link_denylist version=%d source=%s links=%s evs_changed=%d qps=%d denied=%d",
            version, source, ",".join(sorted(links)) or "-", done.changed, done.qps, done.denied,
        )  # fmt: skip
        return {**denylist.to_json(), "changed": done.changed}

    # Endpoint operations ------------------------------------------------------------------------
    def ep_batch(
        self, args: dict[str, Any], who: Subscriber
    ) -> Coroutine[Any, Any, dict[str, Any]]:
        op = a.get_str(args, "op", ("ev_probe", "port_status_update"), "ev_probe")
        timeout = a.get_float(args, "timeout", 0.0, MAX_EP_TIMEOUT, 1.0)
        fabric = self.node.fabric
        requests = []
        for i, item in enumerate(a.get_list(args, "requests", MAX_EP_REQUESTS)):
            if not isinstance(item, dict):
                raise ApiError(errno.EINVAL, f"requests[{i}]: must be an object")
            req_id = a.get_int(item, "req_id", 0, U16, i)
            host = a.get_int(item, "host", 0, fabric.hosts - 1)
            if host == self.node.host:
                raise ApiError(errno.EINVAL, f"requests[{i}].host: {host} is this host")
            if op == "ev_probe":
                plane = a.get_int(item, "plane", 0, fabric.planes - 1)
                ev = a.get_int(item, "ev", 0, U32)
                requests.append((req_id, host, plane, ev))
            else:
                default = sum(1 << p for p in range(fabric.planes) if self.node.port_up(p))
                status = a.get_int(item, "port_status", 0, (1 << fabric.planes) - 1, default)
                requests.append((req_id, host, status, 0))
        if not requests:
            raise ApiError(errno.EINVAL, "requests: give at least one")
        ops = self._endpoint_ops()
        if ops is None:
            raise ApiError(
                errno.EOPNOTSUPP,
                "endpoint operations need mrcd's control channel, which is not running",
            )
        return self._run_batch(ops, op, requests, timeout)

    def _endpoint_ops(self) -> EndpointOps | None:
        if self.endpoint_ops is None and self.node.control_client is not None:
            self.endpoint_ops = ControlChannelEndpointOps(self.node)
        return self.endpoint_ops

    async def _run_batch(
        self, ops: EndpointOps, op: str, requests: list[tuple[int, int, int, int]], timeout: float
    ) -> dict[str, Any]:
        responses: list[dict[str, Any]] = []

        async def one(req_id: int, host: int, x: int, ev: int) -> None:
            if op == "ev_probe":
                rsp = await ops.ev_probe(host, x, ev, timeout)
            else:
                rsp = await ops.port_status_update(host, x, timeout)
            responses.append(
                {
                    "req_id": req_id,
                    "host": host,
                    "port": rsp.port,
                    "rtt": rsp.rtt,
                    "adj_svc_time": rsp.adj_svc_time,
                    "via": rsp.via,
                    "path": rsp.path,
                }
            )

        tasks = [asyncio.ensure_future(one(*r)) for r in requests]
        done, pending = await asyncio.wait(tasks, timeout=timeout)
        for task in pending:
            task.cancel()
        errors = {}
        for req, task in zip(requests, tasks, strict=True):
            exc = task.exception() if task in done else None
            if exc is not None:
                errors[str(req[0])] = str(exc)
        answered = {r["req_id"] for r in responses}
        timed_out = [r[0] for r in requests if r[0] not in answered and str(r[0]) not in errors]
        result = {"op": op, "responses": responses, "timed_out": timed_out, "errors": errors}
        if op == "ev_probe":  # each probe's path, answered or not, so a loss can name it
            result["paths"] = {str(r[0]): self._probe_path(r[1], r[2], r[3]) for r in requests}
        return result

    def _probe_path(self, host: int, plane: int, ev: int) -> str | None:
        try:
            return str(addrplan.address(self.node.fabric, self.node.host, host, plane, ev))
        except ValueError:
            return None
