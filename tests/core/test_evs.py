"""EV profiles, the EV table and its single transition table."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mrcstack import native
from mrcstack.core.events import EvState, EvStateChanged
from mrcstack.core.evs import (
    TRANSITIONS,
    EvEntry,
    EvField,
    EvSignal,
    EvTable,
    generate_evs,
    in_use_for,
    listed_for,
    transitions_markdown,
)
from mrcstack.core.reasons import EvReason
from mrcstack.errors import LocalError
from tests.support import REPO

ROOT = REPO


def table(
    planes: int = 2, per_plane: int = 4, **kw: object
) -> tuple[EvTable, list[EvStateChanged]]:
    events: list[EvStateChanged] = []
    entries = [EvEntry(p << 8 | i, p) for p in range(planes) for i in range(per_plane)]
    return EvTable(entries, planes, events.append, **kw), events  # type: ignore[arg-type]


def test_generated_profile_packs_fields_and_takes_port_from_plane() -> None:
    evs = generate_evs([EvField("t1", 8, 0, 3), EvField("plane", 4, 0, 1)])
    assert len(evs) == 8
    assert EvEntry(0x103, 1) in evs and EvEntry(0x002, 0) in evs
    masked = generate_evs([EvField("t1", 8, 0, 7, mask=0b101), EvField("plane", 4, 0, 0)])
    assert [e.value for e in masked] == [0, 1, 4, 5]
    with pytest.raises(ValueError):
        generate_evs([EvField("t1", 8)], port_field="plane")
    with pytest.raises(ValueError):
        generate_evs([EvField("a", 20), EvField("plane", 20)])


def test_initial_set_split_equally_across_planes_with_backups() -> None:
    t, events = table(planes=2, per_plane=6, ev_count=8)
    in_use = [[s.entry.value for s in t.by_plane[p] if s.in_use] for p in range(2)]
    assert [len(x) for x in in_use] == [4, 4]
    assert sum(1 for s in t.slots.values() if s.state is EvState.UNKNOWN) == 4
    assert events == []  # the initial set is not a change


def test_spraying_alternates_planes_and_avoids_lost_ev() -> None:
    t, _ = table(planes=2, per_plane=2)
    picks = [t.next_ev() for _ in range(8)]
    ports = [p.entry.port for p in picks if p is not None]
    assert ports == [0, 1] * 4
    for _ in range(10):
        slot = t.next_ev(avoid=0x000)
        assert slot is not None and slot.entry.value != 0x000


def test_loss_replaces_with_backup_from_same_plane_and_emits_events() -> None:
    t, events = table(planes=2, per_plane=3, ev_count=4)
    assert t.apply(0x100, EvSignal.LOSS, EvReason.SACK_LOSS)
    assert t.state(0x100) is EvState.ASSUMED_BAD
    assert (events[0].ev, events[0].new, events[0].drop_count) == (0x100, EvState.ASSUMED_BAD, 1)
    assert events[1].old is EvState.UNKNOWN and events[1].new is EvState.GOOD
    assert events[1].port == 1
    assert t.slots[events[1].ev].in_use


def test_a_quarter_of_each_planes_evs_stays_back_as_backups() -> None:
    assert [in_use_for(n, 128) for n in (1, 2, 3, 4, 8, 16)] == [1, 1, 2, 3, 6, 12]
    assert in_use_for(40, 8) == 8  # asked for fewer than the plane lists
    assert [listed_for(r) for r in (1, 2, 3, 6, 32)] == [2, 3, 4, 7, 42]
    t, _ = table(planes=2, per_plane=4)  # ev_count 128: asks for 64 per plane
    assert t.in_use_target == [3, 3]
    assert [sum(1 for s in t.by_plane[p] if s.state is EvState.UNKNOWN) for p in (0, 1)] == [1, 1]
    single, _ = table(planes=2, per_plane=1)
    assert single.in_use_target == [1, 1]  # one path per plane: in use, no backup


def test_a_loss_without_a_backup_skips_the_ev_instead_of_demoting_it() -> None:
    """A loss seen on the path itself (a later packet on it arrived) swaps in a backup when
    the plane has one; without one, the EV is skipped for a while: the path still delivers,
    and demoting it would only shrink the plane's spray set."""
    t, events = table(planes=1, per_plane=4)  # 3 in use, 1 backup
    assert t.apply(0x000, EvSignal.LOSS, EvReason.SACK_LOSS, 1.0, skip_until=2.0)
    assert t.state(0x000) is EvState.ASSUMED_BAD and t.state(0x003) is EvState.GOOD
    assert t.apply(0x001, EvSignal.LOSS, EvReason.SACK_LOSS, 1.0, skip_until=2.0)  # no backup left
    assert t.state(0x001) is EvState.SKIP and t.slots[0x001].in_use
    assert t.slots[0x001].drop_count == 1 and events[-1].reason == "lossy"
    t.expire_skips(2.0)
    assert t.state(0x001) is EvState.GOOD
    assert t.apply(0x001, EvSignal.TIMEOUT, EvReason.RTO)  # silence still condemns it
    assert t.state(0x001) is EvState.ASSUMED_BAD


