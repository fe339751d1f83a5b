"""The QPs of one API session: create/modify/query, connection setup, posting, completions.

Per QP it keeps the posted sends (each under a session-wide sequence number handed to the
node, so completions find their work request whatever wr_id the client chose) and the
posted receive buffers: a write with immediate consumes one, like verbs.  The node's events
become work completions and async events through the session.
"""

from __future__ import annotations

import asyncio
import errno
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from mrcstack.api import wire
from mrcstack.api.errors import ApiError, invalid
from mrcstack.api.limits import (
    CONNECT_TIMEOUT,
    MAX_CONNECT_TIMEOUT,
    MAX_PRIVATE_DATA,
    U16,
    U32,
    U64,
)
from mrcstack.api.types import SUPPORTED_OPCODES, AsyncEventType, Opcode, WcOpcode, WcStatus
from mrcstack.core import events as ev
from mrcstack.core.receiver import SACK_BITS
from mrcstack.daemons.mrcd import apiargs as a
from mrcstack.daemons.mrcd.appapi.views import Cq, SessionView
from mrcstack.daemons.mrcd.node.qps import IncomingConnect, QpAttrs, QpState
from mrcstack.errors import LocalError
from mrcstack.qpn import qpn_text

MAX_QPS = 4096
MAX_WR = 1 << 20
MAX_LENGTH = 1 << 31  # bytes one work request may write (verbs' message limit)
#: mrc.h: exp_cnt 25 means retry forever; the core counts, so "forever" is this many.
EXP_CNT_INFINITE = 25
INFINITE_RETRIES = 1 << 30
MAX_TIMEOUT = 0.25  # the core's maximum RTO: a larger minimum could never be used
ACCEPT_READY_TIMEOUT = 10.0

_STATUS = {
    ev.WcStatus.SUCCESS: WcStatus.SUCCESS,
    ev.WcStatus.REMOTE_ACCESS_ERROR: WcStatus.REM_ACCESS_ERR,
    ev.WcStatus.REMOTE_INVALID_REQUEST: WcStatus.REM_INV_REQ_ERR,
    ev.WcStatus.RETRY_EXCEEDED: WcStatus.RETRY_EXC_ERR,
    ev.WcStatus.FLUSHED: WcStatus.WR_FLUSH_ERR,
}


_OPCODE_NAMES = {int(op): op.name for op in Opcode}


@dataclass(slots=True)
class _Send:
    wr_id: int
    signaled: bool
    imm: bool


@dataclass(slots=True)
class _Qp:
    qpn: int
    send_cq: Cq
    recv_cq: Cq
    sq_sig_all: bool
    max_send_wr: int
    max_recv_wr: int
    hint: int | None
    sends: dict[int, _Send] = field(default_factory=dict)
    recvs: deque[int] = field(default_factory=deque)
    wimm: int = 0
    recv_underflows: int = 0
    destroyed: bool = False


