"""A QP's events, fanned out: the log, the metrics, the peer watch, controllers, the owner.

The transport hands every event of a connection to :meth:`EventFanout.on_event` as it
drains it; so does the node when it fails a connection itself.  The QP's owner (the API
server's QP table) always hears it last, after the node's own records are up to date.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

from mrcstack.core.events import (
    ConnectionFailed,
    Event,
    EvState,
    EvStateChanged,
    PortStateChanged,
    SendCompleted,
    WcStatus,
)
from mrcstack.core.reasons import EvReason
from mrcstack.daemons.mrcd.datapath.transport import clock
from mrcstack.daemons.mrcd.node.qps import Qp, QpState
from mrcstack.daemons.mrcd.node.snapshot import Buckets
from mrcstack.qpn import qpn_text

log = logging.getLogger("mrcd")

#: Told every EV state change of every QP (the controller API's EV events).
EvListener = Callable[[int, EvStateChanged], None]


class EventFanout:
    """Where the events of the QPs in ``qps`` go.

    ``path_timed_out(host)`` is the peer watch's (an EV to ``host`` demoted by an RTO);
    ``write_completion`` the histogram of post-to-completion times."""

    def __init__(
        self,
        qps: Mapping[int, Qp],
        path_timed_out: Callable[[int], None],
        write_completion: Buckets,
    ) -> None:
        self.qps = qps
        self.path_timed_out = path_timed_out
        self.write_completion = write_completion
        self.ev_listeners: list[EvListener] = []

    def on_event(self, qpn: int, event: Event) -> None:
        qp = self.qps.get(qpn)
        if type(event) is EvStateChanged:
            if event.new is EvState.ASSUMED_BAD:
                if event.reason is EvReason.RTO and qp is not None:
                    self.path_timed_out(qp.remote_host)
                log.warning(
                    "event=path_failed qpn=%s ev=%#x plane=%d drops=%d reason=%s",
                    qpn_text(qpn),
                    event.ev,
                    event.port,
                    event.drop_count,
                    event.reason,
                )
            for listener in self.ev_listeners:
                listener(qpn, event)
        elif type(event) is PortStateChanged and event.remote:
            log.warning(
                "event=peer_plane_%s qpn=%s plane=%d",
                "up" if event.up else "down",
                qpn_text(qpn),
                event.port,
            )
        elif type(event) is SendCompleted:
            posted = None if qp is None else qp.posted.pop(event.wr_id, None)
            if posted is not None and event.status is WcStatus.SUCCESS:
                self.write_completion.observe(clock() - posted)
                qp.labels.pop(event.wr_id, None)  # type: ignore[union-attr]
        elif type(event) is ConnectionFailed:
            if event.wr_id is not None:  # name the write as its application knows it
                label = event.wr_id if qp is None else qp.labels.get(event.wr_id, event.wr_id)
                event = dataclasses.replace(event, reason=f"{event.reason} (wr_id {label:#x})")
            if qp is None or qp.failure is None:  # else we failed it ourselves (QpTable.abort)
                log.error("event=connection_failed qpn=%s reason=%r", qpn_text(qpn), event.reason)
            if qp is not None:
                qp.state = QpState.ERROR
                qp.failure = qp.failure or event.reason
        if qp is not None:
            qp.on_event(qpn, event)