def test_ecn_and_trim_skip_then_expire() -> None:
    t, events = table()
    t.skip(0x001, until=5.0, signal=EvSignal.ECN)
    assert t.state(0x001) is EvState.SKIP
    t.skip(0x001, until=7.0, signal=EvSignal.TRIM)  # extends, no new event
    assert len(events) == 1
    t.expire_skips(6.0)
    assert t.state(0x001) is EvState.SKIP
    t.expire_skips(7.0)
    assert t.state(0x001) is EvState.GOOD


def test_ev_min_active_bounds_demotion() -> None:
    t, _ = table(planes=1, per_plane=3, ev_min_active=2)
    assert t.apply(0x000, EvSignal.LOSS, EvReason.SACK_LOSS)
    assert not t.apply(0x001, EvSignal.LOSS, EvReason.SACK_LOSS)  # would leave only one good EV
    assert t.state(0x001) is EvState.GOOD
    assert t.slots[0x001].drop_count == 1


def test_ev_min_active_counts_only_evs_of_planes_that_are_up() -> None:
    """EVs of a plane that is down carry nothing: with every other plane down, the last EV
    of the one plane left is not demoted (the retry limit decides, not path health)."""
    t, _ = table(planes=2, per_plane=1, ev_min_active=1)
    t.set_port(1, False, remote=False)
    assert t.good_count() == 1
    assert not t.apply(0x000, EvSignal.TIMEOUT, EvReason.RTO)
    assert t.state(0x000) is EvState.GOOD and t.next_ev() is not None
    t.set_port(1, True, remote=False)
    assert t.apply(0x000, EvSignal.TIMEOUT, EvReason.RTO)  # plane 1 carries traffic again


def test_probes_resurrect_and_retire_to_backup_when_plane_is_full() -> None:
    t, _ = table(planes=1, per_plane=3, ev_count=2)
    t.apply(0x000, EvSignal.TIMEOUT, EvReason.RTO)  # 0x002 swapped in
    for i in range(3):
        t.probe_result(0x000, True, float(i), needed_ok=3, needed_fail=2)
    assert t.state(0x000) is EvState.UNKNOWN  # healthy again, kept as a backup
    t.apply(0x001, EvSignal.LOSS, EvReason.SACK_LOSS)  # now 0x000 is swapped back in
    assert t.state(0x000) is EvState.GOOD and t.slots[0x000].in_use


def test_deny_and_allow() -> None:
    t, _ = table(planes=1, per_plane=2, denied=[0x001])
    assert t.state(0x001) is EvState.DENIED
    for _ in range(5):
        slot = t.next_ev()
        assert slot is not None and slot.entry.value == 0x000
    assert t.apply(0x001, EvSignal.ALLOW, EvReason.CONTROLLER)
    assert t.state(0x001) is EvState.ASSUMED_BAD  # must prove itself with probes


