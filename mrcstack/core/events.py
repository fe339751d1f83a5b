"""Events the core hands to its adapter: frozen dataclasses, drained with ``next_event()``."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from mrcstack.core.reasons import EvReason


class WcStatus(enum.Enum):
    """Work-completion status (the verbs names, shortened)."""

    SUCCESS = "success"
    REMOTE_ACCESS_ERROR = "remote_access_error"  # the peer rejected the rkey/range
    REMOTE_INVALID_REQUEST = "remote_invalid_request"  # the peer found the write malformed
    RETRY_EXCEEDED = "retry_exceeded"  # retries exhausted: the connection failed
    FLUSHED = "flushed"  # the connection failed before this work request finished


class EvState(enum.Enum):
    """Per-EV health (OCP MRC names; SKIP is MRC's short-lived congestion avoidance)."""

    GOOD = "good"
    SKIP = "skip"
    ASSUMED_BAD = "assumed_bad"
    DENIED = "denied"
    UNKNOWN = "unknown"  # not in use: a backup EV, or its plane is down


@dataclass(frozen=True, slots=True)
class SendCompleted:
    """A posted write finished: all its packets acknowledged (or it failed)."""

    wr_id: int
    status: WcStatus
    byte_len: int


@dataclass(frozen=True, slots=True)
class WriteImmReceived:
    """A write-with-immediate fully placed, and so is every earlier write on the QP."""

    imm: int
    byte_len: int  # that write's own length (as verbs' byte_len), not earlier writes'


@dataclass(frozen=True, slots=True)
class EvStateChanged:
    """An EV changed state (the OCP EV event: profile, EV, drop count, new state)."""

    profile_id: int
    ev: int
    port: int
    drop_count: int
    old: EvState
    new: EvState
    reason: EvReason


@dataclass(frozen=True, slots=True)
class PortStateChanged:
    """A plane went down or came back, seen locally or from the peer's port-state bitmap."""

    port: int
    up: bool
    remote: bool


@dataclass(frozen=True, slots=True)
class ConnectionFailed:
    """The connection entered the error state; every pending work request is flushed.

    ``wr_id``: the work request whose error failed it (None when no one write did: the
    retry budget ran out, the peer went away, or this end refused the peer's write)."""

    reason: str
    wr_id: int | None = None


Event = SendCompleted | WriteImmReceived | EvStateChanged | PortStateChanged | ConnectionFailed
