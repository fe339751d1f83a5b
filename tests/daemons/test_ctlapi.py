"""The controller API and mrcctl against running mrcds (loopback data mode)."""

from __future__ import annotations

import argparse
import asyncio
import errno
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from mrcstack import addrplan
from mrcstack.api import ApiError, AsyncEventType, Controller, QpAttr, WriteWr
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Connection
from mrcstack.core.events import EvState
from mrcstack.core.memory import MemoryTable
from mrcstack.daemons.mrcctl.cli import parser
from mrcstack.daemons.mrcd.node.qps import QpAttrs
from mrcstack.qpn import qpn_text
from tests.support import REPO
from tests.support.apiharness import FABRIC, WAIT, Daemons, connect, drain

ROOT = REPO


def mrcctl(d: Daemons, *args: str, host: int = 0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrcstack.daemons.mrcctl", "--socket", str(d.sockets[host]), *args],
        capture_output=True,
        text=True,
        timeout=WAIT,
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        check=False,
    )


def states(d: Daemons, host: int, qpn: int) -> dict[int, str]:
    rows = d.on_loop(lambda: d.nodes[host].ev_states(qpn))
    return {int(str(r["ev"])): str(r["state"]) for r in rows}


def node_attrs(ev: int, cc: int) -> QpAttrs:
    return QpAttrs(ev_profile_id=ev, cc_profile_id=cc)


def event_for(watcher: Controller, ev: int, state: str) -> dict[str, object]:
    """The stream's next event for ``ev`` entering ``state`` (other EVs' events pass by:
    a DENY swaps a backup EV in, which is an event too)."""
    for _ in range(1000):
        doc = watcher.next_ev_event(timeout=WAIT)
        assert doc is not None, f"no event for {ev:#x} -> {state}"
        if doc["ev"] == ev and doc["state"] == state:
            return doc
    raise AssertionError("event stream never showed it")


def test_capabilities_and_formats(daemons: Daemons) -> None:
    with Controller.open(daemons.sockets[0]) as ctl:
        caps = ctl.query_device()
        assert caps["planes"] == 4 and caps["port_mask"] == 0xF
        assert "uet-1.0-nscc" in caps["cc"]["algorithms"] and "ev_event" in caps["opt"]
        assert "ep_op_ev_probe" in caps["opt"]  # the control channel carries them
        fmt = ctl.ev_format()
        assert fmt["mode"] == "srv6" and fmt["fields"][0] == {"name": "locator_block", "width": 32}
        assert [f["width"] for f in fmt["fields"][1:]] == [16] * addrplan.MAX_USIDS
        assert [f["name"] for f in fmt["ev_fields"]] == ["t1", "plane", "entropy"]
        default = ctl.ev_profile(0)
        assert default["per_destination"] and default["mode"] == "generated"
        with pytest.raises(ApiError, match="no EV format profile 3"):
            ctl.ev_format(3)


def test_port_admin_reaches_the_node_and_the_applications(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16)
    node = daemons.nodes[0]
    with Controller.open(daemons.sockets[0]) as ctl:
        r = ctl.modify_port(2, False)
        assert r == {"port": 2, "admin": "disabled", "link": "up", "state": "down"}
        assert daemons.on_loop(lambda: node.port_admin[2]) is False
        event = a.ctx.get_async_event(timeout=WAIT)
        assert event is not None and (event.type, event.port) == (AsyncEventType.PORT_ERR, 2)
        # Traffic still flows, on the other planes.
        a.qp.post_send(WriteWr(1, (a.mr, 0, 1 << 16), b.mr.addr, b.mr.rkey, imm=1))
        assert drain(a.cq, 1)[0].ok
        ctl.modify_port(2, True)
        event = a.ctx.get_async_event(timeout=WAIT)
        assert event is not None and (event.type, event.port) == (AsyncEventType.PORT_ACTIVE, 2)
        assert [p["state"] for p in ctl.ports()] == ["up"] * 4
        with pytest.raises(ApiError, match=r"port: must be in 0\.\.3"):
            ctl.modify_port(4, False)


def test_changes_need_root(tmp_path: Path) -> None:
    d = Daemons(tmp_path, hosts=(0,), admin_uids=frozenset()).start()  # nobody is admin
    try:
        with Controller.open(d.sockets[0]) as ctl:
            with pytest.raises(ApiError, match="only root") as err:
                ctl.modify_port(0, False)
            assert err.value.errno == errno.EPERM
            with pytest.raises(ApiError, match="only root"):
                ctl.deny(0, [0])
            assert ctl.ports()[0]["admin"] == "enabled"  # queries are open to all
            assert ctl.ev_profiles()[0]["id"] == 0
        result = mrcctl(d, "port", "set", "0", "down")
        assert result.returncode == 1
        assert result.stderr.strip().count("\n") == 0 and "only root" in result.stderr
    finally:
        d.stop()


