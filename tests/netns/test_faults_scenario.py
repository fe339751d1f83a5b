"""Fault scenarios (:mod:`mrcstack.netns.faults.scenario`): parsing checked against a
fabric, and replay on a fake clock against a stand-in for the harness."""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import Any

import pytest

from mrcstack.fabric import Fabric
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.faults.scenario import (
    FaultScenarioError,
    parse_scenario,
    parse_time,
    run_scenario,
)
from tests.support import REPO

FABRIC = Fabric()


def test_example_scenario_flaps_eight_t0_t1_links_for_three_seconds() -> None:
    text = (REPO / "examples" / "scenario-flap.toml").read_text()
    events = parse_scenario(text, FABRIC).events
    downs = [e for e in events if e.method == "link_down"]
    ups = [e for e in events if e.method == "link_up"]
    assert len(downs) == len(ups) == 8
    assert {e.at for e in downs} == {2.0} and {e.at for e in ups} == {5.0}
    assert all(e.restore for e in ups)
    assert [e.at for e in events] == sorted(e.at for e in events)
    assert {dict(e.kwargs)["a"] for e in downs} == {f"p0:t0{r}-t1{t}" for r in "ab" for t in "abcd"}


def test_restores_run_before_new_steps_at_the_same_time() -> None:
    text = """
        [[step]]
        at = "1s"
        action = "loss"
        link = "p0:t0a-t1a"
        rate = 0.1
        duration = "1s"
        [[step]]
        at = 2
        action = "loss"
        link = "p0:t0a-t1a"
        rate = 0.3
    """
    events = parse_scenario(textwrap.dedent(text), FABRIC).events
    assert [(e.at, e.method, e.restore) for e in events] == [
        (1.0, "loss", False),
        (2.0, "clear_loss", True),
        (2.0, "loss", False),
    ]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ('at = "1s"\naction = "link_dwn"\nlink = "p0:t0a-t1a"', "step 1: action: expected one of"),
        ('action = "restore_all"', "step 1: at: missing"),
        ('at = "1h"\naction = "restore_all"', "step 1: at: bad time"),
        ('at = "1s"\naction = "link_down"\na = "p0-t0a"\nb = "p0-t1z"', "step 1: a: bad link"),
        ('at = "1s"\naction = "link_down"\na = "p0-t0a"', "step 1: b: missing"),
        (
            'at = "1s"\naction = "link_down"\nlink = "p0:t0a-t1a"\ncolor = 1',
            "step 1: color: unknown",
        ),
        ('at = "1s"\naction = "loss"\nlink = "p0:t0a-t1a"', "step 1: rate: missing"),
        ('at = "1s"\naction = "loss"\nlink = "p0:t0a-t1a"\nrate = 3', "step 1: rate: bad rate"),
        (
            'at = "1s"\naction = "link_up"\nlink = "p0:t0a-t1a"\nduration = 1',
            "no automatic restore",
        ),
        (
            'at = "2s"\naction = "nic_down"\nhost = "h0"\nplane = 0\nuntil = "1s"',
            "until: must be after",
        ),
        (
            'at = "1s"\naction = "nic_down"\nhost = "h9"\nplane = 0',
            "step 1: host: host 9 out of range",
        ),
        ('at = "1s"\naction = "switch_fail"\nswitch = "p0-t0z"', "step 1: switch: bad switch"),
        (
            'at = "1s"\naction = "shape"\nlink = "p0:h0-t0a"\nrate = "fast"',
            "step 1: rate: bad rate",
        ),
        ('at = "1s"\naction = "loss"\nlink = "p0:h0-t0a"\nrate = 0.1\nfrom = "h1"', "not an end"),
        (
            'at = "1s"\naction = "trim"\nlink = "p0:t0a-t1a"\nthreshold = "64KiB"',
            r"step 1: rate: missing \(link p0:t0a-t1a is unshaped in this fabric\)",
        ),
    ],
)
def test_scenario_errors_name_the_step_and_key(body: str, message: str) -> None:
    with pytest.raises(FaultScenarioError, match=message) as info:
        parse_scenario("[[step]]\n" + body, FABRIC)
    assert "\n" not in str(info.value)


