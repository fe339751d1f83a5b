"""Where a node's datagrams go and come from: pure functions of the configuration.

In ``srv6`` data mode each plane socket listens on the host's NIC SID of that plane and a
QP's datagram goes to the uSID address of its EV (:mod:`mrcstack.addrplan`), or, in the EV
formats mrcd writes itself, behind the headers :func:`.datapath.routes.raw_route` builds.
In ``loopback`` mode every plane socket is on ``::1`` and the port says which host and plane
it is: ``data_port + host * PORT_STRIDE + plane``.
"""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv6Address

from mrcstack import addrplan
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.datapath.routes import raw_route
from mrcstack.daemons.mrcd.datapath.transport import Address, RawRoute
from mrcstack.errors import LocalError
from mrcstack.wire import EvFormat, IcrcPath

#: Loopback data mode: each host's plane sockets use data_port + host * PORT_STRIDE + plane.
PORT_STRIDE = 16


@dataclass(frozen=True, slots=True)
class Addresses:
    """The data addresses, routes and ICRC paths of one host (``cfg.host``)."""

    cfg: MrcdConfig

    def data_address(self, host: int, plane: int) -> Address:
        """Where ``host``'s plane socket of ``plane`` listens."""
        cfg = self.cfg
        if cfg.data_mode == "loopback":
            return ("::1", cfg.data_port + host * PORT_STRIDE + plane)
        return (str(addrplan.nic_sid(cfg.fabric, plane, host)), cfg.data_port)

    def icrc_paths(self, remote: int) -> tuple[IcrcPath, ...]:
        """Each plane's endpoints as packets arrive (uSID leaves the destination equal to the
        peer's plane address once the path is consumed): the ICRC's pseudo header."""
        paths = []
        for plane in range(self.cfg.fabric.planes):
            local, local_port = self.data_address(self.cfg.host, plane)
            peer, peer_port = self.data_address(remote, plane)
            paths.append(IcrcPath(local, peer, local_port, peer_port))
        return tuple(paths)

    def route(
        self, remote: int, plane: int, ev: int, fmt: EvFormat, striped: bool = False
    ) -> Address | RawRoute:
        """Where the transport sends a QP's datagram: SRv6 uSID addresses, or the headers of
        the formats mrcd writes itself and of a QP without mrcstack's extension (``striped``:
        the EV in the UDP source port and flow label), built once per path and cached by the
        transport."""
        if fmt is EvFormat.SRV6 and not striped:
            return self.resolve(remote, plane, ev)
        cfg = self.cfg
        return raw_route(cfg.fabric, cfg.host, remote, plane, ev, fmt, cfg.data_port, striped)

    def resolve(self, remote: int, plane: int, ev: int) -> Address:
        """The uSID address of one EV to ``remote`` (loopback: its plane socket)."""
        cfg = self.cfg
        if cfg.data_mode == "loopback":
            return self.data_address(remote, plane)
        dst = addrplan.address(cfg.fabric, cfg.host, remote, plane, ev)
        return (str(dst), cfg.data_port)

    def check_remote(self, remote: int) -> None:
        """LocalError unless ``remote`` is another host of the fabric."""
        if not 0 <= remote < self.cfg.fabric.hosts or remote == self.cfg.host:
            raise LocalError(f"bad remote host {remote}")

    def check_ev_format(self, fmt: EvFormat, striped: bool = False) -> None:
        """LocalError unless this daemon can send in ``fmt`` (``striped``: without mrcstack's
        extension, the EV in the UDP source port, which loopback mode's ports cannot carry)."""
        if striped and self.cfg.data_mode == "loopback":
            raise LocalError(
                "a QP without mrcstack's extension needs a fabric (data_mode srv6), not loopback"
            )
        if fmt is EvFormat.SRV6:
            return
        if self.cfg.data_mode == "loopback":
            raise LocalError(f"EV format {fmt.value} needs a fabric (data_mode srv6), not loopback")
        if fmt is EvFormat.SRV6_SRH and self.cfg.fabric.sid_format != "classic":
            raise LocalError(
                "EV format srv6-srh needs switches with classic SIDs (fabric sid_format classic)"
            )

    def host_of(self, source: Address, plane: int) -> int | None:
        """Which host sent this: its NIC SID names it (loopback mode: its port does)."""
        cfg = self.cfg
        if cfg.data_mode == "loopback":
            host, rest = divmod(source[1] - cfg.data_port, PORT_STRIDE)
            return host if rest == plane and 0 <= host < cfg.fabric.hosts else None
        try:
            owner_plane, name = addrplan.usid_owner(addrplan.active_usid(IPv6Address(source[0])))
        except ValueError:
            return None
        if owner_plane != plane or not name.startswith("h"):
            return None
        return int(name[1:])