def test_deny_on_a_running_qp_and_the_ev_event_stream(daemons: Daemons) -> None:
    a, b = connect(daemons, 1 << 16)
    ev = addrplan.ev_value(1, 2)  # plane 1, T1 2
    with Controller.open(daemons.sockets[0]) as watcher, Controller.open(daemons.sockets[0]) as ctl:
        watcher.subscribe_ev_events()
        assert states(daemons, 0, a.qp.qpn)[ev] == "good"
        r = ctl.deny(0, [ev])
        assert r["changed"] == 1
        assert states(daemons, 0, a.qp.qpn)[ev] == "denied"
        # Data keeps flowing around the denied path.
        a.qp.post_send(WriteWr(1, (a.mr, 0, 1 << 16), b.mr.addr, b.mr.rkey, imm=1))
        assert drain(a.cq, 1)[0].ok
        assert ev in ctl.ev_profile(0)["denied"]
        rows = ctl.ev_states(qpn=a.qp.qpn)
        assert {r["ev"]: r["state"] for r in rows}[ev] == "denied"
        # The default event mask is GOOD and ASSUMED_BAD: allowing again is ASSUMED_BAD.
        ctl.allow(0, [ev])
        doc = event_for(watcher, ev, "assumed_bad")
        assert (doc["port"], doc["old_state"], doc["reason"]) == (1, "denied", "controller")
        assert doc["qpn"] == a.qp.qpn and doc["profile_id"] == 0 and doc["events_dropped"] == 0
        # Widen the mask: DENIED events now stream too.
        ctl.modify_ev_profile(0, event_mask=["good", "assumed_bad", "denied"])
        ctl.deny(0, [ev])
        assert event_for(watcher, ev, "denied")["old_state"] == "assumed_bad"
        assert any(e["state"] == "denied" for e in ctl.recent_ev_events())
        # New QPs on the profile start with the DENY set applied.
        c, _d = connect(daemons, 4096, service=8)
        assert states(daemons, 0, c.qp.qpn)[ev] == "denied"


def test_ev_and_cc_profiles_for_new_qps(daemons: Daemons) -> None:
    with Controller.open(daemons.sockets[0]) as ctl, Controller.open(daemons.sockets[3]) as ctl3:
        explicit = [(addrplan.ev_value(p, t), p) for p in range(4) for t in range(2)]
        r = ctl.create_ev_profile(1, evs=explicit, ev_min_active=2)
        assert (r["mode"], r["ev_count"], r["ev_min_active"]) == ("explicit", 8, 2)
        gen = ctl.create_ev_profile(2, fields={"t1": {"min": 0, "max": 1}, "entropy": {"max": 1}})
        assert gen["ev_count"] == 2 * 4 * 2 and len(ctl.ev_profile(2)["evs"]) == 16
        for c in (ctl, ctl3):
            c.create_cc_profile(
                1, "uet-1.0-nscc", base_rtt=100e-6, max_cwnd=1 << 20, disable_qa=True
            )
            c.create_ev_profile(1, evs=explicit, ev_min_active=2)
        assert ctl.cc_profile(1)["config"]["base_rtt"] == 100e-6
        a, b = connect(daemons, 1 << 16, attr=QpAttr(ev_profile_id=1, cc_profile_id=1))
        assert a.qp.query().attr.ev_profile_id == 1
        assert ctl.ev_profile(1)["qps"] == [a.qp.qpn]
        with pytest.raises(ApiError, match="used by QPs") as err:
            ctl.create_ev_profile(1, evs=explicit)
        assert err.value.errno == errno.EBUSY
        with pytest.raises(ApiError, match="used by QPs"):
            ctl.destroy_cc_profile(1)
        a.qp.post_send(WriteWr(1, (a.mr, 0, 1 << 16), b.mr.addr, b.mr.rkey, imm=7))
        assert drain(a.cq, 1)[0].ok
        ctl.modify_ev_profile(1, ev_min_active=3)
        conn = daemons.nodes[0].qps[a.qp.qpn].conn
        assert conn is not None and daemons.on_loop(lambda: conn.ev_min_active) == 3
        # Bad profiles are refused with the reason.
        with pytest.raises(ApiError, match="encodes plane 0, not port 1"):
            ctl.create_ev_profile(5, evs=[(addrplan.ev_value(0, 0), 1)])
        with pytest.raises(ApiError, match="names T1 9"):
            ctl.create_ev_profile(5, evs=[(addrplan.ev_value(0, 9), 0)])
        with pytest.raises(ApiError, match=r"fields\.t1\.max: must be in 0\.\.3, got 9"):
            ctl.create_ev_profile(5, fields={"t1": {"max": 9}})
        with pytest.raises(ApiError, match=r"generate 65536 EVs, at most 4096") as err:
            ctl.create_ev_profile(5, fields={"entropy": {"max": 4095}})
        assert err.value.errno == errno.E2BIG
        with pytest.raises(ApiError, match=r"config\.gamma: a constant"):
            ctl.create_cc_profile(6, gamma=0.5)
        with pytest.raises(ApiError, match="algorithm: 'cubic'"):
            ctl.create_cc_profile(6, "cubic")
        with pytest.raises(ApiError, match="is not in EV profile 1"):
            ctl.deny(1, [addrplan.ev_value(0, 3)])
        ctl.destroy_ev_profile(2)
        assert [p["id"] for p in ctl.ev_profiles()] == [0, 1]


