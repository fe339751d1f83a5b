"""netem faults without the kernel: the tc commands they generate, where netem goes on a port
that is already shaped or trimmed, one-line errors for bad settings, and a scenario step
that applies netem and undoes it."""

from __future__ import annotations

import pytest

from mrcstack.fabric import Fabric
from mrcstack.netns.faults.netem import NetemSpec, attach_command, parent_for, parse_spec, tc_args
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.faults.scenario import parse_scenario


def test_every_option_reaches_tc() -> None:
    spec = parse_spec({"delay": "10ms", "jitter": "2ms", "distribution": "pareto",
                       "loss_gemodel": "1%,10%,70%,0.1%", "reorder": "25%", "gap": 5,
                       "duplicate": "1%", "corrupt": "0.1%", "rate": "100mbit",
                       "slot": ["800us", "1ms"], "limit": 1000})  # fmt: skip
    assert tc_args(spec) == [
        "netem", "limit", "1000", "delay", "10000us", "2000us", "distribution", "pareto",
        "loss", "gemodel", "1%", "10%", "70%", "0.1%", "duplicate", "1%",
        "reorder", "25%", "gap", "5", "corrupt", "0.1%", "rate", "100mbit",
        "slot", "800us", "1ms",
    ]  # fmt: skip
    assert tc_args(parse_spec({"loss": 0.02})) == ["netem", "loss", "random", "2%"]
    assert parse_spec(spec.to_params()) == spec  # the recorded form reads back


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        ({"jitter": "1ms"}, "--jitter needs --delay"),
        ({"delay": "1ms", "distribution": "normal"}, "--distribution needs --jitter"),
        ({"delay": "1ms", "jitter": "1ms", "distribution": "gauss"}, "distribution 'gauss'"),
        ({"delay": "10 parsecs"}, "expected a time"),
        ({"loss": "1%", "loss_gemodel": "1%,1%,1%,1%"}, "not both"),
        ({"loss_gemodel": "1%,2%"}, "four values"),
        ({"loss": "150%"}, "probability in (0, 1]"),
        ({"reorder": "5%"}, "--reorder needs --delay"),
        ({"delay": "1ms", "gap": 3}, "--gap needs --reorder"),
        ({}, "nothing to do"),
    ],
)
def test_bad_settings_are_one_line_errors(args: dict[str, object], needle: str) -> None:
    with pytest.raises(FaultError) as info:
        parse_spec(args)
    assert needle in str(info.value) and "\n" not in str(info.value)


def test_netem_joins_a_shaped_or_trimmed_port_as_a_child() -> None:
    spec = NetemSpec(delay_s=0.005)
    shaped = {"kind": "tbf", "handle": "8001:", "root": True}
    trimmed = {"kind": "htb", "handle": "7472:", "root": True}
    assert parent_for(None) == "root" and parent_for({"kind": "noqueue", "root": True}) == "root"
    assert attach_command("ns", "eth0", parent_for(shaped), spec) == [
        "tc", "-n", "ns", "qdisc", "replace", "dev", "eth0", "parent", "8001:1",
        "handle", "6e65:", "netem", "delay", "5000us",
    ]  # fmt: skip
    assert attach_command("ns", "eth0", parent_for(trimmed), spec)[6:9] == [
        "eth0",
        "parent",
        "7472:20",  # the trim program's data class: trims still jump it
    ]
    assert attach_command("ns", "eth0", "root", spec)[7:8] == ["root"]
    with pytest.raises(FaultError, match="cannot join"):
        parent_for({"kind": "cake", "handle": "1:", "root": True})


def test_a_scenario_step_applies_netem_and_undoes_it() -> None:
    scenario = parse_scenario(
        """
[[step]]
at = "1s"
action = "netem"
links = ["p0:t0a-t1a"]
delay = "5ms"
jitter = "1ms"
loss = "1%"
duration = "2s"
""",
        Fabric(),
    )
    apply, undo = scenario.events
    assert apply.method == "netem" and apply.at == 1.0
    kwargs = dict(apply.kwargs)
    assert parse_spec(kwargs["spec"]) == NetemSpec(delay_s=0.005, jitter_s=0.001, loss=0.01)
    assert undo.method == "unnetem" and undo.at == 3.0
