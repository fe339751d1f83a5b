"""EV profiles, the per-connection EV set, and per-EV path health.

Vocabulary of the OCP MRC controller API: an *EV profile* is explicit (a list of EVs, each a
value plus a NIC port) or generated from field definitions; ``ev_count`` EVs are used at a
time (split equally across planes, fewer when a plane lists fewer), the rest are backups;
a quarter of each plane's EVs always stay back as its backup set (see :func:`in_use_for`);
``ev_min_active`` bounds demotion; any subset may be DENIED.  Every state change goes
through :data:`TRANSITIONS`, the single table of the EV state machine, and is reported as
an :class:`EvStateChanged` event.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Final

from mrcstack.core.events import EvState, EvStateChanged
from mrcstack.core.reasons import EvReason
from mrcstack.errors import ConfigError, LocalError

GOOD, SKIP, BAD, DENIED, UNKNOWN = (
    EvState.GOOD,
    EvState.SKIP,
    EvState.ASSUMED_BAD,
    EvState.DENIED,
    EvState.UNKNOWN,
)


class EvSignal(enum.StrEnum):
    """What the state machine is told about an EV: the inputs of :data:`TRANSITIONS`
    (their values are the names ``docs/ev-states.md`` shows)."""

    ECN = "ecn"  # an ACK echoed a CE mark
    TRIM = "trim"  # a trim NACK (TRIMMED; the receiver's own last hop does not count)
    SKIP_ONCE = "skip_once"  # the receiver's SACK said m = SKIP_ONCE
    SKIP_EXPIRED = "skip_expired"
    LOSS = "loss"  # a silent loss on the path
    LOSSY = "lossy"  # a loss on a path the plane cannot replace
    TIMEOUT = "timeout"  # a retransmission timeout
    ALWAYS_SKIP = "always_skip"  # the receiver's SACK said m = ALWAYS_SKIP
    PROBE_LOST = "probe_lost"
    PROBE_OK = "probe_ok"
    ACTIVATE = "activate"
    RETIRE = "retire"
    DENY = "deny"
    ALLOW = "allow"
    REPLACE = "replace"


#: The EV state machine: (state, signal) -> new state.  Signals not listed for a state are
#: ignored.  UNKNOWN is a backup EV that is not in use; ``activate`` puts it in use.
TRANSITIONS: Final[dict[tuple[EvState, EvSignal], EvState]] = {
    (GOOD, EvSignal.ECN): SKIP,  # a mark means this path is busier than the others
    (GOOD, EvSignal.TRIM): SKIP,  # a trim means congestion on this path, not breakage
    (GOOD, EvSignal.SKIP_ONCE): SKIP,  # the receiver's SACK said m = SKIP_ONCE
    (SKIP, EvSignal.SKIP_ONCE): SKIP,
    (SKIP, EvSignal.ECN): SKIP,  # extends the skip
    (SKIP, EvSignal.TRIM): SKIP,
    (SKIP, EvSignal.SKIP_EXPIRED): GOOD,
    (GOOD, EvSignal.LOSS): BAD,  # a silent (non-trim) loss: stop using the path at once
    (SKIP, EvSignal.LOSS): BAD,
    (GOOD, EvSignal.LOSSY): SKIP,  # a loss, but no backup to swap in: avoid it for a while
    (SKIP, EvSignal.LOSSY): SKIP,
    (GOOD, EvSignal.TIMEOUT): BAD,
    (SKIP, EvSignal.TIMEOUT): BAD,
    (GOOD, EvSignal.ALWAYS_SKIP): BAD,  # the receiver's SACK said m = ALWAYS_SKIP
    (SKIP, EvSignal.ALWAYS_SKIP): BAD,
    (GOOD, EvSignal.PROBE_LOST): BAD,  # the only evidence an ACK-only endpoint has
    (SKIP, EvSignal.PROBE_LOST): BAD,
    (BAD, EvSignal.PROBE_OK): GOOD,  # enough consecutive probe replies: resurrect
    (UNKNOWN, EvSignal.ACTIVATE): GOOD,  # a backup swapped in
    (BAD, EvSignal.RETIRE): UNKNOWN,  # resurrected but not needed: back to the backup pool
    (GOOD, EvSignal.DENY): DENIED,
    (SKIP, EvSignal.DENY): DENIED,
    (BAD, EvSignal.DENY): DENIED,
    (UNKNOWN, EvSignal.DENY): DENIED,
    (DENIED, EvSignal.ALLOW): BAD,  # an allowed EV must prove itself with probes first
    (GOOD, EvSignal.REPLACE): UNKNOWN,  # the controller put another EV in its place: it leaves
    (SKIP, EvSignal.REPLACE): UNKNOWN,
    (BAD, EvSignal.REPLACE): UNKNOWN,
    (DENIED, EvSignal.REPLACE): UNKNOWN,
}

USABLE: Final = (GOOD, SKIP)
#: Signals that condemn an EV (count a drop; bounded by ev_min_active).
DEMOTIONS: Final = frozenset(
    {EvSignal.LOSS, EvSignal.TIMEOUT, EvSignal.PROBE_LOST, EvSignal.ALWAYS_SKIP}
)
#: Signals that skip an EV a while (:meth:`EvTable.skip`), with the reason each reports.
SKIP_REASONS: Final[dict[EvSignal, EvReason]] = {
    EvSignal.ECN: EvReason.ECN,
    EvSignal.TRIM: EvReason.TRIM,
    EvSignal.SKIP_ONCE: EvReason.SKIP_ONCE,
    EvSignal.LOSSY: EvReason.LOSSY,
}
#: Congestion signals: one for an EV already skipped only extends its skip (no change).
_CONGESTION: Final = frozenset({EvSignal.ECN, EvSignal.TRIM, EvSignal.SKIP_ONCE})
EV_MAX: Final = 0xFFFFFFFF  # EVs travel in a 32-bit field
#: One in this many of a plane's EVs is held back as a backup (at least one per plane that
#: lists two or more), so an EV found bad is replaced from the same plane.
BACKUP_DIVISOR: Final = 4


def backups_for(listed: int) -> int:
    """How many of the ``listed`` EVs of a plane are kept back as its backup set: a quarter,
    at least one when there are two or more; none with one (nothing could replace it)."""
    return 0 if listed < 2 else max(1, listed // BACKUP_DIVISOR)


def in_use_for(listed: int, requested: int) -> int:
    """How many of a plane's ``listed`` EVs are in use at connection start when
    ``requested`` per plane (``ev_count // planes``) are asked for: as many as asked, but
    never the backup set :func:`backups_for` keeps back."""
    return min(requested, listed - backups_for(listed))


def listed_for(requested: int) -> int:
    """The fewest EVs a plane must list for ``requested`` to be in use and at least one to
    be a backup (a generated profile lists this many when the fabric has the paths)."""
    listed = requested + 1
    while in_use_for(listed, requested) < requested:
        listed += 1
    return listed


@dataclass(frozen=True, slots=True)
class EvEntry:
    """One EV of a profile: the path value and the (0-based) NIC port / plane it leaves on."""

    value: int
    port: int

    def __reduce__(self) -> tuple[type[EvEntry], tuple[object, ...]]:
        # What pickle and copy use: compiled by mypyc, a frozen dataclass cannot be
        # restored field by field (mrcd hands QPs to its data-path workers pickled).
        return (EvEntry, (self.value, self.port))


@dataclass(frozen=True, slots=True)
class EvStatus:
    """One EV of a connection's set as a controller sees it (OCP QUERY_EV_STATE)."""

    value: int
    port: int
    state: EvState
    in_use: bool  # sprayed on (GOOD/SKIP) or, if not, a backup or out of service
    drop_count: int

    def __reduce__(self) -> tuple[type[EvStatus], tuple[object, ...]]:
        # What pickle and copy use: compiled by mypyc, a frozen dataclass cannot be
        # restored field by field (mrcd hands QPs to its data-path workers pickled).
        return (EvStatus, (self.value, self.port, self.state, self.in_use, self.drop_count))


@dataclass(frozen=True, slots=True)
class EvField:
    """One field of a generated EV (OCP GEN mode): bits [offset, offset+width)."""

    name: str
    width: int
    min: int = 0
    max: int | None = None  # inclusive; default: all ones
    mask: int | None = None  # only values v with v & ~mask == 0 are generated

    def values(self) -> Iterable[int]:
        top = (1 << self.width) - 1 if self.max is None else self.max
        if not 0 < self.width <= 32 or not 0 <= self.min <= top < 1 << self.width:
            raise ValueError(f"EV field {self.name}: bad width/min/max")
        for v in range(self.min, top + 1):
            if self.mask is None or v & ~self.mask == 0:
                yield v

    def __reduce__(self) -> tuple[type[EvField], tuple[object, ...]]:
        # What pickle and copy use: compiled by mypyc, a frozen dataclass cannot be
        # restored field by field (mrcd hands QPs to its data-path workers pickled).
        return (EvField, (self.name, self.width, self.min, self.max, self.mask))


def generate_evs(fields: Sequence[EvField], port_field: str = "plane") -> tuple[EvEntry, ...]:
    """Every EV the fields describe, packed from bit 0 in field order (first field fastest).

    The port of each EV is the value of ``port_field``.  Order: the port field varies slowest,
    so a prefix of the result is not biased to one plane only when callers split by port.
    """
    names = [f.name for f in fields]
    if port_field not in names:
        raise ValueError(f"EV fields have no port field {port_field!r}")
    if sum(f.width for f in fields) > 32:
        raise ValueError("EV fields exceed 32 bits")
    offsets = list(itertools.accumulate((f.width for f in fields), initial=0))
    out = []
    for combo in itertools.product(*(list(f.values()) for f in reversed(fields))):
        values = list(reversed(combo))
        value = sum(v << off for v, off in zip(values, offsets, strict=False))
        out.append(EvEntry(value, values[names.index(port_field)]))
    return tuple(out)


def check_entries(entries: Sequence[EvEntry], planes: int) -> None:
    """An EV profile's entries are usable: at least one, 32-bit values, each listed once, on
    a port (plane) the connection has.  Raises :class:`ConfigError` naming the EV."""
    if not entries:
        raise ConfigError("an EV profile needs at least one EV")
    seen: set[int] = set()
    for e in entries:
        if not 0 <= e.value <= EV_MAX:
            raise ConfigError(f"EV {e.value:#x} is not a 32-bit value")
        if not 0 <= e.port < planes:
            raise ConfigError(f"EV {e.value:#x} names port {e.port}, the connection has {planes}")
        if e.value in seen:
            raise ConfigError(f"EV {e.value:#x} listed twice")
        seen.add(e.value)


class EvSlot:
    """Mutable per-EV record inside an :class:`EvTable` (never crosses the core boundary)."""

    __slots__ = (
        "condemned_seq",
        "congested_until",
        "drop_count",
        "entry",
        "first_sent",
        "in_use",
        "last_evidence",
        "probe_fails",
        "probe_oks",
        "silent_losses",
        "skip_until",
        "state",
    )

    def __init__(self, entry: EvEntry, state: EvState) -> None:
        self.entry = entry
        self.state = state
        self.in_use = False
        self.drop_count = 0
        self.skip_until = 0.0
        self.probe_oks = 0
        self.probe_fails = 0
        self.last_evidence = -1.0  # last time a reply proved this path works
        self.silent_losses = 0  # time-detected losses since the last reply on this EV
        self.first_sent = -1.0  # when this connection first sent on this EV
        # The packet whose silent loss (a timeout, RACK with no reply) demoted this EV: if
        # it arrives after all, the demotion was wrong and is undone.
        self.condemned_seq = -1
        # Packets sent on this path before this time met congestion (a trim or an ECN
        # mark came back): RACK leaves them to same-path evidence and the RTO.
        self.congested_until = -1.0


class EvTable:
    """The EV set of one sending direction of a connection, with its backups.

    Spraying rotates over the up planes, then over the usable in-use EVs of the plane, so
    planes stay exactly equally loaded whatever their number of healthy EVs.
    """

    def __init__(
        self,
        entries: Sequence[EvEntry],
        planes: int,
        emit: Callable[[EvStateChanged], None],
        *,
        profile_id: int = 0,
        ev_count: int = 128,
        ev_min_active: int = 1,
        denied: Iterable[int] = (),
    ) -> None:
        check_entries(entries, planes)
        if ev_count < 1 or ev_min_active < 0:
            raise ConfigError("ev_count must be >= 1 and ev_min_active >= 0")
        self.planes = planes
        self.profile_id = profile_id
        self.ev_min_active = ev_min_active
        self._emit = emit
        self.next_skip_expiry = math.inf
        self.port_up = [True] * planes
        self.remote_port_up = [True] * planes
        self._plane_rr = 0
        self._ev_rr = [0] * planes
        self._in_use: list[list[EvSlot]] = [[] for _ in range(planes)]
        self.up_planes: list[int] = []
        self.slots: dict[int, EvSlot] = {}
        self.by_plane: list[list[EvSlot]] = [[] for _ in range(planes)]
        for e in entries:
            slot = EvSlot(e, UNKNOWN)
            self.slots[e.value] = slot
            self.by_plane[e.port].append(slot)
        requested = max(1, ev_count // planes)
        #: Per plane, how many EVs are in use at a time (the rest are its backups).
        self.in_use_target = [in_use_for(len(p), requested) for p in self.by_plane]
        for value in denied:
            self.apply(value, EvSignal.DENY, EvReason.DENYLIST)
        for port, plane_slots in enumerate(self.by_plane):
            for slot in plane_slots:
                if self._in_use_count(port) >= self.in_use_target[port]:
                    break
                if slot.state is UNKNOWN:
                    slot.in_use = True  # the initial set starts GOOD without an event
                    slot.state = GOOD
        self._refresh_in_use()

    # State changes --------------------------------------------------------------------
    def apply(
        self,
        value: int,
        signal: EvSignal,
        reason: EvReason,
        now: float = 0.0,
        *,
        skip_until: float | None = None,
    ) -> bool:
        """Feed a signal for an EV through the table; return True if its state changed.

        ``skip_until`` goes with a ``loss`` seen on the path itself (a later packet on the
        EV arrived, so its path still delivers): when the EV is in use and its plane has no
        backup to swap in, it is skipped until then (signal ``lossy``) instead of demoted.
        Demoting would shrink the plane's spray set until probes bring the path back, and
        under random loss every path of the plane would go.  A path that went silent (RACK's
        losses with no reply on it, an RTO, lost probes) is demoted all the same.

        Raises :class:`LocalError` for a signal or reason that is not an :class:`EvSignal`
        or :class:`EvReason` (a bare string would never match the table).
        """
        _check_signal(signal, reason)
        slot = self.slots.get(value)
        if slot is None:
            return False
        port = slot.entry.port
        if signal is EvSignal.PROBE_OK and self._in_use_count(port) >= self.in_use_target[port]:
            signal = EvSignal.RETIRE  # healthy again, but the plane has its EVs: keep as backup
        new = TRANSITIONS.get((slot.state, signal))
        if new is None:
            return False
        if signal in DEMOTIONS:
            slot.drop_count += 1
            if slot.in_use and not self._has_backup(port):
                if signal is EvSignal.LOSS and skip_until is not None:
                    was = slot.state
                    self.skip(value, skip_until, EvSignal.LOSSY)
                    return slot.state is not was
                if self.good_count() - 1 < self.ev_min_active:
                    return False  # ev_min_active: never demote below this many good EVs
        if signal in _CONGESTION and new is SKIP and slot.state is SKIP:
            return False  # the caller extends skip_until; no state change
        self._set(slot, new, reason)
        if new in (BAD, DENIED) and slot.in_use:
            slot.in_use = False
            slot.probe_oks = slot.probe_fails = 0
            self._replace(slot.entry.port)
        elif new is GOOD and not slot.in_use:
            slot.in_use = True
        self._refresh_in_use()
        return True

    def replace(self, old: int, new: EvEntry, reason: EvReason) -> None:
        """OCP REPLACE_EV: ``new`` takes the place of ``old`` in the set, on the same plane.

        ``old`` leaves (its state goes to UNKNOWN, reported); ``new`` starts as a backup,
        and if ``old`` was in use a backup of the plane (``new`` itself when it comes first)
        takes over at once.  Raises :class:`LocalError` when ``old`` is not in the set,
        ``new`` already is, or ``new`` is on another plane (planes keep their EV counts),
        and for a reason that is not an :class:`EvReason`.
        """
        _check_signal(EvSignal.REPLACE, reason)
        slot = self.slots.get(old)
        if slot is None:
            raise LocalError(f"EV {old:#x} is not in this EV set")
        if new.value in self.slots:
            raise LocalError(f"EV {new.value:#x} is already in this EV set")
        port = slot.entry.port
        if new.port != port:
            raise LocalError(
                f"EV {new.value:#x} is on port {new.port}; the EV it replaces is on port {port}"
            )
        check_entries((new,), self.planes)
        was_in_use = slot.in_use
        if slot.state is not UNKNOWN:
            self._set(slot, TRANSITIONS[(slot.state, EvSignal.REPLACE)], reason)
        slot.in_use = False
        del self.slots[old]
        fresh = EvSlot(new, UNKNOWN)
        self.slots[new.value] = fresh
        plane = self.by_plane[port]
        plane[plane.index(slot)] = fresh
        if was_in_use:
            self._replace(port)
        self._refresh_in_use()

    def skip(self, value: int, until: float, signal: EvSignal) -> None:
        """ECN echo, trim or the receiver's SKIP_ONCE (or a loss the plane cannot replace):
        skip the EV until ``until`` (GOOD -> SKIP, SKIP extended).  Raises
        :class:`LocalError` for a signal that is not one of :data:`SKIP_REASONS`."""
        reason = SKIP_REASONS.get(signal)
        if reason is None:
            raise LocalError(f"{signal!r} is not a signal that skips an EV")
        slot = self.slots.get(value)
        if slot is None or slot.state not in USABLE:
            return
        slot.skip_until = max(slot.skip_until, until)
        self.next_skip_expiry = min(self.next_skip_expiry, slot.skip_until)
        if slot.state is GOOD:
            self._set(slot, TRANSITIONS[(GOOD, signal)], reason)

    def expire_skips(self, now: float) -> None:
        """Return SKIP EVs whose time is up to GOOD; cheap when nothing is due."""
        if now < self.next_skip_expiry:
            return
        nxt = math.inf
        for slot in self.slots.values():
            if slot.state is SKIP:
                if slot.skip_until <= now:
                    self._set(
                        slot, TRANSITIONS[(SKIP, EvSignal.SKIP_EXPIRED)], EvReason.SKIP_EXPIRED
                    )
                else:
                    nxt = min(nxt, slot.skip_until)
        self.next_skip_expiry = nxt

    def probe_result(
        self, value: int, ok: bool, now: float, needed_ok: int, needed_fail: int
    ) -> None:
        """Account one probe outcome; resurrect or demote after enough in a row."""
        slot = self.slots.get(value)
        if slot is None:
            return
        if ok:
            slot.last_evidence = now
            slot.probe_fails = 0
            slot.probe_oks += 1
            if slot.state is BAD and slot.probe_oks >= needed_ok:
                self.apply(value, EvSignal.PROBE_OK, EvReason.PROBES_OK, now)
        else:
            slot.probe_oks = 0
            slot.probe_fails += 1
            if slot.state in USABLE and slot.probe_fails >= needed_fail:
                self.apply(value, EvSignal.PROBE_LOST, EvReason.PROBES_LOST, now)

    def set_port(self, port: int, up: bool, *, remote: bool) -> bool:
        """A plane went down/up locally or at the peer; return True if usability changed."""
        flags = self.remote_port_up if remote else self.port_up
        if flags[port] == up:
            return False
        flags[port] = up
        self._refresh_in_use()
        return True

    def _set(self, slot: EvSlot, new: EvState, reason: EvReason) -> None:
        old = slot.state
        if old is new:
            return
        slot.state = new
        self._emit(
            EvStateChanged(
                self.profile_id,
                slot.entry.value,
                slot.entry.port,
                slot.drop_count,
                old,
                new,
                reason,
            )
        )

    def _activate(self, slot: EvSlot, reason: EvReason) -> None:
        slot.in_use = True
        self._set(slot, TRANSITIONS[(UNKNOWN, EvSignal.ACTIVATE)], reason)

    def _replace(self, port: int) -> None:
        """Swap in a backup EV from the same plane (MRC keeps planes equally provisioned)."""
        for slot in self.by_plane[port]:
            if self._in_use_count(port) >= self.in_use_target[port]:
                return
            if not slot.in_use and slot.state is UNKNOWN:
                self._activate(slot, EvReason.BACKUP)

    def _has_backup(self, port: int) -> bool:
        return any(not s.in_use and s.state is UNKNOWN for s in self.by_plane[port])

    def _in_use_count(self, port: int) -> int:
        return sum(1 for s in self.by_plane[port] if s.in_use)

    def _refresh_in_use(self) -> None:
        self._in_use = [
            [s for s in plane_slots if s.in_use and s.state in USABLE]
            for plane_slots in self.by_plane
        ]
        self.up_planes = [
            p
            for p in range(self.planes)
            if self.port_up[p] and self.remote_port_up[p] and self._in_use[p]
        ]

    # Queries --------------------------------------------------------------------------
    def good_count(self) -> int:
        """Usable in-use EVs on planes that are up (what ``ev_min_active`` bounds): EVs of a
        plane that is down carry nothing, so they do not count as active."""
        in_use = self._in_use
        return sum(len(in_use[p]) for p in self.up_planes)

    def state(self, value: int) -> EvState:
        return self.slots[value].state

    def statuses(self) -> tuple[EvStatus, ...]:
        return tuple(
            EvStatus(s.entry.value, s.entry.port, s.state, s.in_use, s.drop_count)
            for plane in self.by_plane
            for s in plane
        )

    def next_ev(self, avoid: int | None = None) -> EvSlot | None:
        """The next EV to spray on: round robin over planes, then over the plane's EVs.

        GOOD EVs are preferred over SKIP ones; ``avoid`` (the EV a lost packet used) is
        skipped whenever any other EV is usable.
        """
        planes = self.up_planes
        if not planes:
            return None
        n = len(planes)
        # The usual case first (once per packet sent): the plane's next EV is GOOD.
        plane = planes[self._plane_rr % n]
        slots = self._in_use[plane]
        if slots:
            start = self._ev_rr[plane]
            slot = slots[start % len(slots)]
            if slot.state is GOOD and slot.entry.value != avoid:
                self._plane_rr += 1
                self._ev_rr[plane] = start + 1
                return slot
        for _ in range(n):
            plane = planes[self._plane_rr % n]
            self._plane_rr += 1
            slots = self._in_use[plane]
            m = len(slots)
            start = self._ev_rr[plane]
            skipped = -1  # the first SKIP EV met: used when the plane has no GOOD one
            for i in range(m):
                slot = slots[(start + i) % m]
                if slot.entry.value == avoid:
                    continue
                if slot.state is GOOD:
                    self._ev_rr[plane] = start + i + 1
                    return slot
                if skipped < 0:
                    skipped = i
            if skipped >= 0:
                # The rotation moves on past it, so a plane of SKIP EVs still spreads its
                # packets over all of them instead of piling them onto one.
                self._ev_rr[plane] = start + skipped + 1
                return slots[(start + skipped) % m]
        if avoid is not None:
            return self.next_ev()  # the avoided EV is the only usable one left
        return None

    def reverse_set(self, port: int, k: int) -> list[EvSlot]:
        """The few EVs of ``port`` that carry feedback (ACK/NACK/probe replies)."""
        if not self.port_up[port]:
            return []
        return self._in_use[port][:k]

    def reverse_ev(self, port: int, rr: int, k: int) -> EvSlot | None:
        """An EV for feedback to a packet that arrived on ``port``, rotating with ``rr``.

        Feedback returns on the plane the data came in on; when that plane has no usable
        EV, any up plane will do (the cumulative ACK makes a lost one harmless).
        """
        if self.port_up[port]:  # reverse_set(port, k), without building it (per ACK)
            slots = self._in_use[port]
            n = len(slots)
            if n:
                return slots[rr % (n if n < k else k)]
        for plane in self.up_planes:
            slots = self._in_use[plane]
            n = len(slots)
            return slots[rr % (n if n < k else k)]
        return None

    def unusable_reason(self) -> str:
        """Why no EV is usable (``up_planes`` is empty), in words for an error event."""
        if not any(self.port_up):
            return "every local port is down"
        if not any(a and b for a, b in zip(self.port_up, self.remote_port_up, strict=True)):
            return "every plane is down here or at the peer"
        return "every EV of the up planes is assumed bad or denied"

    def probe_candidates(self) -> list[EvSlot]:
        """EVs that want a probe: assumed bad ones on planes that are up."""
        return [
            s
            for s in self.slots.values()
            if s.state is BAD and self.port_up[s.entry.port] and self.remote_port_up[s.entry.port]
        ]


def transitions_markdown() -> str:
    """The state table as Markdown; ``docs/ev-states.md`` embeds it (a test keeps them equal)."""
    lines = ["| state | signal | new state |", "|---|---|---|"]
    for (state, signal), new in TRANSITIONS.items():
        lines.append(f"| {state.name} | `{signal.value}` | {new.name} |")
    return "\n".join(lines) + "\n"


def _check_signal(signal: EvSignal, reason: EvReason) -> None:
    """An unknown signal or reason fails loudly: it would otherwise be ignored."""
    if type(signal) is not EvSignal:
        raise LocalError(f"unknown EV signal {signal!r}: not an EvSignal")
    if type(reason) is not EvReason:
        raise LocalError(f"unknown EV state change reason {reason!r}: not an EvReason")