def test_scenario_trim_takes_the_rate_of_a_shaped_link_by_default() -> None:
    step = '[[step]]\nat = "1s"\naction = "trim"\nlink = "p0:t0a-t1a"\nthreshold = "64KiB"\n'
    shaped = Fabric(fabric_link_bps=200e6)
    [event] = parse_scenario(step, shaped).events
    assert dict(event.kwargs)["rate_bps"] is None  # Faults.trim then uses 200 Mbit/s
    assert dict(event.kwargs)["threshold_bytes"] == 65536


def test_scenario_refuses_taking_a_link_down_twice_and_unknown_tables() -> None:
    twice = """
        [[step]]
        at = 1
        action = "link_down"
        link = "p0:t0a-t1a"
        [[step]]
        at = 2
        action = "link_down"
        a = "p0-t1a"
        b = "p0-t0a"
    """
    with pytest.raises(
        FaultScenarioError, match=r"step 2: link p0:t0a-t1a is already down .*step 1"
    ):
        parse_scenario(textwrap.dedent(twice), FABRIC)
    with pytest.raises(FaultScenarioError, match="steps: unknown key"):
        parse_scenario("steps = []", FABRIC)
    with pytest.raises(FaultScenarioError, match="no steps"):
        parse_scenario('name = "x"', FABRIC)
    with pytest.raises(FaultScenarioError, match="toml"):
        parse_scenario("[[step]\n", FABRIC)
    assert parse_time("250ms") == pytest.approx(0.25)
    assert parse_time(3) == 3.0


@dataclass
class _FakeFault:
    id: int


class _FakeFaults:
    """Records calls; fails on demand.  Stands in for mrcstack.netns.faults.Faults."""

    def __init__(self, fail_on: str | None = None) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail_on = fail_on
        self.live: dict[int, str] = {}
        self.next_id = 1

    def __getattr__(self, method: str) -> Any:
        def call(**kwargs: Any) -> list[_FakeFault]:
            self.calls.append((method, kwargs))
            if method == self.fail_on:
                raise FaultError(f"{method} exploded")
            fault = _FakeFault(self.next_id)
            self.live[fault.id] = method
            self.next_id += 1
            return [fault]

        return call

    def active(self) -> list[_FakeFault]:
        return [_FakeFault(i) for i in self.live]

    def clear(self, fault_id: int) -> None:
        self.calls.append(("clear", {"fault": fault_id}))
        del self.live[fault_id]


class _FakeClock:
    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


FLAP = """
[[step]]
at = "0.2s"
action = "link_down"
link = "p0:t0a-t1b"
until = "0.6s"
"""


def test_scenario_runs_on_the_clock_and_logs_each_step_in_order() -> None:
    scenario = parse_scenario(FLAP, FABRIC)
    faults, clock, lines = _FakeFaults(), _FakeClock(), list[str]()
    log = run_scenario(scenario, faults, clock=clock, sleep=clock.sleep, log=lines.append)
    assert [m for m, _ in faults.calls] == ["link_down", "link_up"]
    assert clock.sleeps == pytest.approx([0.2, 0.4])
    assert [(e.planned, e.step) for e in log] == [(0.2, 1), (0.6, 1)]
    assert [e.actual for e in log] == pytest.approx([0.2, 0.6])
    assert "link_down a=p0:t0a-t1b" in log[0].text and "automatic restore" in log[1].text
    assert len(lines) == 2 and "step 1: link_down" in lines[0]
    assert log[0].wall < log[1].wall or log[0].wall == log[1].wall


def test_a_failing_step_undoes_what_the_scenario_applied() -> None:
    text = FLAP + '\n[[step]]\nat = "0.3s"\naction = "loss_path"\nswitch = "p0-t1b"\nrate = 0.5\n'
    scenario = parse_scenario(text, FABRIC)
    faults, clock = _FakeFaults(fail_on="loss_path"), _FakeClock()
    with pytest.raises(FaultScenarioError, match=r"step 2 \(loss_path .*\): loss_path exploded"):
        run_scenario(scenario, faults, clock=clock, sleep=clock.sleep, log=lambda _: None)
    assert faults.calls[-1] == ("clear", {"fault": 1})  # the link went down: back up
    assert not faults.live
