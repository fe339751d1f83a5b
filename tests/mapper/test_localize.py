"""Localization: each kind of fault named exactly, in time; no fault, nothing named; the
hold-down keeps a flapping link denied; agents that go quiet condemn nothing."""

from __future__ import annotations

import math
import random

import pytest

from mrcstack.fabric import Fabric
from mrcstack.mapper.agent import PathResult
from mrcstack.mapper.linkstate import LinkState, transitions_markdown
from mrcstack.mapper.localize import LinkChange, Localizer, Params
from mrcstack.mapper.plan import make_plan
from tests.support import REPO

INTERVAL = 0.01  # the testbed's default: every loop every 10 ms


class Fabricated:
    """Probe results made up round by round from each link's loss per crossing (1.0: down),
    for the hosts whose agents run."""

    def __init__(self, fabric: Fabric, params: Params | None = None, seed: int = 1) -> None:
        self.plan = make_plan(fabric)
        self.localizer = Localizer(self.plan, params or Params(hold_down=5.0))
        self.loss: dict[str, float] = {}
        self.silent: set[int] = set()
        self.rng = random.Random(seed)
        self.now = 0.0
        self.changes: list[LinkChange] = []

    def round(self) -> list[LinkChange]:
        self.now += INTERVAL
        for host in range(self.plan.fabric.hosts):
            if host in self.silent:
                continue
            results = []
            for path in self.plan.share(host):
                delivered = 1.0
                for link in path.links:
                    delivered *= (1.0 - self.loss.get(link, 0.0)) ** 2
                lost = int(self.rng.random() >= delivered)
                results.append(PathResult(path.ident, 1, lost, lost, 0.0 if lost else 1e-4))
            self.localizer.observe(results, self.now)
        changes = self.localizer.evaluate(self.now)
        self.changes += changes
        return changes

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / INTERVAL)):
            self.round()

    def until_named(self, links: set[str], seconds: float) -> float:
        """Seconds until every link of ``links`` left UP (NaN: not within ``seconds``)."""
        start = self.now
        for _ in range(round(seconds / INTERVAL)):
            self.round()
            if all(self.localizer.state(link) is not LinkState.UP for link in links):
                return self.now - start
        return math.nan


def test_a_dead_t0_t1_link_is_named_alone_within_a_few_rounds() -> None:
    f = Fabricated(Fabric())
    f.run(0.2)
    f.loss["p1:t0b-t1c"] = 1.0
    took = f.until_named({"p1:t0b-t1c"}, 1.0)
    assert took <= 4 * INTERVAL  # down_after = 3 rounds
    assert f.localizer.denylist == {"p1:t0b-t1c"}
    assert f.localizer.state("p1:t0b-t1c") is LinkState.DOWN


def test_a_dead_host_link_is_named_and_its_t0_t1_links_are_not() -> None:
    f = Fabricated(Fabric())
    f.run(0.2)
    f.loss["p2:h3-t0b"] = 1.0
    assert f.until_named({"p2:h3-t0b"}, 1.0) <= 4 * INTERVAL
    f.run(1.0)
    assert f.localizer.denylist == {"p2:h3-t0b"}


def test_a_single_host_rack_still_tells_its_host_link_from_its_uplinks() -> None:
    f = Fabricated(Fabric(planes=1, racks=2, hosts_per_rack=1, t1_per_plane=3))
    f.run(0.2)
    f.loss["p0:h1-t0b"] = 1.0
    f.run(0.5)
    assert f.localizer.denylist == {"p0:h1-t0b"}


def test_a_failed_t1_is_all_its_links_and_the_switch_is_named() -> None:
    f = Fabricated(Fabric())
    f.run(0.2)
    links = {"p0:t0a-t1b", "p0:t0b-t1b"}
    f.loss.update(dict.fromkeys(links, 1.0))
    assert f.until_named(links, 1.0) <= 4 * INTERVAL
    assert f.localizer.denylist == links
    assert f.localizer.switches_down() == ["p0-t1b"]


def test_a_failed_t0_shows_as_its_host_links_and_the_switch_is_named() -> None:
    f = Fabricated(Fabric())
    f.run(0.2)
    dead = {"p3:h0-t0a", "p3:h1-t0a", *(f"p3:t0a-t1{x}" for x in "abcd")}
    f.loss.update(dict.fromkeys(dead, 1.0))
    f.run(0.5)
    assert f.localizer.denylist == {"p3:h0-t0a", "p3:h1-t0a"}  # its uplinks cannot be judged
    assert f.localizer.switches_down() == ["p3-t0a"]