def test_an_unknown_signal_or_reason_fails_loudly() -> None:
    """A signal the table does not know is an error, not a signal ignored for that state."""
    t, events = table(planes=1, per_plane=2)
    # Compiled (mrcstack.native), the call itself refuses an argument of the wrong type.
    wrong_type: tuple[type[Exception], str] = (
        (TypeError, "EvSignal object expected")
        if native.compiled()
        else (LocalError, "unknown EV signal")
    )
    error, signal = wrong_type
    with pytest.raises(error, match=signal):
        t.apply(0x000, "loss", EvReason.SACK_LOSS)  # type: ignore[arg-type]
    with pytest.raises(error, match=signal):
        t.apply(0x7777, "los", EvReason.SACK_LOSS)  # type: ignore[arg-type]
    with pytest.raises(LocalError, match="not an EvReason"):  # (a str subclass either way)
        t.apply(0x000, EvSignal.DENY, "operator")  # type: ignore[arg-type]
    with pytest.raises(LocalError, match="not a signal that skips"):
        t.skip(0x000, until=1.0, signal=EvSignal.LOSS)
    assert t.state(0x000) is EvState.GOOD and events == []
    assert not t.apply(0x000, EvSignal.ALLOW, EvReason.CONTROLLER)  # known, not for GOOD


def test_plane_down_takes_its_evs_out_and_back() -> None:
    t, _ = table(planes=2, per_plane=2)
    assert t.set_port(1, False, remote=True)
    assert all(t.next_ev().entry.port == 0 for _ in range(6))  # type: ignore[union-attr]
    assert t.set_port(1, True, remote=True)
    assert {t.next_ev().entry.port for _ in range(4)} == {0, 1}  # type: ignore[union-attr]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 7),
            st.sampled_from(
                [
                    EvSignal.ECN,
                    EvSignal.TRIM,
                    EvSignal.LOSS,
                    EvSignal.TIMEOUT,
                    EvSignal.PROBE_OK,
                    EvSignal.DENY,
                    EvSignal.ALLOW,
                ]
            ),
        ),
        max_size=60,
    )
)
def test_random_signals_keep_invariants(ops: list[tuple[int, EvSignal]]) -> None:
    t, events = table(planes=2, per_plane=4, ev_count=4, ev_min_active=1)
    for i, (idx, signal) in enumerate(ops):
        value = (idx // 4) << 8 | idx % 4
        if signal in (EvSignal.ECN, EvSignal.TRIM):
            t.skip(value, until=float(i), signal=signal)
        elif signal is EvSignal.PROBE_OK:
            t.probe_result(value, True, float(i), needed_ok=1, needed_fail=1)
        else:
            t.apply(value, signal, EvReason.CONTROLLER, float(i))
        t.expire_skips(float(i))
        for port in range(2):
            assert sum(1 for s in t.by_plane[port] if s.in_use) <= t.in_use_target[port]
        for s in t.slots.values():
            assert not (s.in_use and s.state in (EvState.ASSUMED_BAD, EvState.DENIED))
    for e in events:
        assert e.old is not e.new
        # Every change but skip expiry and a resurrected EV's retirement is in the table.
        assert (e.old, e.new) in {(k[0], v) for k, v in TRANSITIONS.items()}


def test_docs_state_table_is_generated_from_the_code() -> None:
    doc = (ROOT / "docs" / "ev-states.md").read_text()
    assert transitions_markdown() in doc


def test_a_plane_of_skip_evs_still_rotates_over_all_of_them() -> None:
    """With no GOOD EV in a plane, its packets spread over its SKIP EVs (they used to pile
    onto the first one: the fallback never moved the rotation)."""
    t, _ = table(planes=2, per_plane=4, ev_count=8)
    plane0 = [s.entry.value for s in t.by_plane[0] if s.in_use]
    for value in plane0:
        t.skip(value, until=10.0, signal=EvSignal.ECN)
    picks = [t.next_ev() for _ in range(16)]
    on_plane0 = [p.entry.value for p in picks if p is not None and p.entry.port == 0]
    assert len(on_plane0) == 8  # planes still alternate
    assert sorted(set(on_plane0)) == sorted(plane0)
    counts = [on_plane0.count(v) for v in plane0]
    assert max(counts) - min(counts) <= 1  # evenly, as GOOD ones would be
