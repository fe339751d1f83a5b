"""The fabric mapper's link denylist in mrcd, through the controller API: every QP denies
the EVs over a listed link at once, new QPs start without them, and they come back when
the link leaves the list."""

from __future__ import annotations

import errno

import pytest

from mrcstack import addrplan
from mrcstack.api import ApiError, Controller, WriteWr
from tests.support.apiharness import FABRIC, Daemons, connect, drain


def _states(d: Daemons, host: int, qpn: int) -> dict[int, str]:
    rows = d.on_loop(lambda: d.nodes[host].ev_states(qpn))
    return {int(str(r["ev"])): str(r["state"]) for r in rows}


def _over(link: str, local: int, remote: int, evs: set[int]) -> set[int]:
    """The EVs of ``evs`` whose path local -> remote crosses ``link``."""
    return {
        ev
        for ev in evs
        if link in addrplan.path(FABRIC, local, remote, ev >> 8 & 0xF, ev).physical_links
    }


def test_a_listed_link_denies_its_evs_on_every_qp_and_new_ones(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16)
    link = "p1:t0a-t1c"
    before_a, before_b = _states(daemons, 0, a.qp.qpn), _states(daemons, 3, b.qp.qpn)
    crossing_a = _over(link, 0, 3, set(before_a))
    crossing_b = _over(link, 3, 0, set(before_b))
    assert crossing_a and crossing_b  # h0 -> h3 and back both cross p1-t0a's link to t1c
    with Controller.open(daemons.sockets[0]) as ctl0, Controller.open(daemons.sockets[3]) as ctl3:
        r0 = ctl0.set_link_denylist(["p1:t1c-t0a"], version=7, source="test")  # either direction
        ctl3.set_link_denylist([link], version=7, source="test")
        assert r0["links"] == [link] and r0["version"] == 7 and r0["source"] == "test"
        assert r0["denied_evs"] == len(crossing_a) and r0["qps"] == 1
        after = _states(daemons, 0, a.qp.qpn)
        assert {ev for ev, s in after.items() if s == "denied"} == crossing_a
        assert {
            ev for ev, s in _states(daemons, 3, b.qp.qpn).items() if s == "denied"
        } == crossing_b
        # Data still flows, around the denied paths.
        a.qp.post_send(WriteWr(1, (a.mr, 0, 1 << 16), b.mr.addr, b.mr.rkey, imm=1))
        assert drain(a.cq, 1)[0].ok
        # A new QP starts with them denied.
        c, _ = connect(daemons, 4096, service=8)
        fresh = _states(daemons, 0, c.qp.qpn)
        assert {ev for ev, s in fresh.items() if s == "denied"} == crossing_a
        # Off the list: back as assumed bad (probes bring them back), on every QP.
        doc = ctl0.set_link_denylist([])
        assert doc["version"] == 8 and doc["denied_evs"] == 0 and doc["changed"] > 0
        for qpn in (a.qp.qpn, c.qp.qpn):
            assert all(_states(daemons, 0, qpn)[ev] != "denied" for ev in crossing_a)
        assert ctl0.link_denylist()["links"] == []


def test_the_controllers_own_deny_stays_when_the_link_comes_back(daemons: Daemons) -> None:
    a, _ = connect(daemons, 4096)
    link = "p2:t0a-t1b"
    ev = addrplan.ev_value(2, 1)
    with Controller.open(daemons.sockets[0]) as ctl:
        ctl.deny(0, [ev])
        ctl.set_link_denylist([link])
        ctl.set_link_denylist([])
        assert _states(daemons, 0, a.qp.qpn)[ev] == "denied"


@pytest.mark.parametrize(
    ("links", "message"),
    [(["p9:t0a-t1a"], "links[0]"), (["p0:h0-t0b"], "not in this fabric"), ([3], "link name")],
)
def test_bad_links_are_refused_in_one_line(
    daemons: Daemons, links: list[object], message: str
) -> None:
    with Controller.open(daemons.sockets[0]) as ctl, pytest.raises(ApiError) as err:
        ctl.call("set_link_denylist", links=links)
    assert err.value.errno == errno.EINVAL and message in str(err.value)
