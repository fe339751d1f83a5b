"""Values of the application API: opcodes, statuses, attributes, completions, events.

Numeric values of opcodes and statuses are the libibverbs ones (``ibv_wr_opcode``,
``ibv_wc_status``, ``ibv_wc_opcode``), so a completion reads the same as in C; the names are
shortened the Python way (``WcStatus.REM_ACCESS_ERR`` is ``IBV_WC_REM_ACCESS_ERR``).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from mrcstack.qpn import dataclass_repr


class Opcode(enum.IntEnum):
    """Send opcodes (``ibv_wr_opcode``).  MRC carries only the two RDMA WRITE ones."""

    RDMA_WRITE = 0
    RDMA_WRITE_WITH_IMM = 1
    SEND = 2
    SEND_WITH_IMM = 3
    RDMA_READ = 4
    ATOMIC_CMP_AND_SWP = 5
    ATOMIC_FETCH_AND_ADD = 6


SUPPORTED_OPCODES = frozenset({Opcode.RDMA_WRITE, Opcode.RDMA_WRITE_WITH_IMM})


class WcStatus(enum.IntEnum):
    """Completion status (``ibv_wc_status``), the values MRC can produce."""

    SUCCESS = 0
    WR_FLUSH_ERR = 5  # the QP failed or was torn down before this request finished
    REM_INV_REQ_ERR = 9  # the peer found the write malformed (or out of its window)
    REM_ACCESS_ERR = 10  # the peer rejected the rkey or range
    RETRY_EXC_ERR = 12  # retries (linear_cnt + exp_cnt) exhausted


class WcOpcode(enum.IntEnum):
    """Completion opcode (``ibv_wc_opcode``)."""

    RDMA_WRITE = 1
    RECV_RDMA_WITH_IMM = 129


class Access(enum.IntFlag):
    """Memory-region access (``ibv_access_flags`` subset that MRC uses)."""

    LOCAL_WRITE = 0x1
    REMOTE_WRITE = 0x2


class QpState(enum.Enum):
    """QP state as the API reports it (verbs names; INIT/RTR are folded into RESET)."""

    RESET = "reset"
    RTS = "rts"
    ERROR = "error"


class AsyncEventType(enum.Enum):
    """Asynchronous events (``ibv_event_type`` names MRC uses, plus RECV_QUEUE_EMPTY)."""

    QP_FATAL = "qp_fatal"  # the QP entered the error state; the reason says why
    RECV_QUEUE_EMPTY = "recv_queue_empty"  # a write-with-immediate found no posted receive
    PORT_ACTIVE = "port_active"  # a local NIC port (plane) came back
    PORT_ERR = "port_err"  # a local NIC port (plane) went down (link or admin)
    DEVICE_FATAL = "device_fatal"  # mrcd is stopping: every QP of the context is gone


class DeviceCap(enum.IntFlag):
    """``mrc_device_cap`` bits (plus SVC_TIME, responder service time in probe replies)."""

    TRIM_NACK = 1 << 0
    DYNAMIC_MPR = 1 << 1
    SVC_TIME = 1 << 2


@dataclass(frozen=True, slots=True)
class DeviceAttr:
    """``mrc_device_attr`` and the few facts of this mrcd that callers need."""

    protocol_version: int
    max_wimm: int
    max_wimm_dest: int
    max_mpr: int
    mpr_resolution: int
    dynamic_mpr: bool
    max_qp_hint: int
    cap: DeviceCap
    host: int
    host_name: str
    planes: int
    max_mtu_payload: int
    max_qp: int
    max_cq: int
    max_mr: int
    max_mr_size: int

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> DeviceAttr:
        values = {k: doc[k] for k in cls.__dataclass_fields__}
        values["cap"] = DeviceCap(int(values["cap"]))
        values["dynamic_mpr"] = bool(values["dynamic_mpr"])
        return cls(**values)


@dataclass(frozen=True, slots=True)
class QpCap:
    """``ibv_qp_cap``: outstanding send requests and posted receive buffers."""

    max_send_wr: int = 1024
    max_recv_wr: int = 1024


@dataclass(frozen=True, slots=True)
class QpHint:
    """``mrc_qp_hint_attr``: expected traffic pattern (advisory; mrcd pre-sizes nothing)."""

    num_qps_per_peer: int = 1
    num_send_peers: int = 1
    num_remote_recv_peers: int = 1


@dataclass(frozen=True, slots=True)
class QpAttr:
    """``mrc_qp_attr`` with Pythonic units: ``timeout`` is the minimum retransmission
    timeout in seconds (mrc.h encodes 1.024 us x 2**timeout); ``exp_cnt=25`` means retry
    forever, as in mrc.h.  ``ack_coalesce`` (not in mrc.h) is how many data packets one
    ACK of this QP's receive side may stand for, 1..64."""

    max_wimm: int = 1024
    max_wimm_dest: int = 1024
    timeout: float | None = None  # None: mrcd's default (10 ms)
    linear_cnt: int = 3
    exp_cnt: int = 6
    ev_profile_id: int = 0
    cc_profile_id: int = 0
    mtu_payload: int = 8192
    ack_coalesce: int | None = None  # None: mrcd's setting (mrcd.ack_coalesce, 16)
    hint: int | None = None  # a QP hint handle from Context.create_qp_hint

    def to_json(self) -> dict[str, Any]:
        doc = {name: getattr(self, name) for name in self.__dataclass_fields__}
        for name in ("timeout", "ack_coalesce"):
            if doc[name] is None:
                del doc[name]  # the daemon's default
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> QpAttr:
        return cls(**{k: doc[k] for k in cls.__dataclass_fields__ if k in doc})


