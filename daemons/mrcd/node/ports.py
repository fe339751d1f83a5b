"""Port state: this host's NIC ports, and the peers' as they tell us.

A local port (one per plane) is up when it is administratively enabled (controller API) and
its link is up (the netlink link watch).  A change reaches every connection at once; peers
learn it from the port bitmap in our SACKs and probe replies.

A peer's ports arrive the same way, in its SACKs, and also as a PORT_STATUS_UPDATE over the
control channel (the controller API's port-status update): that bitmap is applied to every
connection to that host exactly as the bitmap of a SACK is (``Connection.set_peer_ports``),
so the QPs to a host stop using a plane it says is down at once, without waiting for its
next SACK, and use it again when it says it is back.  Later SACKs keep updating it, as
always.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from mrcstack.daemons.mrcd.node.qps import Qp, QpConnection
from mrcstack.errors import LocalError

log = logging.getLogger("mrcd")


class Ports:
    """The port state of one node, applied to the connections in ``qps``.

    ``kick(qpn)`` has the transport flush a connection that changed (which also hands its
    events, ``PortStateChanged`` among them, to the node's event path)."""

    def __init__(
        self,
        planes: int,
        host_name: str,
        qps: Mapping[int, Qp],
        clock: Callable[[], float],
        kick: Callable[[int], None],
    ) -> None:
        self.planes = planes
        self.host_name = host_name
        self.qps = qps
        self.clock = clock
        self.kick = kick
        self.admin = [True] * planes
        self.link = [True] * planes
        #: Told our new bitmap after a port changed (the node tells its peers).
        self.on_change: Callable[[int], None] | None = None

    def check(self, plane: int) -> None:
        if not 0 <= plane < self.planes:
            raise LocalError(f"plane {plane} out of range 0..{self.planes - 1}")

    def up(self, plane: int) -> bool:
        return self.admin[plane] and self.link[plane]

    def bits(self) -> int:
        """Our port bitmap: bit p set when plane p is up."""
        return sum(1 << p for p in range(self.planes) if self.up(p))

    # Local ports ------------------------------------------------------------------------
    def set_admin(self, plane: int, enabled: bool) -> None:
        self.check(plane)
        self._change(plane, self.admin, enabled)

    def set_link(self, plane: int, up: bool) -> None:
        self.check(plane)
        self._change(plane, self.link, up)

    def _change(self, plane: int, flags: list[bool], value: bool) -> None:
        before = self.up(plane)
        flags[plane] = value
        after = self.up(plane)
        if before == after:
            return
        log.warning("event=plane_%s host=%s plane=%d", "up" if after else "down",
                    self.host_name, plane)  # fmt: skip
        now = self.clock()
        for qpn, qp in list(self.qps.items()):
            if qp.conn is not None:
                qp.conn.set_port_state(plane, after, now)
                self.kick(qpn)
        if self.on_change is not None:
            self.on_change(self.bits())

    def new_connection(self, conn: QpConnection) -> None:
        """A connection starts with our down ports out of use."""
        now = self.clock()
        for plane in range(self.planes):
            if not self.up(plane):
                conn.set_port_state(plane, False, now)

    # Peers' ports -------------------------------------------------------------------------
    def peer_status(self, host: int, bitmap: int) -> None:
        """``host`` says bit p of ``bitmap`` is set iff its plane-p port is up."""
        bitmap &= (1 << self.planes) - 1
        log.info("event=peer_port_status host=h%d bitmap=%#x", host, bitmap)
        now = self.clock()
        for qpn, qp in list(self.qps.items()):
            conn = qp.conn
            if conn is not None and qp.remote_host == host and conn.set_peer_ports(bitmap, now):
                self.kick(qpn)
