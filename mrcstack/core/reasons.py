"""The reasons the core reports: why a packet was resent, why an EV changed state, why an
input was dropped.  Each set is defined here once, as a ``StrEnum`` whose values are the
text that reaches logs, events and metric labels (``ConnectionStats`` keys its counters by
them); adapters derive their label sets from these enums instead of retyping the words.
"""

from __future__ import annotations

import enum

from mrcstack.wire.packets import NackReason


class RetxReason(enum.StrEnum):
    """Why a packet was declared lost and resent (``ConnectionStats.retransmissions``)."""

    TIMEOUT = "timeout"  # its retransmission timeout expired
    NACK = "nack"  # the receiver asked for it again (or, go-back-N, for everything after)
    TRIM = "trim"  # a switch trimmed it: the header arrived, the payload did not
    SACK = "sack"  # a later packet on the same EV was acknowledged first (paths keep order)
    RACK = "rack"  # time-based detection (RFC 8985): later packets of its plane arrived
    TLP = "tlp"  # tail-loss probe: no acknowledgement for two smoothed RTTs
    PORT = "port"  # its plane went down, here or at the peer


class EvReason(enum.StrEnum):
    """Why an EV changed state: the ``reason`` of an ``EvStateChanged`` event."""

    ECN = "ecn"  # an ACK echoed a CE mark: skipped a while
    TRIM = "trim"  # a trim NACK: skipped a while
    SKIP_ONCE = "skip_once"  # the receiver's SACK said m = SKIP_ONCE
    LOSSY = "lossy"  # a loss on the path with no backup to swap in: skipped, not demoted
    SKIP_EXPIRED = "skip_expired"
    SACK_LOSS = "sack_loss"  # a later packet on the EV was acknowledged first
    RACK_LOSS = "rack_loss"  # time-detected losses in a row with no reply on the EV
    RTO = "rto"  # a retransmission timeout on the EV
    ALWAYS_SKIP = "always_skip"  # the receiver's SACK said m = ALWAYS_SKIP
    PROBES_OK = "probes_ok"  # enough EV probes came back
    PROBES_LOST = "probes_lost"  # enough EV probes were lost
    LATE_ARRIVAL = "late_arrival"  # the packet whose loss demoted it arrived after all
    BACKUP = "backup"  # a backup swapped in for an EV that left the set
    DENYLIST = "denylist"  # the configuration's denylist, at connection start
    CONTROLLER = "controller"  # the controller's operations (deny, allow, replace)


class RejectReason(enum.StrEnum):
    """Why the core dropped an input (``ConnectionStats.rejected``, beside the lower-case
    names of ``DecodeReason`` for datagrams that did not decode)."""

    PORT = "port"  # it names a NIC port the connection does not have
    QPN = "qpn"  # not for this QP
    REPLAY = "replay"  # its transmission number was seen before (AES-GCM replay window)
    RKEY = "rkey"  # a write outside every registered region (answered with a NACK)
    PSN_WINDOW = "psn_window"  # beyond the receive window (answered with a NACK)
    INVALID_REQUEST = "invalid_request"  # a write that cannot be what its sender meant
    REFUSED = "refused"  # at or after a refused write: the QP places nothing more there
    NO_REVERSE_PATH = "no_reverse_path"  # feedback with no usable EV to carry it
    UNPLACED = "unplaced"  # a spec peer's middle packet, no room to wait for its write's place


#: ``ConnectionStats.nacks_received`` keys: each NACK reason's lower-case name (a reason
#: value the peer sent that is not listed counts as ``other``).
NACK_NAMES: dict[int, str] = {r.value: r.name.lower() for r in NackReason}
