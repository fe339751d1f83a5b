"""The node's endpoint operations (QP 2): EV probes along one path to a peer (the controller
API's EV_PROBE, the peer watch's confirmations) and PORT_STATUS_UPDATE.

:class:`.datapath.probes.Prober` seals, sends, answers and matches them; this module
chooses where they go and refuses what cannot be sent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from mrcstack import addrplan
from mrcstack.daemons.mrcd.config import MrcdConfig
from mrcstack.daemons.mrcd.datapath.probes import PortStatusHook, Prober, Sender
from mrcstack.daemons.mrcd.node.addresses import Addresses
from mrcstack.daemons.mrcd.node.ports import Ports
from mrcstack.daemons.mrcd.node.qptable import Running
from mrcstack.errors import LocalError


class Probing:
    """EV probes and port-status updates of one node; ``send`` is its raw datagram sender,
    ``on_port_status`` where a peer's PORT_STATUS_UPDATE goes."""

    def __init__(
        self,
        node: Running,
        cfg: MrcdConfig,
        loop: asyncio.AbstractEventLoop,
        addresses: Addresses,
        ports: Ports,
        send: Sender,
        on_port_status: PortStatusHook,
        plain: Callable[[int], bool] = lambda host: False,
    ) -> None:
        self.node = node
        #: Whether a host is a peer without mrcstack's extension (a QP to it has them off):
        #: it gets probes and port status updates in the specification's encoding.
        self.plain = plain
        self.fabric = cfg.fabric
        self.host = cfg.host
        self.addresses = addresses
        self.ports = ports
        self.prober = Prober(
            loop,
            addresses.resolve,
            addresses.host_of,
            send,
            ports.bits,
            on_port_status=on_port_status,
            icrc_paths=addresses.icrc_paths,
        )

    async def probe(self, remote_host: int, plane: int, ev: int, timeout: float = 1.0) -> float:
        """Send an EV probe along one path to ``remote_host``'s mrcd; return the RTT.

        Raises TimeoutError if nothing comes back (the path, or the peer, is down); see
        :mod:`mrcstack.daemons.mrcd.datapath.probes`.
        """
        self.ports.check(plane)
        self.addresses.check_remote(remote_host)
        try:
            addrplan.address(self.fabric, self.host, remote_host, plane, ev)  # a real path?
            dst = self.addresses.resolve(remote_host, plane, ev)
        except ValueError as exc:
            raise LocalError(str(exc)) from None
        self.node.running_transport()
        return await self.prober.probe(
            plane, ev, dst, timeout, host=remote_host, plain=self.plain(remote_host)
        )

    def send_port_status(self, host: int, bitmap: int) -> int:
        """PORT_STATUS_UPDATE to ``host`` over the fabric, on every plane up (0 if none is,
        or the data path is not open): how many datagrams went out."""
        planes = [p for p in range(self.fabric.planes) if self.ports.up(p)]
        if not planes or self.node.transport is None:
            return 0
        return self.prober.send_port_status(
            host, bitmap, planes, self.fabric.t1_per_plane, plain=self.plain(host)
        )