def test_endpoint_operations_over_the_control_channel(daemons: Daemons) -> None:
    with Controller.open(daemons.sockets[0]) as ctl:
        r = ctl.probe(3, plane=2, ev=addrplan.ev_value(2, 1))
        assert r["timed_out"] == [] and r["errors"] == {}
        (rsp,) = r["responses"]
        assert rsp["rtt"] > 0 and rsp["port"] == 2 and rsp["via"] == "data"
        expected = addrplan.address(daemons.nodes[0].fabric, 0, 3, 2, addrplan.ev_value(2, 1))
        assert rsp["path"] == str(expected)
        r = ctl.port_status_update(3, 0b1011)
        assert r["responses"][0]["rtt"] > 0 and r["responses"][0]["via"] == "control"
        with pytest.raises(ApiError, match="is this host"):
            ctl.probe(0, plane=0, ev=0)
        r = ctl.probe(3, plane=1, ev=addrplan.ev_value(2, 0))  # EV of another plane
        assert "plane 2, not plane 1" in next(iter(r["errors"].values()))
    # docs/api.md says what carries each operation, as the responses do.
    doc = (ROOT / "docs" / "api.md").read_text()
    ops = doc[doc.index("**Endpoint operations**") :].split("\n\n", 1)[0]
    assert 'says `"via": "data"`' in ops and 'PORT_STATUS message (`"via": "control"`)' in ops
    assert "PING" not in doc


def test_mrcctl_cli(daemons: Daemons) -> None:
    caps = mrcctl(daemons, "--json", "caps")
    assert caps.returncode == 0, caps.stderr
    assert json.loads(caps.stdout)["planes"] == 4
    human = mrcctl(daemons, "caps")
    assert "4 ports" in human.stdout
    r = mrcctl(daemons, "port", "set", "1", "down")
    assert r.returncode == 0 and "port 1: admin disabled" in r.stdout
    assert daemons.on_loop(lambda: daemons.nodes[0].port_admin[1]) is False
    shown = json.loads(mrcctl(daemons, "--json", "port", "show").stdout)
    assert shown[1]["admin"] == "disabled"
    assert mrcctl(daemons, "port", "set", "1", "up").returncode == 0
    assert daemons.on_loop(lambda: daemons.nodes[0].port_admin[1]) is True
    fmt = mrcctl(daemons, "ev", "format")
    assert "srv6" in fmt.stdout and "t1 bits 0-7" in fmt.stdout
    created = mrcctl(
        daemons, "--json", "ev", "profile", "create", "4", "--t1", "0-1", "--plane", "0-3"
    )
    assert created.returncode == 0, created.stderr
    assert json.loads(created.stdout)["ev_count"] == 8
    assert mrcctl(daemons, "ev", "profile", "deny", "4", "0x100").returncode == 0
    show = mrcctl(daemons, "ev", "profile", "show", "4")
    assert "denied: 0x100" in show.stdout
    assert "no connected QPs" in mrcctl(daemons, "ev", "states").stdout
    cc = mrcctl(
        daemons, "--json", "cc", "profile", "create", "3", "base_rtt=150us", "max_cwnd=2MiB"
    )
    assert cc.returncode == 0, cc.stderr
    assert json.loads(cc.stdout)["config"]["max_cwnd"] == 2 << 20
    probe = mrcctl(daemons, "probe", "h3")
    assert probe.returncode == 0 and probe.stdout.count(" seq 1: rtt ") == 4
    assert mrcctl(daemons, "port", "notify", "h3").returncode == 0
    # Bad input: one line on stderr, non-zero exit.
    for args, code, needle in (
        (("port", "set", "9", "down"), 1, "port: must be in 0..3"),
        (("port", "set", "x", "down"), 2, "not a number"),
        (("port", "set", "1", "sideways"), 2, "invalid choice"),
        (("frobnicate",), 2, "invalid choice"),
        (("cc", "profile", "create", "7", "base_rtt"), 2, "NAME=VALUE"),
        (("cc", "profile", "create", "7", "gamma=1"), 1, "constant"),
        (("ev", "profile", "show", "99"), 1, "no EV profile 99"),
    ):
        r = mrcctl(daemons, *args)
        assert r.returncode == code, (args, r.stdout, r.stderr)
        assert r.stderr.count("\n") == 1 and needle in r.stderr, (args, r.stderr)
    missing = subprocess.run(
        [sys.executable, "-m", "mrcstack.daemons.mrcctl", "--socket", "/nonexistent.sock", "caps"],
        capture_output=True, text=True, timeout=WAIT, cwd=ROOT, check=False,
    )  # fmt: skip
    assert missing.returncode == 1 and missing.stderr.count("\n") == 1
    assert "cannot connect to mrcd at /nonexistent.sock" in missing.stderr


