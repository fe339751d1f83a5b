"""The controller API (mrc_ctl.h in Python): mrcd's node-wide state, for operators.

Results are plain JSON-shaped dicts (``mrcctl --json`` prints them as they come).  Queries
work for any user; changes need root (mrcd checks the caller's uid).  EV values and ports
are the address plan's: an EV is ``entropy << 12 | plane << 8 | t1`` and port ``p`` is plane
``p`` (0-based; mrc_ctl.h numbers ports from 1).
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from mrcstack.api.client import MrcdSocket
from mrcstack.api.verbs import default_socket_path


class Controller:
    """A controller session with the local mrcd (``mrc_open_context`` for mrc_ctl.h)."""

    def __init__(self, conn: MrcdSocket) -> None:
        self._conn = conn
        self._events: deque[dict[str, Any]] = deque()
        conn.on_event = self._on_event

    @classmethod
    def open(cls, socket_path: str | os.PathLike[str] | None = None) -> Controller:
        return cls(MrcdSocket(socket_path if socket_path is not None else default_socket_path()))

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> Controller:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, op: str, **args: Any) -> Any:
        """Any ``ctl.*`` operation by name (``call("list_ports")``)."""
        return self._conn.call(f"ctl.{op}", args)

    # Device and ports -------------------------------------------------------------------------
    def query_device(self) -> dict[str, Any]:
        """``mrc_ctl_query_device``: limits, CC algorithms, port mask, optional features."""
        result: dict[str, Any] = self.call("query_device")
        return result

    def ports(self) -> list[dict[str, Any]]:
        """``mrc_ctl_query_port`` for every port: admin state, link state, usable or not."""
        result: list[dict[str, Any]] = self.call("list_ports")
        return result

    def modify_port(self, port: int, enabled: bool) -> dict[str, Any]:
        """``mrc_ctl_modify_port``: administratively disable or enable a NIC port (plane)."""
        result: dict[str, Any] = self.call("modify_port", port=port, enabled=enabled)
        return result

    # EV format and EV profiles ----------------------------------------------------------------
    def ev_format(self, ident: int = 0) -> dict[str, Any]:
        """``mrc_ctl_query_ev_fmt_profile``: how EVs reach the fabric under format profile
        ``ident``: 0 SRv6 uSID, 1 SRv6 + SRH, 2 STEV (UDP source port and flow label)."""
        result: dict[str, Any] = self.call("query_ev_fmt_profile", id=ident)
        return result

    def create_ev_profile(
        self,
        ident: int,
        *,
        evs: Sequence[tuple[int, int]] | None = None,
        fields: dict[str, dict[str, int]] | None = None,
        ev_count: int | None = None,
        ev_min_active: int | None = None,
        event_mask: Sequence[str] | None = None,
        ev_format: str | None = None,
    ) -> dict[str, Any]:
        """An explicit (``evs``: (value, port) pairs) or generated (``fields``: ranges of
        t1 / plane / entropy) EV profile, ONLINE at once; ``ev_format`` names its EV format
        ("srv6", "srv6-srh", "stev"; default srv6)."""
        args: dict[str, Any] = {"id": ident}
        if evs is not None:
            args["mode"] = "explicit"
            args["evs"] = [[v, p] for v, p in evs]
        else:
            args["mode"] = "generated"
            args["fields"] = fields or {}
        for key, value in (
            ("ev_count", ev_count),
            ("ev_min_active", ev_min_active),
            ("event_mask", None if event_mask is None else list(event_mask)),
            ("format", ev_format),
        ):
            if value is not None:
                args[key] = value
        result: dict[str, Any] = self.call("create_ev_profile", **args)
        return result

    def modify_ev_profile(
        self,
        ident: int,
        *,
        ev_min_active: int | None = None,
        event_mask: Sequence[str] | None = None,
        ev_format: str | None = None,
    ) -> dict[str, Any]:
        """Change ``ev_min_active`` and the event mask online; the EV format only while no
        QP uses the profile."""
        args: dict[str, Any] = {"id": ident}
        if ev_min_active is not None:
            args["ev_min_active"] = ev_min_active
        if event_mask is not None:
            args["event_mask"] = list(event_mask)
        if ev_format is not None:
            args["format"] = ev_format
        result: dict[str, Any] = self.call("modify_ev_profile", **args)
        return result

    def deny(self, ident: int, evs: Sequence[int]) -> dict[str, Any]:
        """EV_OP_MODIFY_EV_STATE -> DENIED, on the profile and its running QPs."""
        result: dict[str, Any] = self.call(
            "modify_ev_state", id=ident, state="denied", evs=list(evs)
        )
        return result

    def allow(self, ident: int, evs: Sequence[int]) -> dict[str, Any]:
        """Undo a DENY: the EVs come back ASSUMED_BAD and must pass probes first."""
        result: dict[str, Any] = self.call(
            "modify_ev_state", id=ident, state="allowed", evs=list(evs)
        )
        return result

    def link_denylist(self) -> dict[str, Any]:
        """The fabric mapper's link denylist in force: ``links``, ``version``, ``source``,
        ``updated`` (unix time), ``denied_evs`` and ``qps`` (what it denies now)."""
        result: dict[str, Any] = self.call("query_link_denylist")
        return result

    def set_link_denylist(
        self, links: Sequence[str], *, version: int | None = None, source: str | None = None
    ) -> dict[str, Any]:
        """Deny every EV whose path crosses one of ``links`` on every QP (new QPs start
        without them); EVs over links no longer listed come back ASSUMED_BAD."""
        args: dict[str, Any] = {"links": list(links)}
        if version is not None:
            args["version"] = version
        if source is not None:
            args["source"] = source
        result: dict[str, Any] = self.call("set_link_denylist", **args)
        return result

    def destroy_ev_profile(self, ident: int) -> None:
        self.call("destroy_ev_profile", id=ident)

    def ev_profile(self, ident: int = 0) -> dict[str, Any]:
        """``mrc_ctl_query_ev_profile`` with its EV array (QUERY_EV_ARRAY)."""
        result: dict[str, Any] = self.call("query_ev_profile", id=ident)
        return result

    def ev_profiles(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("list_ev_profiles")
        return result

    def ev_states(self, qpn: int | None = None, profile: int | None = None) -> list[dict[str, Any]]:
        """EV_OP_QUERY_EV_STATE for every EV of every connected QP (or one QP / profile)."""
        result: list[dict[str, Any]] = self.call("query_ev_states", qpn=qpn, id=profile)
        return result

    def qps(self, qpn: int | None = None) -> list[dict[str, Any]]:
        """Every QP of the node (or one): peer, state, RTO, and its retry budget (seconds
        without progress before it fails on its own)."""
        result: list[dict[str, Any]] = self.call("query_qps", qpn=qpn)
        return result

    def connect_qp(
        self,
        qpn: int,
        remote_host: int,
        remote_qpn: int,
        remote_psn: int,
        *,
        key: bytes | None = None,
        extensions: bool = False,
    ) -> dict[str, Any]:
        """Set an application's QP up out of band (``ibv_modify_qp`` to RTS) with a peer
        that has no mrcd: its host, QPN and first PSN, and an AES-GCM key if both ends hold
        one; without mrcstack's extension headers unless ``extensions``.  Root only."""
        args: dict[str, Any] = {
            "qpn": qpn,
            "remote_host": remote_host,
            "remote_qpn": remote_qpn,
            "remote_psn": remote_psn,
            "extensions": extensions,
        }
        if key is not None:
            args["key"] = bytes(key).hex()
        result: dict[str, Any] = self.call("connect_qp", **args)
        return result

    # CC profiles ------------------------------------------------------------------------------
    def create_cc_profile(
        self, ident: int, algorithm: str = "nscc", **config: Any
    ) -> dict[str, Any]:
        """``mrc_ctl_modify_cc_profile``: NSCC parameters by name, durations in seconds."""
        result: dict[str, Any] = self.call(
            "create_cc_profile", id=ident, algorithm=algorithm, config=config
        )
        return result

    def cc_profile(self, ident: int = 0) -> dict[str, Any]:
        result: dict[str, Any] = self.call("query_cc_profile", id=ident)
        return result

    def cc_profiles(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("list_cc_profiles")
        return result

    def destroy_cc_profile(self, ident: int) -> None:
        self.call("destroy_cc_profile", id=ident)

    # EV events --------------------------------------------------------------------------------
    def recent_ev_events(self) -> list[dict[str, Any]]:
        result: list[dict[str, Any]] = self.call("recent_ev_events")["recent"]
        return result

    def subscribe_ev_events(self) -> list[dict[str, Any]]:
        """Start the EV event stream (``mrc_ctl_create_ev_event_cq``); returns recent ones."""
        result: list[dict[str, Any]] = self.call("subscribe_ev_events")["recent"]
        return result

    def next_ev_event(self, timeout: float | None = None) -> dict[str, Any] | None:
        """``mrc_ctl_poll_ev_event`` (blocking): the next event, or None after ``timeout``."""
        if not self._conn.wait_for(lambda: bool(self._events), timeout):
            return None
        return self._events.popleft()

    def ev_events(self) -> Iterator[dict[str, Any]]:
        """Every event from now on (subscribe first); ends if mrcd goes away."""
        while (doc := self.next_ev_event()) is not None:
            yield doc

    async def ev_events_async(self) -> AsyncIterator[dict[str, Any]]:
        while not self._conn.closed:
            await self._conn.wait_until(lambda: bool(self._events) or self._conn.closed)
            while self._events:
                yield self._events.popleft()

    def _on_event(self, doc: dict[str, Any]) -> None:
        if doc.get("type") == "ev_event":
            self._events.append(doc)

    # Endpoint operations ------------------------------------------------------------------------
    def ep_batch(
        self, op: str, requests: Sequence[dict[str, int]], timeout: float = 1.0
    ) -> dict[str, Any]:
        """``mrc_ctl_ep_batch_send_wait``: responses in arrival order, RTTs in seconds."""
        args = {"op": op, "requests": list(requests), "timeout": timeout}
        result: dict[str, Any] = self._conn.call("ctl.ep_batch", args, timeout=timeout + 5.0)
        return result

    def probe(self, host: int, plane: int, ev: int, timeout: float = 1.0) -> dict[str, Any]:
        """One EV probe to ``host`` along ``ev`` on ``plane``."""
        return self.ep_batch(
            "ev_probe", [{"req_id": 0, "host": host, "plane": plane, "ev": ev}], timeout
        )

    def port_status_update(
        self, host: int, port_status: int | None = None, timeout: float = 1.0
    ) -> dict[str, Any]:
        """Tell ``host``'s mrcd which of our ports are up (default: the current bitmap)."""
        req: dict[str, int] = {"req_id": 0, "host": host}
        if port_status is not None:
            req["port_status"] = port_status
        return self.ep_batch("port_status_update", [req], timeout)
