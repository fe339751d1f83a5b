"""One API client inside mrcd: its context, regions, completion channels, CQs and QPs.

The session dispatches the client's frames (JSON requests, packed posts) to handlers, owns
the client's shared-memory mappings, and delivers completions in batches, once per loop
iteration, followed by a CQ event on the completion channel of every armed CQ that got one.
QP work lives in :mod:`mrcstack.daemons.mrcd.appapi.qp`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
import struct
from collections.abc import Callable
from typing import Any

from mrcstack.api import shm, wire
from mrcstack.api.errors import ApiError, invalid
from mrcstack.api.limits import U16, U32
from mrcstack.api.types import Access, AsyncEventType, DeviceCap, WcOpcode, WcStatus
from mrcstack.core.memory import Access as CoreAccess
from mrcstack.daemons.mrcd import apiargs as a
from mrcstack.daemons.mrcd.appapi.clientio import ClientIO, Peer
from mrcstack.daemons.mrcd.appapi.qp import MAX_QPS, QpTable
from mrcstack.daemons.mrcd.appapi.views import Cq, Region, ServerView
from mrcstack.daemons.mrcd.node.qps import Context
from mrcstack.wire import AEAD_TAG_LEN, DATA_IMM_HDR_LEN

log = logging.getLogger("mrcd.api")

MAX_CQS = 4096
MAX_MRS = 4096
MAX_CHANNELS = 256
MAX_HINTS = 1024
MAX_CQE = 1 << 22
IPV6_UDP_HEADERS = 48
LOOPBACK_MTU = 65535


class Channel:
    """mrcd's end of a completion channel: SOCK_SEQPACKET, one ``(cq, seq)`` record per CQ
    event.  A full socket keeps the event and sends it (with the newest seq) when writable,
    so no armed CQ's event is ever lost."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket) -> None:
        self.loop = loop
        self.sock = sock
        self.fd = sock.fileno()
        self.waiting: dict[int, Cq] = {}

    def notify(self, cq: Cq) -> None:
        if self.waiting:
            self.waiting[cq.handle] = cq
            return
        try:
            self.sock.send(wire.CQ_EVENT.pack(cq.handle, cq.delivered))
        except (BlockingIOError, InterruptedError):
            self.waiting[cq.handle] = cq
            self.loop.add_writer(self.fd, self._on_writable)
        except OSError:
            pass  # the client closed its end: nobody is waiting for the event

    def _on_writable(self) -> None:
        for handle, cq in list(self.waiting.items()):
            try:
                self.sock.send(wire.CQ_EVENT.pack(handle, cq.delivered))
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.waiting.clear()
                break
            del self.waiting[handle]
        self.loop.remove_writer(self.fd)

    def close(self) -> None:
        if self.waiting:
            self.waiting.clear()
            self.loop.remove_writer(self.fd)
        self.sock.close()