#: QpAttr field names (what modify_qp accepts).
QP_ATTR_FIELDS = frozenset(QpAttr.__dataclass_fields__)


@dataclass(frozen=True, slots=True)
class WorkCompletion:
    """``ibv_wc``: one finished work request."""

    wr_id: int
    status: WcStatus
    opcode: WcOpcode
    qpn: int
    byte_len: int
    imm: int | None = None

    @property
    def ok(self) -> bool:
        return self.status is WcStatus.SUCCESS

    def __repr__(self) -> str:
        return dataclass_repr(self)  # the QPN in hex, as everywhere


@dataclass(frozen=True, slots=True)
class AsyncEvent:
    """``mrc_async_event``: the element (QP number or port) and what happened."""

    type: AsyncEventType
    qpn: int | None = None
    port: int | None = None
    reason: str = ""

    def __repr__(self) -> str:
        return dataclass_repr(self)  # the QPN in hex, as everywhere


@dataclass(frozen=True, slots=True)
class ConnectRequest:
    """A peer asks to connect to a service this context listens on (accept or reject it)."""

    request_id: int
    remote_host: int
    remote_qpn: int
    service: int
    private_data: bytes = field(repr=False)

    def __repr__(self) -> str:
        return dataclass_repr(self)  # the QPN in hex, as everywhere


@dataclass(frozen=True, slots=True)
class QpInfo:
    """What ``query_qp`` returns: state, attributes, capacities, the peer once connected."""

    qpn: int
    state: QpState
    attr: QpAttr
    cap: QpCap
    sq_sig_all: bool
    remote_host: int | None
    remote_qpn: int | None
    failure: str | None
    outstanding_sends: int
    posted_recvs: int
    #: The first PSN this QP sends: what a peer set up out of band needs (``rq_psn``).
    psn: int = 0
    #: mrcstack's extension headers on the wire (negotiated, or set out of band); None
    #: before the QP is connected.
    extensions: bool | None = None

    def __repr__(self) -> str:
        return dataclass_repr(self)  # the QPN in hex, as everywhere

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> QpInfo:
        return cls(
            qpn=int(doc["qpn"]),
            state=QpState(doc["state"]),
            attr=QpAttr.from_json(doc["attr"]),
            cap=QpCap(**doc["cap"]),
            sq_sig_all=bool(doc["sq_sig_all"]),
            remote_host=doc.get("remote_host"),
            remote_qpn=doc.get("remote_qpn"),
            failure=doc.get("failure"),
            outstanding_sends=int(doc["outstanding_sends"]),
            posted_recvs=int(doc["posted_recvs"]),
            psn=int(doc.get("psn", 0)),
            extensions=doc.get("extensions"),
        )
