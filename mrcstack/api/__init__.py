"""mrcstack's application and controller APIs: mrc.h and mrc_ctl.h, in Python.

Programs talk to their local mrcd over a Unix socket::

    from mrcstack.api import Device, QpAttr, WriteWr

    with Device.open("/run/mrcstack/mrcd-h0.sock") as dev:
        ctx = dev.create_context()
        mr = ctx.reg_mr(1 << 20)            # shared memory: mrcd reads and writes it in place
        cq = ctx.create_cq()
        qp = ctx.create_qp(cq, attr=QpAttr(timeout=20e-3))  # min RTO (default: mrcd's)
        peer = qp.connect(remote_host=3, service=7)
        qp.post_send(WriteWr(1, (mr, 0, 4096), remote_addr=..., rkey=..., imm=42))
        [wc] = cq.poll()

See ``docs/api.md`` for how every call maps to mrc.h / mrc_ctl.h.

- :mod:`.verbs`: devices, contexts, regions, QPs (``Device.open`` is the entry)
- :mod:`.completion`: completion queues and channels (a pollable fd)
- :mod:`.ctl`: the controller API (``Controller``: ports, EV and CC profiles, probes)
- :mod:`.requests`, :mod:`.types`: work requests, regions, attributes, statuses, events
- :mod:`.client`, :mod:`.wire`, :mod:`.shm`: the Unix socket to mrcd, its messages, and the
  shared memory regions travel in
- :mod:`.errors`, :mod:`.limits`: ``ApiError`` (with an errno) and the API's limits
"""

from mrcstack.api.completion import CompletionChannel, CompletionQueue
from mrcstack.api.ctl import Controller
from mrcstack.api.errors import ApiError
from mrcstack.api.requests import MemoryRegion, SendWr, Sge, WriteWr
from mrcstack.api.types import (
    Access,
    AsyncEvent,
    AsyncEventType,
    ConnectRequest,
    DeviceAttr,
    DeviceCap,
    Opcode,
    QpAttr,
    QpCap,
    QpHint,
    QpInfo,
    QpState,
    WcOpcode,
    WcStatus,
    WorkCompletion,
)
from mrcstack.api.verbs import (
    Context,
    Device,
    Listener,
    QueuePair,
    default_socket_path,
)

__all__ = [
    "Access",
    "ApiError",
    "AsyncEvent",
    "AsyncEventType",
    "CompletionChannel",
    "CompletionQueue",
    "ConnectRequest",
    "Context",
    "Controller",
    "Device",
    "DeviceAttr",
    "DeviceCap",
    "Listener",
    "MemoryRegion",
    "Opcode",
    "QpAttr",
    "QpCap",
    "QpHint",
    "QpInfo",
    "QpState",
    "QueuePair",
    "SendWr",
    "Sge",
    "WcOpcode",
    "WcStatus",
    "WorkCompletion",
    "WriteWr",
    "default_socket_path",
]