class Session:
    """One client of the API socket."""

    def __init__(self, server: ServerView, peer: Peer, io: ClientIO) -> None:
        self.server = server
        self.node = server.node
        self.peer = peer
        self.io = io
        self.loop = server.node.loop
        self.ctx: Context | None = None
        self.regions: dict[int, Region] = {}
        self.cqs: dict[int, Cq] = {}
        self.channels: dict[int, Channel] = {}
        self.hints: dict[int, dict[str, int]] = {}
        self.tasks: set[asyncio.Task[None]] = set()
        self.closed = False
        self.qpt = QpTable(self)
        self._ids = 0
        self._wcs: list[bytes] = []
        self._touched: set[Cq] = set()
        self._flush_scheduled = False
        q = self.qpt
        self._handlers: dict[str, tuple[int, Callable[..., Any]]] = {
            "query_device": (0, self.query_device),
            "open_context": (0, self.open_context),
            "reg_mr": (1, self.reg_mr),
            "dereg_mr": (0, self.dereg_mr),
            "create_comp_channel": (1, self.create_comp_channel),
            "destroy_comp_channel": (0, self.destroy_comp_channel),
            "create_cq": (0, self.create_cq),
            "destroy_cq": (0, self.destroy_cq),
            "create_qp_hint": (0, self.create_qp_hint),
            "modify_qp_hint": (0, self.modify_qp_hint),
            "query_qp_hint": (0, self.query_qp_hint),
            "destroy_qp_hint": (0, self.destroy_qp_hint),
            "create_qp": (0, q.create_qp),
            "modify_qp": (0, q.modify_qp),
            "query_qp": (0, q.query_qp),
            "destroy_qp": (0, q.destroy_qp),
            "connect": (0, q.connect),
            "connect_manual": (0, q.connect_manual),
            "listen": (0, q.listen),
            "accept": (0, q.accept),
            "reject": (0, q.reject),
        }

    # Frames ---------------------------------------------------------------------------------
    def on_frame(self, kind: int, body: bytes) -> None:
        try:
            if kind == wire.Kind.REQUEST:
                self._request(body)
            elif kind == wire.Kind.POST_SEND:
                self.qpt.post_send(body)
            elif kind == wire.Kind.POST_RECV:
                self.qpt.post_recv(body)
            elif kind == wire.Kind.ARM_CQ:
                handle, _solicited = wire.ARM_CQ.unpack_from(body)
                cq = self.cqs.get(handle)
                if cq is not None and cq.channel is not None:
                    cq.armed = True
            else:
                self.io.close(f"protocol error: unexpected frame kind {kind}")
        except (ValueError, KeyError, TypeError, UnicodeDecodeError, struct.error) as exc:
            self.io.close(f"protocol error: {exc}")

    def _request(self, body: bytes) -> None:
        req_id, doc = wire.decode_json(body, with_id=True)
        op = doc.get("op")
        args = doc.get("args")
        nfds = doc.get("nfds", 0)
        if not isinstance(op, str) or not isinstance(args, dict) or not isinstance(nfds, int):
            raise ValueError("request needs op, args and nfds")
        fds = self.io.take_fds(nfds) if 0 <= nfds <= wire.MAX_FDS else None
        if fds is None:
            self.io.close(f"protocol error: {op} announced {nfds} descriptors it did not send")
            return
        try:
            result = self._call(op, args, fds)
        except Exception as exc:
            self.io.write(wire.reply_error(req_id, a.to_api_error(exc, op)))
            return
        if asyncio.iscoroutine(result):
            task = self.loop.create_task(self._finish(req_id, op, result))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        else:
            self.io.write(wire.reply_ok(req_id, result))

    def _call(self, op: str, args: dict[str, Any], fds: list[int]) -> Any:
        """Run a handler; it owns the descriptors once called (it closes or keeps them)."""
        entry = self._handlers.get(op)
        expected = 0 if entry is None else entry[0]
        if len(fds) != expected:
            for fd in fds:
                os.close(fd)
            raise invalid(f"{op} takes {expected} descriptor(s), got {len(fds)}")
        if op.startswith("ctl."):
            return self.server.controller.call(op, args, self.server.privileged(self.peer), self)
        if entry is None:
            raise ApiError(errno.EOPNOTSUPP, f"unknown operation {op!r}")
        return entry[1](args, *fds)

    async def _finish(self, req_id: int, op: str, coro: Any) -> None:
        try:
            result = await coro
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.io.write(wire.reply_error(req_id, a.to_api_error(exc, op)))
        else:
            self.io.write(wire.reply_ok(req_id, result))

    def context(self) -> Context:
        if self.ctx is None:
            raise invalid("no context: send open_context first")
        return self.ctx

    def _next(self) -> int:
        self._ids += 1
        return self._ids

    # Device and context ---------------------------------------------------------------------
    def max_mtu_payload(self) -> int:
        mtu = LOOPBACK_MTU if self.node.cfg.data_mode == "loopback" else self.node.fabric.mtu
        return min(65000, mtu - IPV6_UDP_HEADERS - DATA_IMM_HDR_LEN - AEAD_TAG_LEN)

    def query_device(self, args: dict[str, Any]) -> dict[str, Any]:
        node = self.node
        return {
            "protocol_version": 1,
            "max_wimm": U16,
            "max_wimm_dest": U16,
            "max_mpr": 0,
            "mpr_resolution": 0,
            "dynamic_mpr": False,
            "max_qp_hint": MAX_HINTS,
            "cap": int(DeviceCap.TRIM_NACK),
            "host": node.host,
            "host_name": node.cfg.host_name,
            "planes": node.fabric.planes,
            "max_mtu_payload": self.max_mtu_payload(),
            "max_qp": MAX_QPS,
            "max_cq": MAX_CQS,
            "max_mr": MAX_MRS,
            "max_mr_size": shm.MAX_REGION,
        }

    def open_context(self, args: dict[str, Any]) -> dict[str, Any]:
        if self.ctx is not None:
            raise ApiError(errno.EBUSY, "this connection already has a context")
        self.ctx = self.node.open_context()
        return {"context": self.ctx.ident}

    # Memory ---------------------------------------------------------------------------------
    def reg_mr(self, args: dict[str, Any], fd: int) -> dict[str, Any]:
        try:
            ctx = self.context()
            if len(self.regions) >= MAX_MRS:
                raise ApiError(errno.ENOMEM, f"at most {MAX_MRS} regions per context")
            length = a.get_int(args, "length", 1, shm.MAX_REGION)
            access = Access(
                a.get_int(args, "access", 0, int(Access.LOCAL_WRITE | Access.REMOTE_WRITE))
            )
            writable = bool(access & Access.REMOTE_WRITE)
            mapping = shm.map_shared(fd, length, writable)
            view = memoryview(mapping)
            core = CoreAccess.LOCAL_READ | (CoreAccess.REMOTE_WRITE if writable else 0)
            try:  # (data-path workers map the memfd too)
                region = self.node.register(ctx, view, CoreAccess(core), fd)
            except Exception:
                view.release()
                mapping.close()
                raise
        finally:
            os.close(fd)
        lkey = self._next()
        self.regions[lkey] = Region(lkey, region, mapping, view, access)
        return {
            "addr": region.va,
            "length": length,
            "lkey": lkey,
            "rkey": region.rkey,
            "access": int(access),
        }

    def dereg_mr(self, args: dict[str, Any]) -> dict[str, Any]:
        lkey = a.get_int(args, "lkey", 0, U32)
        entry = self.regions.pop(lkey, None)
        if entry is None:
            raise ApiError(errno.ENOENT, f"unknown lkey {lkey:#x}")
        self.node.deregister(self.context(), entry.region.rkey)
        _unmap(entry)
        return {}

    # Completion channels and CQs --------------------------------------------------------------
    def create_comp_channel(self, args: dict[str, Any], fd: int) -> dict[str, Any]:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
            raise invalid("completion channel descriptor is not a socket") from None
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_SEQPACKET:
            sock.close()
            raise invalid("completion channel must be a Unix SOCK_SEQPACKET socket")
        if len(self.channels) >= MAX_CHANNELS:
            sock.close()
            raise ApiError(errno.ENOMEM, f"at most {MAX_CHANNELS} completion channels")
        sock.setblocking(False)
        handle = self._next()
        self.channels[handle] = Channel(self.loop, sock)
        return {"channel": handle}

    def destroy_comp_channel(self, args: dict[str, Any]) -> dict[str, Any]:
        handle = a.get_int(args, "channel", 0, U32)
        if handle not in self.channels:
            raise ApiError(errno.ENOENT, f"unknown completion channel {handle}")
        if any(cq.channel == handle for cq in self.cqs.values()):
            raise ApiError(errno.EBUSY, f"completion channel {handle} still has CQs")
        self.channels.pop(handle).close()
        return {}

    def create_cq(self, args: dict[str, Any]) -> dict[str, Any]:
        self.context()
        if len(self.cqs) >= MAX_CQS:
            raise ApiError(errno.ENOMEM, f"at most {MAX_CQS} CQs per context")
        cqe = a.get_int(args, "cqe", 1, MAX_CQE)
        channel = a.get_opt_int(args, "channel", 0, U32)
        if channel is not None and channel not in self.channels:
            raise ApiError(errno.ENOENT, f"unknown completion channel {channel}")
        handle = self._next()
        self.cqs[handle] = Cq(handle, cqe, channel)
        return {"cq": handle}

    def cq(self, args: dict[str, Any], key: str) -> Cq:
        handle = a.get_int(args, key, 0, U32)
        cq = self.cqs.get(handle)
        if cq is None:
            raise ApiError(errno.ENOENT, f"{key}: unknown CQ {handle}")
        return cq

    def destroy_cq(self, args: dict[str, Any]) -> dict[str, Any]:
        cq = self.cq(args, "cq")
        if cq.users:
            raise ApiError(errno.EBUSY, f"CQ {cq.handle} is used by {cq.users} QP(s)")
        del self.cqs[cq.handle]
        self._touched.discard(cq)
        return {}

    # QP hints -------------------------------------------------------------------------------
    def _hint_values(self, args: dict[str, Any]) -> dict[str, int]:
        return {
            k: a.get_int(args, k, 1, U32, 1)
            for k in ("num_qps_per_peer", "num_send_peers", "num_remote_recv_peers")
        }

    def create_qp_hint(self, args: dict[str, Any]) -> dict[str, Any]:
        if len(self.hints) >= MAX_HINTS:
            raise ApiError(errno.ENOMEM, f"at most {MAX_HINTS} QP hints")
        handle = self._next()
        self.hints[handle] = self._hint_values(args)
        return {"hint": handle}

    def _hint(self, args: dict[str, Any]) -> int:
        handle = a.get_int(args, "hint", 0, U32)
        if handle not in self.hints:
            raise ApiError(errno.ENOENT, f"unknown QP hint {handle}")
        return handle

    def modify_qp_hint(self, args: dict[str, Any]) -> dict[str, Any]:
        self.hints[self._hint(args)] = self._hint_values(args)
        return {}

    def query_qp_hint(self, args: dict[str, Any]) -> dict[str, Any]:
        return dict(self.hints[self._hint(args)])

    def destroy_qp_hint(self, args: dict[str, Any]) -> dict[str, Any]:
        handle = self._hint(args)
        if any(q.hint == handle for q in self.qpt.qps.values()):
            raise ApiError(errno.EBUSY, f"QP hint {handle} is still used by a QP")
        del self.hints[handle]
        return {}

    def complete(
        self,
        cq: Cq,
        qpn: int,
        wr_id: int,
        status: WcStatus,
        opcode: WcOpcode,
        byte_len: int,
        imm: int | None,
    ) -> None:
        if cq.handle not in self.cqs:
            return
        flags = 0 if imm is None else wire.WC_HAS_IMM
        self._wcs.append(
            wire.WORK_COMPLETION.pack(
                cq.handle, qpn, wr_id, status, opcode, flags, 0, min(byte_len, U32), imm or 0
            )
        )
        cq.delivered = (cq.delivered + 1) & U32
        self._touched.add(cq)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Send queued completions, then a CQ event for every armed CQ that got one."""
        self._flush_scheduled = False
        wcs, self._wcs = self._wcs, []
        for start in range(0, len(wcs), wire.MAX_BATCH):
            self.io.write(wire.encode_completions(wcs[start : start + wire.MAX_BATCH]))
        touched, self._touched = self._touched, set()
        for cq in touched:
            if not cq.armed or cq.channel is None:
                continue
            channel = self.channels.get(cq.channel)
            if channel is not None:
                cq.armed = False
                channel.notify(cq)

    def async_event(
        self, kind: AsyncEventType, *, qpn: int | None = None, port: int | None = None, reason: str
    ) -> None:
        self.event(
            {"type": "async", "event": kind.value, "qpn": qpn, "port": port, "reason": reason}
        )

    def event(self, doc: dict[str, Any]) -> None:
        if self._wcs:
            self.flush()  # completions before the event that may explain them
        self.io.write(wire.event(doc))

    def push_ev_event(self, doc: dict[str, Any], limit: int) -> bool:
        """Controller EV events: False (dropped) while the client lags ``limit`` bytes."""
        if self.closed or self.io.backlog > limit:
            return False
        self.event(doc)
        return True

    # Teardown -------------------------------------------------------------------------------
    def on_close(self, reason: str) -> None:
        self._teardown(reason)

    def shutdown(self, reason: str) -> None:
        """mrcd is stopping: tell the client, then tear down."""
        if not self.closed:
            self.async_event(AsyncEventType.DEVICE_FATAL, reason=reason)
            self.io.close(reason)  # -> on_close -> _teardown

    def _teardown(self, reason: str) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.forget(self)
        self.server.controller.unsubscribe(self)
        for task in self.tasks:
            task.cancel()
        qps = len(self.qpt.qps)
        if self.ctx is not None:
            try:
                self.node.close_context(self.ctx)
            except Exception as exc:
                log.error(
                    "event=api_close_failed pid=%d error=%r", self.peer.pid, exc, exc_info=exc
                )
        for entry in self.regions.values():
            _unmap(entry)
        self.regions.clear()
        for channel in self.channels.values():
            channel.close()
        self.channels.clear()
        self.qpt.qps.clear()
        level = (
            logging.INFO
            if qps or reason.startswith(("protocol", "client stopped"))
            else logging.DEBUG
        )
        log.log(
            level,
            "event=api_client_closed pid=%d uid=%d qps=%d reason=%r",
            self.peer.pid,
            self.peer.uid,
            qps,
            reason,
        )


def _unmap(entry: Region) -> None:
    """Unmap a region once nothing in mrcd refers to its pages any more."""
    try:
        entry.region.buffer.release()
        entry.view.release()
        entry.mapping.close()
    except BufferError:
        pass  # a retired connection still holds a slice: the mapping goes with it