def test_mrcctl_qp_show_reports_each_qps_retry_budget(daemons: Daemons) -> None:
    """The budget shown is the formula of the QP's attributes and its current RTO."""
    a, _b = connect(daemons, 4096, service=21)
    shown = json.loads(mrcctl(daemons, "--json", "qp", "show", str(a.qp.qpn)).stdout)
    assert shown["qpn"] == a.qp.qpn and shown["state"] == "rts" and shown["remote_host"] == "h3"
    assert shown["peer_instance"] == daemons.on_loop(lambda: daemons.nodes[3].instance)
    base, lin, exp = shown["rto"], shown["linear_cnt"], shown["exp_cnt"]
    expected = base * (lin + 1) + sum(min(shown["max_rto"], base * 2**k) for k in range(1, exp + 1))
    assert shown["retry_budget"] == pytest.approx(expected)
    cwnd = daemons.on_loop(lambda: daemons.nodes[0].qp(a.qp.qpn).conn.cc.cwnd)  # type: ignore[union-attr]
    assert (shown["cwnd"], shown["in_flight"]) == (cwnd, 0)  # (nothing sent yet)
    human = mrcctl(daemons, "qp", "show")
    assert human.returncode == 0 and "budget_ms" in human.stdout
    assert "inflight/cwnd_kib" in human.stdout and f"0/{cwnd >> 10}" in human.stdout.split()
    assert f"{qpn_text(a.qp.qpn)}  rts" in human.stdout
    missing = mrcctl(daemons, "qp", "show", "1")
    assert missing.returncode == 1 and "no QP 0x000001" in missing.stderr


