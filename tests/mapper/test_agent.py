"""The probing agent's core: rounds, outcomes in send order, refused replies."""

from __future__ import annotations

import pytest

from mrcstack.fabric import Fabric
from mrcstack.mapper.agent import PathResult, ProbeAgent, Reply
from mrcstack.mapper.plan import make_plan

PLAN = make_plan(Fabric())
SHARE = PLAN.share(0)


def test_a_round_sends_each_loop_once_and_short_loops_as_often_as_asked() -> None:
    agent = ProbeAgent(SHARE, timeout=0.02, short_repeat=2)
    probes = agent.next_round(0.0)
    assert agent.per_round == len(probes) == len(SHARE) + 4  # 4 short loops, sent twice
    assert [p.seq for p in probes] == list(range(1, len(probes) + 1))
    assert agent.outstanding == len(probes)


def test_results_are_settled_in_send_order_per_loop() -> None:
    agent = ProbeAgent(SHARE[:1], timeout=0.02)
    agent.next_round(0.0)
    second = agent.next_round(0.01)[0]
    assert agent.delivered(second.seq, 0.011) is Reply.OK
    assert agent.report() == ()  # the first is neither back nor overdue: nothing settles
    agent.settle(0.019)  # not yet overdue
    assert agent.report() == ()
    agent.settle(0.02)  # the first is overdue: lost, then the second counts
    [result] = agent.report()
    assert (result.path, result.sent, result.lost, result.tail) == (SHARE[0].ident, 2, 1, 0)
    assert result.rtt_sum == pytest.approx(0.001)
    assert agent.lost == 1 and agent.delivered_count == 1


def test_the_tail_is_the_newest_run_of_losses() -> None:
    agent = ProbeAgent(SHARE[:1], timeout=0.01)
    ok = agent.next_round(0.0)[0]
    agent.delivered(ok.seq, 0.001)
    for t in (0.01, 0.02):
        agent.next_round(t)
    agent.settle(0.04)
    [result] = agent.report()
    assert (result.sent, result.lost, result.tail) == (3, 2, 2)
    agent.next_round(0.05)
    agent.settle(0.07)
    [result] = agent.report()
    assert (result.sent, result.lost, result.tail) == (1, 1, 1)  # the localizer adds them


def test_late_replayed_and_unknown_replies_are_refused_and_counted() -> None:
    agent = ProbeAgent(SHARE[:1], timeout=0.01)
    late, on_time = agent.next_round(0.0)[0], agent.next_round(0.005)[0]
    assert agent.delivered(on_time.seq, 0.006) is Reply.OK
    agent.settle(0.011)
    assert agent.delivered(late.seq, 0.012) is Reply.LATE
    assert agent.delivered(on_time.seq, 0.013) is Reply.REPLAYED
    assert agent.delivered(999, 0.014) is Reply.UNKNOWN
    assert agent.refused == {Reply.LATE: 1, Reply.REPLAYED: 1, Reply.UNKNOWN: 1}
    [result] = agent.report()
    assert (result.sent, result.lost) == (2, 1)  # refusals change no result


def test_bad_settings_and_results_are_refused() -> None:
    with pytest.raises(ValueError, match="timeout"):
        ProbeAgent(SHARE, timeout=0)
    with pytest.raises(ValueError, match="short_repeat"):
        ProbeAgent(SHARE, timeout=1, short_repeat=0)
    with pytest.raises(ValueError, match="inconsistent"):
        PathResult(0, 1, 2, 0, 0.0)


def test_a_round_lost_on_every_plane_is_no_result() -> None:
    """The host's own stack held every probe past the timeout: no news of any link."""
    agent = ProbeAgent(SHARE, timeout=0.01)
    agent.next_round(0.0)
    agent.settle(0.02)
    assert agent.report() == () and agent.void_rounds == 1 and agent.lost == 0
    probes = agent.next_round(0.03)  # one probe back: the others' losses are news
    agent.delivered(probes[0].seq, 0.031)
    agent.settle(0.05)
    results = agent.report()
    assert sum(r.lost for r in results) == len(probes) - 1 and agent.void_rounds == 1
    one_plane = ProbeAgent([p for p in SHARE if p.plane == 0], timeout=0.01)
    one_plane.next_round(0.0)
    one_plane.settle(0.02)  # one plane only: a dead T0 looks like this, and it is news
    assert sum(r.lost for r in one_plane.report()) == one_plane.per_round
