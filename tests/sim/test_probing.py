"""The fabric mapper in the simulator: probes as packets, faults named, denylists kept on
every connection, the [mapper] table of scenario files."""

from __future__ import annotations

import json
import math

import pytest

from mrcstack.fabric import Fabric
from mrcstack.sim import FlowSpec, LinkFailure, SimConfig, run, scenario
from mrcstack.sim.config import MapperSpec
from mrcstack.sim.probing import localization_time

SPEC = MapperSpec(interval=1e-3)
FABRIC = Fabric(planes=2, racks=3, hosts_per_rack=2, t1_per_plane=4)


@pytest.mark.parametrize(
    ("fault", "named"),
    [
        ({"fail_link": "p1:t0c-t1b"}, {"p1:t0c-t1b"}),
        ({"fail_link": "p0:h3-t0b"}, {"p0:h3-t0b"}),
        ({"fail_switch": "p0-t1d"}, {"p0:t0a-t1d", "p0:t0b-t1d", "p0:t0c-t1d"}),
    ],
)
def test_a_dead_link_or_t1_is_named_exactly_within_a_few_intervals(
    fault: dict[str, str], named: set[str]
) -> None:
    took, flagged, mapper = localization_time(FABRIC, SPEC, horizon=0.05, **fault)  # type: ignore[arg-type]
    # down_after (3) probes lost, the last one overdue after two intervals, one interval of
    # phase: at most six intervals.
    assert took <= 6 * SPEC.interval
    assert flagged == named
    assert mapper.localizer.denylist == named


def test_gray_loss_is_named_and_a_small_loss_is_not() -> None:
    took, flagged, _ = localization_time(FABRIC, SPEC, loss_link=("p1:t0a-t1a", 0.02), horizon=2.0)
    assert took < 0.5 and flagged == {"p1:t0a-t1a"}  # 500 rounds: 5 s at the testbed's 10 ms
    took, flagged, _ = localization_time(FABRIC, SPEC, loss_link=("p1:t0a-t1a", 0.001), horizon=2.0)
    assert math.isnan(took) and flagged == set()


def _job(deny: bool) -> SimConfig:
    """An all-to-all among four hosts starting at 30 ms on a fabric with a dead link, after
    the mapper has probed it for a while."""
    pairs = [(a, b) for a in range(4) for b in range(4) if a != b]
    return SimConfig(
        fabric=Fabric(),
        rate_bps=10e9,
        flow_specs=tuple(FlowSpec(a, b, start_s=0.03) for a, b in pairs),
        bytes_per_flow=1 << 20,
        link_failures=(LinkFailure("p0:t0a-t1b", 0.0),),
        mapper=MapperSpec(interval=1e-4, deny=deny),
        seed=2,
    )


def test_with_the_denylist_no_data_goes_on_a_denied_path() -> None:
    denied = run(_job(deny=True))
    watched = run(_job(deny=False))
    for result in (denied, watched):
        assert result.verified and result.mapper is not None
        [first, *_] = result.mapper.changes
        assert (first.link, first.new) == ("p0:t0a-t1b", "down")
        assert result.mapper.first_denial_s is not None and result.mapper.first_denial_s < 1e-3
    assert denied.mapper is not None and watched.mapper is not None
    assert denied.mapper.data_on_denied == 0 and denied.mapper.denials[0].connections > 0
    assert watched.mapper.data_on_denied > 0 and watched.mapper.denials[0].connections == 0
    assert sum(denied.retransmissions.values()) < sum(watched.retransmissions.values())


def test_a_mapped_run_is_deterministic_and_its_scenario_says_so() -> None:
    cfg = _job(deny=True)
    assert scenario.loads(scenario.dumps(cfg)) == cfg
    assert "[mapper]" in scenario.dumps(cfg)
    one, two = (json.dumps(run(cfg).to_json(), sort_keys=True) for _ in range(2))
    assert one == two
    assert json.loads(one)["mapper"]["changes"][0]["link"] == "p0:t0a-t1b"
    assert run(SimConfig()).to_json()["mapper"] is None


def test_bad_mapper_settings_name_the_key() -> None:
    text = scenario.dumps(_job(deny=True))
    with pytest.raises(scenario.ScenarioError, match=r"mapper\.overlp: unknown key"):
        scenario.loads(text.replace("overlap = 2", "overlp = 2"))
    with pytest.raises(scenario.ScenarioError, match=r"overlap must be in 1\.\.16"):
        scenario.loads(text.replace("overlap = 2", "overlap = 0"))
    with pytest.raises(ValueError, match="interval"):
        MapperSpec(interval=0)