def test_mrcctl_follows_ev_events(daemons: Daemons) -> None:
    a, _b = connect(daemons, 4096)
    ev = addrplan.ev_value(3, 0)
    follow = subprocess.Popen(
        [sys.executable, "-m", "mrcstack.daemons.mrcctl", "--socket", str(daemons.sockets[0]),
         "--json", "ev", "events", "--follow", "--count", "1"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    try:
        with Controller.open(daemons.sockets[0]) as ctl:
            ctl.deny(0, [ev])

            async def subscribed() -> None:  # mrcctl has subscribed: now cause the event
                while len(daemons.servers[0].controller.subscribers) < 1:
                    await asyncio.sleep(0.005)

            daemons.run(subscribed(), WAIT)
            ctl.allow(0, [ev])
        out, err = follow.communicate(timeout=WAIT)
        assert follow.returncode == 0, err
        doc = json.loads(out.strip().splitlines()[-1])
        assert (doc["ev"], doc["state"], doc["qpn"]) == (ev, "assumed_bad", a.qp.qpn)
        recent = mrcctl(daemons, "ev", "events")
        assert f"ev={ev:#x}" in recent.stdout and "denied->assumed_bad" in recent.stdout
    finally:
        if follow.poll() is None:
            follow.kill()
            follow.wait()


def test_profiles_give_node_ready_its_connection_settings(daemons: Daemons) -> None:
    """What Node.ready builds a connection with, from the QP's profiles."""
    with Controller.open(daemons.sockets[0]) as ctl:
        explicit = [(addrplan.ev_value(p, 1), p) for p in range(4)]
        ctl.create_ev_profile(1, evs=explicit, ev_min_active=2)
        ctl.deny(1, [explicit[0][0]])
        ctl.create_cc_profile(1, "uet-1.0-nscc", base_rtt=50e-6, qa_gate=4)
    store = daemons.servers[0].controller.profiles
    fields = store.config_fields(node_attrs(ev=1, cc=1), 0, 3)
    assert [(e.value, e.port) for e in fields["evs"]] == explicit
    assert fields["denied"] == frozenset({explicit[0][0]}) and fields["ev_min_active"] == 2
    assert fields["cc"] == "nscc" and fields["cc_params"].base_rtt == 50e-6
    default = store.config_fields(node_attrs(ev=0, cc=0), 0, 3)
    assert default["evs"] == addrplan.ev_profile(FABRIC, 0, 3, 128)
    config = ConnectionConfig(local_qpn=1, remote_qpn=2, planes=4, **fields)
    conn = Connection(config, memory=MemoryTable(), rng=random.Random(1), now=0.0)
    states = {ev.value: ev.state for ev in conn.ev_states()}
    assert states[explicit[0][0]] is EvState.DENIED


def test_mrcctl_has_iproute2s_habits(daemons: Daemons) -> None:
    """An object alone shows it, plurals work, a QPN is hex wherever printed and read in
    either form, and every flag says what it does."""
    a, _b = connect(daemons, 4096, service=23)
    hexqpn = qpn_text(a.qp.qpn)
    for args, needle in (
        (("port",), "port  admin"),
        (("ports",), "port  admin"),
        (("ev",), f"{hexqpn}  0x"),
        (("evs", "--qp", str(a.qp.qpn)), f"{hexqpn}  0x"),
        (("ev", "show", "--qp", hexqpn), f"{hexqpn}  0x"),
        (("qp",), f"{hexqpn}  rts"),
        (("qps",), f"{hexqpn}  rts"),
        (("qp", hexqpn), f"{hexqpn}  rts"),
        (("qp", str(a.qp.qpn)), f"{hexqpn}  rts"),
        (("cc",), "CC profile 0:"),
        (("ev", "profiles"), "id  mode"),
        (("ev", "profile", "0"), "EV profile 0:"),
    ):
        r = mrcctl(daemons, *args)
        assert r.returncode == 0 and needle in r.stdout, (args, r.stdout, r.stderr)
    assert f"QPs: {hexqpn}" in mrcctl(daemons, "ev", "profile", "show", "0").stdout
    bad = mrcctl(daemons, "qp", "show", "0xzz")
    assert bad.returncode == 2 and "not a QPN" in bad.stderr

    def undocumented(p: argparse.ArgumentParser, path: str) -> list[str]:
        out = []
        for action in p._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, child in action.choices.items():
                    out += undocumented(child, f"{path} {name}")
            elif not action.help and not isinstance(action, argparse._HelpAction):
                out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return out

    assert undocumented(parser(), "mrcctl") == []


def test_mrcctl_probe_counts_like_ping(daemons: Daemons) -> None:
    """-c N probes each plane N times, a line each, then min/avg/max and loss per plane
    and EV; a plane that never answers is named with its EV and path, and fails the run."""
    r = mrcctl(daemons, "probe", "h3", "-c", "3", "-i", "0.05")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for plane in range(4):
        ev = addrplan.ev_value(plane, 0)
        path = addrplan.address(FABRIC, 0, 3, plane, ev)
        probes = [x for x in lines if x.startswith(f"h3 plane {plane} ev {ev:#05x} seq ")]
        assert len(probes) == 3 and all(f"ms via data, path {path}" in x for x in probes)
        [summary] = [x for x in lines if x.startswith(f"plane {plane} ev {ev:#05x}: ")]
        assert "3 sent, 3 answered, 0% loss, rtt min/avg/max " in summary
    doc = json.loads(mrcctl(daemons, "--json", "probe", "h3", "-c", "2", "-i", "0.05").stdout)
    assert len(doc["probes"]) == 8 and [s["answered"] for s in doc["summary"]] == [2] * 4
    assert all(s["rtt_min"] <= s["rtt_avg"] <= s["rtt_max"] for s in doc["summary"])
    r = mrcctl(daemons, "probe", "h1", "--plane", "2", "-c", "2", "-i", "0.05", "--timeout", "0.3")
    ev = addrplan.ev_value(2, 0)  # no mrcd runs on h1: nothing answers
    path = addrplan.address(FABRIC, 0, 1, 2, ev)
    assert r.returncode == 1, r.stdout
    assert f"h1 plane 2 ev {ev:#05x} seq 2: no answer in 0.3 s, path {path}" in r.stdout
    assert f"plane 2 ev {ev:#05x}: 2 sent, 0 answered, 100% loss, path {path}" in r.stdout