class QpTable:
    """The QPs of one session and everything that happens to them."""

    def __init__(self, session: SessionView) -> None:
        self.s = session
        self.node = session.node
        self.qps: dict[int, _Qp] = {}
        self.pending: dict[int, IncomingConnect] = {}
        self._wr_seq = 0
        self._port_up = [True] * self.node.fabric.planes

    # QPs ------------------------------------------------------------------------------------
    def _attrs(
        self, doc: Any, base: QpAttrs, base_hint: int | None = None
    ) -> tuple[QpAttrs, int | None]:
        """Validated node attributes from an API ``QpAttr`` document (missing keys: base)."""
        if not isinstance(doc, dict):
            raise invalid("attr: must be an object")
        unknown = set(doc) - {*QpAttrs.__dataclass_fields__, "hint"}
        if unknown:
            raise invalid(f"attr.{sorted(unknown)[0]}: unknown QP attribute")
        exp_cnt = a.get_int(doc, "exp_cnt", 0, EXP_CNT_INFINITE, _api_exp(base.exp_cnt))
        attrs = QpAttrs(
            max_wimm=a.get_int(doc, "max_wimm", 1, U16, base.max_wimm),
            max_wimm_dest=a.get_int(doc, "max_wimm_dest", 1, U16, base.max_wimm_dest),
            timeout=a.get_float(doc, "timeout", 0.0, MAX_TIMEOUT, base.timeout),
            linear_cnt=a.get_int(doc, "linear_cnt", 0, 7, base.linear_cnt),
            exp_cnt=INFINITE_RETRIES if exp_cnt == EXP_CNT_INFINITE else exp_cnt,
            ev_profile_id=a.get_int(doc, "ev_profile_id", 0, U64, base.ev_profile_id),
            cc_profile_id=a.get_int(doc, "cc_profile_id", 0, U64, base.cc_profile_id),
            mtu_payload=a.get_int(
                doc, "mtu_payload", 256, self.s.max_mtu_payload(), base.mtu_payload
            ),
            ack_coalesce=(
                a.get_opt_int(doc, "ack_coalesce", 1, SACK_BITS)
                if "ack_coalesce" in doc
                else base.ack_coalesce
            ),
        )
        self.s.server.controller.profiles.check_ids(attrs.ev_profile_id, attrs.cc_profile_id)
        hint = a.get_opt_int(doc, "hint", 0, U32) if "hint" in doc else base_hint
        if hint is not None and hint not in self.s.hints:
            raise ApiError(errno.ENOENT, f"attr.hint: unknown QP hint {hint}")
        return attrs, hint

    def create_qp(self, args: dict[str, Any]) -> dict[str, Any]:
        ctx = self.s.context()
        if len(self.qps) >= MAX_QPS:
            raise ApiError(errno.ENOMEM, f"at most {MAX_QPS} QPs per context")
        send_cq = self.s.cq(args, "send_cq")
        recv_cq = self.s.cq(args, "recv_cq")
        cap = a.get_map(args, "cap")
        max_send = a.get_int(cap, "max_send_wr", 1, MAX_WR, 1024)
        max_recv = a.get_int(cap, "max_recv_wr", 1, MAX_WR, 1024)
        sq_sig_all = a.get_bool(args, "sq_sig_all", False)
        attrs, hint = self._attrs(args.get("attr", {}), QpAttrs())
        qpn = self.node.create_qp(ctx, attrs, self.on_node_event)
        self.qps[qpn] = _Qp(qpn, send_cq, recv_cq, sq_sig_all, max_send, max_recv, hint)
        for cq in {send_cq, recv_cq}:
            cq.users += 1
        return {"qpn": qpn}

    def _qp(self, args: dict[str, Any]) -> _Qp:
        qpn = a.get_int(args, "qpn", 0, U32)
        rec = self.qps.get(qpn)
        if rec is None:
            raise ApiError(errno.ENOENT, f"no QP {qpn_text(qpn)} in this context")
        return rec

    def modify_qp(self, args: dict[str, Any]) -> dict[str, Any]:
        rec = self._qp(args)
        qp = self.node.qp(rec.qpn)
        if qp.state is not QpState.RESET:
            raise ApiError(
                errno.EBUSY,
                f"QP {qpn_text(rec.qpn)} is {qp.state.value}: "
                "MRC attributes are fixed once connected",
            )
        qp.attrs, rec.hint = self._attrs(args.get("attr", {}), qp.attrs, rec.hint)
        return self._attr_json(qp.attrs, rec.hint)

    def _attr_json(self, attrs: QpAttrs, hint: int | None) -> dict[str, Any]:
        return {
            "max_wimm": attrs.max_wimm,
            "max_wimm_dest": attrs.max_wimm_dest,
            "timeout": attrs.timeout,
            "linear_cnt": attrs.linear_cnt,
            "exp_cnt": _api_exp(attrs.exp_cnt),
            "ev_profile_id": attrs.ev_profile_id,
            "cc_profile_id": attrs.cc_profile_id,
            "mtu_payload": attrs.mtu_payload,
            # The one in force: the QP's own, else the daemon's (mrcd.ack_coalesce).
            "ack_coalesce": attrs.ack_coalesce or self.node.cfg.ack_coalesce,
            "hint": hint,
        }

    def query_qp(self, args: dict[str, Any]) -> dict[str, Any]:
        rec = self._qp(args)
        qp = self.node.qp(rec.qpn)
        connected = qp.remote_host >= 0
        return {
            "qpn": rec.qpn,
            "state": qp.state.value,
            "attr": self._attr_json(qp.attrs, rec.hint),
            "cap": {"max_send_wr": rec.max_send_wr, "max_recv_wr": rec.max_recv_wr},
            "sq_sig_all": rec.sq_sig_all,
            "remote_host": qp.remote_host if connected else None,
            "remote_qpn": qp.remote_qpn if connected else None,
            "failure": qp.failure,
            "outstanding_sends": len(rec.sends),
            "posted_recvs": len(rec.recvs),
            "psn": qp.psn,
            "extensions": None if qp.conn is None else not qp.conn.plain,
        }

    def destroy_qp(self, args: dict[str, Any]) -> dict[str, Any]:
        rec = self._qp(args)
        self.drop(rec)
        return {}

    def drop(self, rec: _Qp) -> None:
        rec.destroyed = True  # verbs: a destroyed QP's outstanding requests are discarded
        self.node.destroy_qp(rec.qpn, reason="destroyed by the application")
        del self.qps[rec.qpn]
        for cq in {rec.send_cq, rec.recv_cq}:
            cq.users -= 1

    # Connection setup -------------------------------------------------------------------------
    async def connect(self, args: dict[str, Any]) -> dict[str, Any]:
        rec = self._qp(args)
        remote = a.get_int(args, "remote_host", 0, self.node.fabric.hosts - 1)
        service = a.get_int(args, "service", 0, U32)
        private = a.get_hex(args, "private_data", MAX_PRIVATE_DATA)
        timeout = a.get_float(args, "timeout", 0.0, MAX_CONNECT_TIMEOUT, CONNECT_TIMEOUT)
        if remote == self.node.host:
            raise invalid(f"remote_host {remote} is this host")
        self._require_reset(rec)
        try:
            peer_data = await self.s.server.connector(rec.qpn, remote, service, private, timeout)
        except LocalError as exc:  # rejected, unreachable, no listener: the connect failed
            raise ApiError(errno.ECONNREFUSED, str(exc)) from None
        self._connected(rec)
        return {"private_data": bytes(peer_data).hex()}

    def connect_manual(self, args: dict[str, Any]) -> dict[str, Any]:
        """RESET -> RTS out of band (``ibv_modify_qp``): the peer's host, QPN and first PSN,
        and an AES-GCM key if any, exchanged by the application (a peer without mrcd)."""
        rec = self._qp(args)
        remote = a.get_int(args, "remote_host", 0, self.node.fabric.hosts - 1)
        remote_qpn = a.get_int(args, "remote_qpn", 1, (1 << 24) - 1)
        remote_psn = a.get_int(args, "remote_psn", 0, (1 << 24) - 1)
        key = a.get_hex(args, "key", 32) or None
        extensions = a.get_bool(args, "extensions", False)
        if remote == self.node.host:
            raise invalid(f"remote_host {remote} is this host")
        if key is not None and len(key) not in (16, 32):
            raise invalid(f"key: AES-GCM takes 16 or 32 bytes, got {len(key)}")
        self._require_reset(rec)
        try:
            self.node.connect_manual(rec.qpn, remote, remote_qpn, remote_psn, key, extensions)
        except LocalError as exc:
            raise ApiError(errno.EINVAL, str(exc)) from None
        self._connected(rec)
        return {"psn": self.node.qp(rec.qpn).psn}

    def _require_reset(self, rec: _Qp) -> None:
        state = self.node.qp(rec.qpn).state
        if state is not QpState.RESET:
            raise ApiError(
                errno.EISCONN if state is QpState.RTS else errno.EINVAL,
                f"QP {qpn_text(rec.qpn)} is {state.value}, not reset",
            )

    def _connected(self, rec: _Qp) -> None:
        if not rec.destroyed and rec.qpn in self.node.qps:
            self.s.server.controller.profiles.apply_to_qp(self.node, rec.qpn)

    def listen(self, args: dict[str, Any]) -> dict[str, Any]:
        service = a.get_int(args, "service", 0, U32)
        self.node.listen(self.s.context(), service, self._on_connect_request)
        return {}

    async def _on_connect_request(self, req: IncomingConnect) -> None:
        if self.s.closed:
            return
        self.pending[req.request_id] = req
        self.s.event(
            {
                "type": "connect_request",
                "request_id": req.request_id,
                "remote_host": req.remote_host,
                "remote_qpn": req.remote_qpn,
                "service": req.service,
                "private_data": req.private_data.hex(),
            }
        )

    async def accept(self, args: dict[str, Any]) -> dict[str, Any]:
        request_id = a.get_int(args, "request_id", 0, U64)
        rec = self._qp(args)
        private = a.get_hex(args, "private_data", MAX_PRIVATE_DATA)
        if request_id not in self.pending:
            raise ApiError(errno.ENOENT, f"no pending connection request {request_id}")
        self._require_reset(rec)
        del self.pending[request_id]
        accepted = self.node.accept(request_id, rec.qpn, private)
        try:
            # shield: a timeout here must not cancel the node's future under its feet.
            failure = await asyncio.wait_for(
                asyncio.shield(accepted.connected), ACCEPT_READY_TIMEOUT
            )
        except TimeoutError:
            raise ApiError(
                errno.ETIMEDOUT,
                f"QP {qpn_text(rec.qpn)} accepted but not connected after {ACCEPT_READY_TIMEOUT} s",
            ) from None
        qp = self.node.qps.get(rec.qpn)
        if failure is None and (qp is None or qp.state is not QpState.RTS):
            failure = "gone" if qp is None else (qp.failure or qp.state.value)
        if failure is not None:
            raise ApiError(
                errno.ECONNABORTED, f"QP {qpn_text(rec.qpn)} failed while connecting: {failure}"
            )
        self._connected(rec)
        return {}

    def reject(self, args: dict[str, Any]) -> dict[str, Any]:
        request_id = a.get_int(args, "request_id", 0, U64)
        if self.pending.pop(request_id, None) is None:
            raise ApiError(errno.ENOENT, f"no pending connection request {request_id}")
        self.node.reject(request_id)
        return {}

    # Posting --------------------------------------------------------------------------------
    def _post_qp(self, qpn: int) -> _Qp | ApiError:
        rec = self.qps.get(qpn)
        if rec is None:
            return ApiError(errno.ENOENT, f"no QP {qpn_text(qpn)} in this context")
        return rec

    def post_send(self, body: bytes) -> None:
        req_id, qpn, wrs = wire.decode_post_send(body)
        rec = self._post_qp(qpn)
        if isinstance(rec, ApiError):
            self.s.io.write(wire.encode_post_reply(req_id, rec.errno, 0, rec.message))
            return
        for index, wr in enumerate(wrs):
            err = self._post_one(rec, wr)
            if err is not None:
                self.s.io.write(wire.encode_post_reply(req_id, err.errno, index, err.message))
                return
        self.s.io.write(wire.encode_post_reply(req_id, 0, 0, ""))

    def _post_one(self, rec: _Qp, wr: wire.SendWrRecord) -> ApiError | None:
        qp = self.node.qps.get(rec.qpn)
        if qp is None or qp.state is not QpState.RTS:
            state = "gone" if qp is None else qp.state.value
            return ApiError(errno.EINVAL, f"QP {qpn_text(rec.qpn)} is not connected ({state})")
        if wr.opcode not in SUPPORTED_OPCODES:
            name = _OPCODE_NAMES.get(wr.opcode, str(wr.opcode))
            return ApiError(
                errno.EOPNOTSUPP,
                f"unsupported opcode {name}: MRC carries only RDMA_WRITE and RDMA_WRITE_WITH_IMM",
            )
        region = self.s.regions.get(wr.lkey)
        if region is None:
            return ApiError(errno.EINVAL, f"unknown lkey {wr.lkey:#x}")
        if not 0 < wr.length <= MAX_LENGTH:
            return ApiError(errno.EINVAL, f"length {wr.length} must be in 1..{MAX_LENGTH}")
        if wr.offset + wr.length > region.region.length:
            return ApiError(
                errno.EINVAL,
                f"local range {wr.offset}+{wr.length} leaves lkey {wr.lkey:#x} "
                f"({region.region.length} bytes)",
            )
        if len(rec.sends) >= rec.max_send_wr:
            return ApiError(errno.ENOMEM, f"send queue full ({rec.max_send_wr} outstanding)")
        imm = wr.opcode == Opcode.RDMA_WRITE_WITH_IMM
        if imm and rec.wimm >= qp.attrs.max_wimm:
            return ApiError(
                errno.ENOMEM, f"max_wimm ({qp.attrs.max_wimm}) writes with immediate outstanding"
            )
        self._wr_seq += 1
        seq = self._wr_seq
        src = region.view[wr.offset : wr.offset + wr.length]
        try:
            self.node.post_write(
                rec.qpn, seq, src, wr.remote_addr, wr.rkey, wr.imm if imm else None, wr.wr_id,
                local_va=region.region.va + wr.offset,
            )  # fmt: skip
        except Exception as exc:
            src.release()
            return a.to_api_error(exc, "post_send")
        signaled = rec.sq_sig_all or bool(wr.flags & wire.WR_SIGNALED)
        rec.sends[seq] = _Send(wr.wr_id, signaled, imm)
        rec.wimm += imm
        return None

    def post_recv(self, body: bytes) -> None:
        req_id, qpn, wr_ids = wire.decode_post_recv(body)
        rec = self._post_qp(qpn)
        if isinstance(rec, ApiError):
            self.s.io.write(wire.encode_post_reply(req_id, rec.errno, 0, rec.message))
            return
        qp = self.node.qps.get(qpn)
        if qp is None or qp.state is QpState.ERROR:
            self.s.io.write(
                wire.encode_post_reply(
                    req_id, errno.EINVAL, 0, f"QP {qpn_text(qpn)} is in the error state"
                )
            )
            return
        room = rec.max_recv_wr - len(rec.recvs)
        rec.recvs.extend(wr_ids[: max(room, 0)])
        if len(wr_ids) > room:
            self.s.io.write(
                wire.encode_post_reply(
                    req_id,
                    errno.ENOMEM,
                    max(room, 0),
                    f"receive queue full ({rec.max_recv_wr} posted)",
                )
            )
            return
        self.s.io.write(wire.encode_post_reply(req_id, 0, 0, ""))

    # Events from the node ---------------------------------------------------------------------
    def on_node_event(self, qpn: int, event: ev.Event) -> None:
        rec = self.qps.get(qpn)
        if rec is None or rec.destroyed or self.s.closed:
            return
        if isinstance(event, ev.SendCompleted):
            send = rec.sends.pop(event.wr_id, None)
            if send is None:
                return
            rec.wimm -= send.imm
            status = _STATUS[event.status]
            if send.signaled or status is not WcStatus.SUCCESS:
                self.s.complete(
                    rec.send_cq, qpn, send.wr_id, status, WcOpcode.RDMA_WRITE, event.byte_len, None
                )
        elif isinstance(event, ev.WriteImmReceived):
            if rec.recvs:
                self.s.complete(
                    rec.recv_cq,
                    qpn,
                    rec.recvs.popleft(),
                    WcStatus.SUCCESS,
                    WcOpcode.RECV_RDMA_WITH_IMM,
                    event.byte_len,
                    event.imm,
                )
            else:
                rec.recv_underflows += 1
                self.s.async_event(
                    AsyncEventType.RECV_QUEUE_EMPTY,
                    qpn=qpn,
                    reason=f"write with immediate {event.imm:#x} ({event.byte_len} bytes placed) "
                    "found no posted receive: its completion is lost",
                )
        elif isinstance(event, ev.ConnectionFailed):
            while rec.recvs:
                self.s.complete(
                    rec.recv_cq,
                    qpn,
                    rec.recvs.popleft(),
                    WcStatus.WR_FLUSH_ERR,
                    WcOpcode.RECV_RDMA_WITH_IMM,
                    0,
                    None,
                )
            self.s.async_event(AsyncEventType.QP_FATAL, qpn=qpn, reason=event.reason)
        elif (
            isinstance(event, ev.PortStateChanged)
            and not event.remote
            and self._port_up[event.port] != event.up
        ):
            self._port_up[event.port] = event.up
            port_event = AsyncEventType.PORT_ACTIVE if event.up else AsyncEventType.PORT_ERR
            self.s.async_event(port_event, port=event.port, reason="")


def _api_exp(exp_cnt: int) -> int:
    return EXP_CNT_INFINITE if exp_cnt >= INFINITE_RETRIES else exp_cnt