@pytest.mark.parametrize("link", ["p0:t0a-t1c", "p1:h2-t0b"])
def test_two_percent_loss_is_named_lossy_within_five_seconds(link: str) -> None:
    f = Fabricated(Fabric(), seed=7)
    f.run(1.0)
    f.loss[link] = 0.02
    took = f.until_named({link}, 5.0)
    assert took <= 5.0
    assert f.localizer.state(link) is LinkState.LOSSY
    assert f.localizer.denylist == {link}
    status = {s.link: s for s in f.localizer.status(f.now)}[link]
    assert 0.005 < status.loss < 0.05  # about 2% per crossing


def test_a_tenth_of_a_percent_and_no_loss_are_never_named() -> None:
    f = Fabricated(Fabric(), seed=3)
    f.loss["p0:t0a-t1c"] = 0.001
    f.loss["p1:h0-t0a"] = 0.001
    f.run(30.0)
    assert f.changes == []


def test_a_flapping_link_stays_denied_until_stable_for_the_hold_down() -> None:
    f = Fabricated(Fabric(), Params(hold_down=3.0))
    f.run(0.2)
    link = "p0:t0b-t1a"
    for _ in range(4):  # down 1 s, up 1 s: shorter than the hold-down
        f.loss[link] = 1.0
        f.run(1.0)
        assert f.localizer.state(link) is LinkState.DOWN
        f.loss[link] = 0.0
        f.run(1.0)
        assert link in f.localizer.denylist  # HELD
    stable = f.now - 1.0  # up since the last flap
    f.run(1.9)
    assert f.localizer.state(link) is LinkState.HELD
    f.run(0.5)
    assert f.localizer.state(link) is LinkState.UP
    back = next(c.at for c in reversed(f.changes) if c.new is LinkState.UP)
    assert 3.0 <= back - stable <= 3.1
    timer = f.localizer.get_timer()
    assert timer is None


def test_a_lossy_link_comes_back_after_it_is_repaired_and_the_hold_down() -> None:
    f = Fabricated(Fabric(), Params(hold_down=2.0), seed=5)
    f.run(0.5)
    f.loss["p0:t0a-t1a"] = 0.05
    f.run(5.0)
    assert f.localizer.state("p0:t0a-t1a") is LinkState.LOSSY
    f.loss["p0:t0a-t1a"] = 0.0
    f.run(15.0)
    assert f.localizer.state("p0:t0a-t1a") is LinkState.UP
    states = [c.new for c in f.changes]
    assert states == [LinkState.LOSSY, LinkState.HELD, LinkState.UP]


def test_a_host_whose_agent_went_quiet_condemns_nothing() -> None:
    f = Fabricated(Fabric())
    f.run(0.5)
    f.silent.add(1)  # its mrcd stopped: no results, not lost ones
    f.run(3.0)
    assert f.changes == []


def test_seeded_links_are_held_and_return_after_the_hold_down() -> None:
    f = Fabricated(Fabric(), Params(hold_down=1.0))
    changes = f.localizer.seed({"p0:t0a-t1a", "p0:h0-t0a"}, f.now)
    assert {c.new for c in changes} == {LinkState.HELD}
    assert f.localizer.denylist == {"p0:t0a-t1a", "p0:h0-t0a"}
    f.run(0.9)
    assert len(f.localizer.denylist) == 2
    f.run(0.2)
    assert f.localizer.denylist == set()


def test_params_are_checked_and_the_table_renders() -> None:
    for bad in (
        {"down_after": 0},
        {"loss_threshold": 0.0},
        {"confidence": 1.0},
        {"windows": ()},
        {"bucket": 0.0},
    ):
        with pytest.raises(ValueError):
            Params(**bad)  # type: ignore[arg-type]
    assert Params().round_trip_threshold == pytest.approx(0.009975)
    assert "| DOWN | `good` | HELD |" in transitions_markdown()


def test_the_docs_show_the_link_state_table_of_the_code() -> None:
    doc = (REPO / "docs" / "mapper.md").read_text()
    table = doc.split("<!-- transitions -->\n", 1)[1].split("<!-- /transitions -->", 1)[0]
    assert table == transitions_markdown()
