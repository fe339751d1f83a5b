"""mrcmapper and mrcd's probing agents without a fabric (loopback: a probe comes straight
back to its own socket): sessions authenticated as the control channel is, reports,
denylists through every mrcd's controller API, refusals counted, fail static, a restarted
mapper that keeps what the hosts deny, and the commands' one-line errors."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from mrcstack import addrplan
from mrcstack.api import Controller
from mrcstack.daemons.mrcd.agent.linkprobes import LinkProbes
from mrcstack.daemons.mrcd.config import (
    AuthConfig,
    MapperAgentConfig,
    MrcdConfig,
    MrcdConfigError,
)
from mrcstack.daemons.mrcd.control.auth import Credentials
from mrcstack.daemons.mrcmapper.config import MapperConfig
from mrcstack.mapper import messages
from mrcstack.mapper.agent import ProbeAgent
from mrcstack.mapper.localize import Params
from mrcstack.mapper.plan import make_plan
from tests.support import REPO
from tests.support.apiharness import FABRIC, WAIT, Daemons, connect
from tests.support.isolation import free_base
from tests.support.mapping import HandAgent

HELD = "p1:t0a-t1c"


def _config(hold_down: float = 30.0) -> MapperConfig:
    return MapperConfig(
        fabric=FABRIC,
        auth=AuthConfig(mode="psk", psk_file=Path("/nonexistent")),  # the harness's key
        params=replace(Params(), hold_down=hold_down),
    )


@pytest.fixture
def mapped(tmp_path: Path) -> Iterator[Daemons]:
    """h0 and h3 with their probing agents, and a mapper (hold-down 30 s)."""
    d = Daemons(tmp_path, mapper=_config())
    try:
        yield d.start()
    finally:
        d.stop()


def until(check: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.02)
    raise AssertionError(f"not within {WAIT} s: {what}")


def status(d: Daemons) -> dict[str, Any]:
    assert d.mapper is not None
    return d.on_loop(d.mapper.status)


def agents(d: Daemons) -> dict[str, dict[str, Any]]:
    return {a["host"]: a for a in status(d)["agents"]}


def scrape(d: Daemons) -> str:
    assert d.mapper_web is not None
    with urllib.request.urlopen(d.mapper_web.url, timeout=WAIT) as resp:
        return resp.read().decode()


def hand(d: Daemons, host: str = "h1", psk: bytes | None = None) -> HandAgent:
    key = bytes.fromhex((d.tmp / "cluster.key").read_text()) if psk is None else psk
    return HandAgent(Credentials.from_psk(host, key), ("::1", d.mapper_port))


def hold(d: Daemons, links: list[str]) -> HandAgent:
    """A hand-made h1 that says it holds ``links`` from another mapper: the mapper takes
    them as HELD and pushes them to every agent."""
    agent = hand(d)

    async def go() -> None:
        await agent.connect()
        held = messages.Denylist(4, "an-older-mapper", frozenset(links))
        await agent.send(messages.hello(0, 1, d.mapper.plan.digest, 0.01, held))  # type: ignore[union-attr]
        assert (await agent.recv() or {}).get("type") == "denylist"

    d.run(go())
    return agent


def denylist(d: Daemons, host: int) -> dict[str, Any]:
    with Controller.open(d.sockets[host]) as ctl:
        return ctl.link_denylist()


def test_agents_report_and_the_mapper_judges_every_link(mapped: Daemons) -> None:
    until(lambda: all(a["reports"] > 5 for h, a in agents(mapped).items() if h in ("h0", "h3")),
          "reports from h0 and h3")  # fmt: skip
    doc = status(mapped)
    assert doc["denylist"] == {**doc["denylist"], "version": 0, "links": []}
    assert {link["state"] for link in doc["links"]} == {"up"}
    assert len(doc["links"]) == len(addrplan.fabric_links(FABRIC))
    h0 = next(link for link in doc["links"] if link["link"] == "p0:h0-t0a")
    assert h0["probes"] > 0 and h0["loss"] == 0.0 and h0["rtt_s"] is not None
    assert agents(mapped)["h1"]["connected"] is False  # no mrcd there
    page = scrape(mapped)
    assert 'mrc_link_state{a="p0-t0a",b="p0-t1c",plane="0"} 0.0' in page
    assert 'mrc_agent_connected{host="h0"} 1.0' in page
    assert "mrc_link_probe_loss_ratio{" in page and "mrc_link_rtt_seconds{" in page
    assert "\nprocess_cpu_seconds_total " in page and "python_gc_collections_total{" in page
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=page, text=True,
                               capture_output=True, timeout=WAIT, check=False)  # fmt: skip
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_denied_link_reaches_every_mrcd_and_every_qp(mapped: Daemons) -> None:
    a, _ = connect(mapped, 4096)
    hold(mapped, [HELD])
    for host in (0, 3):
        got = until(lambda h=host: denylist(mapped, h)["links"] == [HELD] and denylist(mapped, h),
                    f"h{host} holds the denylist")  # fmt: skip
        assert got["source"].startswith("mapper ") and got["version"] == 1
    rows = mapped.on_loop(lambda: mapped.nodes[0].ev_states(a.qp.qpn))
    over = {int(str(r["ev"])) for r in rows if str(r["state"]) == "denied"}
    assert over and all(
        HELD in addrplan.path(FABRIC, 0, 3, ev >> 8 & 0xF, ev).physical_links for ev in over
    )
    until(lambda: agents(mapped)["h0"]["current"] and agents(mapped)["h0"]["denied_evs"],
          "h0 says what it denied")  # fmt: skip
    assert agents(mapped)["h0"]["denied_evs"] == len(over)
    doc = status(mapped)
    link = next(lk for lk in doc["links"] if lk["link"] == HELD)
    assert link["state"] == "held" and doc["denylist"]["links"] == [HELD]
    assert 'mrc_link_state{a="p1-t0a",b="p1-t1c",plane="1"} 1.0' in scrape(mapped)
    assert f'mrc_host_denied_evs{{host="h0"}} {len(over)}.0' in scrape(mapped)


def test_mapper_status_and_picture_commands(mapped: Daemons, tmp_path: Path) -> None:
    hold(mapped, [HELD])
    until(lambda: agents(mapped)["h3"]["current"] and agents(mapped)["h3"]["applied_version"],
          "h3 holds the denylist")  # fmt: skip
    url = mapped.mapper_web.url.removesuffix("/metrics")  # type: ignore[union-attr]
    env = os.environ | {"PYTHONPATH": str(REPO)}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "mrcstack", "mapper", *args]
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=WAIT, check=False
        )

    shown = cli("status", "--url", url)
    assert shown.returncode == 0, shown.stderr
    line = next(ln for ln in shown.stdout.splitlines() if ln.strip().startswith(HELD))
    assert "held" in line and "EVs denied on h0 h3" in line
    assert "plane 1: 12 links: 1 held, 11 up" in shown.stdout
    assert json.loads(cli("status", "--url", url, "--json").stdout)["denylist"]["links"] == [HELD]
    png = tmp_path / "fabric.png"
    drawn = cli("picture", "--url", url, "--out", str(png))
    assert (
        drawn.returncode == 0
        and png.read_bytes().startswith(b"\x89PNG")
        and png.stat().st_size > 10_000
    )
    nobody = cli("status", "--url", "http://[::1]:1")
    assert (
        nobody.returncode == 1 and nobody.stderr.count("\n") == 1 and "no answer" in nobody.stderr
    )


def test_forged_replayed_and_impersonating_agents_are_refused_and_counted(mapped: Daemons) -> None:
    plan = mapped.mapper.plan  # type: ignore[union-attr]

    async def scenarios() -> None:
        replayer = hand(mapped)
        await replayer.connect()
        await replayer.send(messages.hello(0, 1, plan.digest, 0.01, None))
        share = [p.ident for p in plan.share(1)]
        frame = await replayer.send({"type": "report", "results": [[share[0], 1, 0, 0, 50]]})
        await replayer.send_raw(frame)  # the same record again
        assert await replayer.closed()
        forger = hand(mapped)
        await forger.connect()
        frame = bytearray(forger.frame(messages.hello(0, 1, plan.digest, 0.01, None)))
        frame[-1] ^= 1  # the tag no longer verifies
        await forger.send_raw(bytes(frame))
        assert await forger.closed()
        liar = hand(mapped)
        await liar.connect()
        await liar.send(messages.hello(0, 2, plan.digest, 0.01, None))  # h1 says it is h2
        assert await liar.closed()
        thief = hand(mapped)
        await thief.connect()
        await thief.send(messages.hello(0, 1, plan.digest, 0.01, None))
        other = plan.share(2)[0].ident  # a loop of h2's: lost results would condemn its links
        await thief.send({"type": "report", "results": [[other, 5, 5, 5, 0]]})
        assert await thief.closed()
        stranger = hand(mapped, psk=os.urandom(32))
        with pytest.raises(ConnectionError):
            await stranger.connect()

    mapped.run(scenarios())
    rejected = until(lambda: status(mapped)["counters"]["rejected"].get("bad_mac") and
                     status(mapped)["counters"]["rejected"], "the stranger counted")  # fmt: skip
    assert rejected["sequence"] == 1 and rejected["decrypt"] == 1 and rejected["identity"] == 2
    assert rejected["bad_mac"] == 1
    assert {lk["state"] for lk in status(mapped)["links"]} == {"up"}  # nothing condemned
    page = scrape(mapped)
    for reason in ("sequence", "decrypt", "identity", "bad_mac"):
        assert f'mrc_mapper_rejected_total{{reason="{reason}"}}' in page


def test_forged_replayed_and_misrouted_probe_answers_are_refused(tmp_path: Path) -> None:
    plan = make_plan(FABRIC)
    port = free_base((0,), FABRIC.planes)
    probes = LinkProbes(FABRIC, 0, MapperAgentConfig(("::1", 1), probe_port=port),
                        loopback=True, clock=time.monotonic_ns)  # fmt: skip
    agent = ProbeAgent(plan.share(0), timeout=5.0)
    try:
        sent = agent.next_round(0.0)
        assert probes.send(sent) == len(sent)
        time.sleep(0.05)
        captured: dict[int, list[bytes]] = {}
        for plane, sock in enumerate(probes.sockets):  # take the probes off the wire
            sock.setblocking(False)
            while True:
                try:
                    captured.setdefault(plane, []).append(sock.recv(2048))
                except BlockingIOError:
                    break
        assert sum(len(v) for v in captured.values()) == len(sent)
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as wire:
            genuine = captured[0][0]
            for data in (genuine, genuine):  # once genuine, then a replay
                wire.sendto(data, probes.address(0))
            wire.sendto(genuine, probes.address(1))  # plane 0's probe into plane 1
            wire.sendto(genuine[:-1] + bytes([genuine[-1] ^ 1]), probes.address(2))  # forged
            wire.sendto(b"\x00" * 40, probes.address(3))  # not even a probe
            time.sleep(0.05)
        assert probes.drain(agent, 0.001) == 1
        assert probes.refused == {
            "link_probe_replayed": 1,
            "link_probe_misrouted": 1,
            "link_probe_forged": 2,
        }
    finally:
        probes.close()


def test_without_a_mapper_the_hosts_keep_their_denylist_and_a_new_one_keeps_it(
    mapped: Daemons,
) -> None:
    connect(mapped, 4096)
    old = hold(mapped, [HELD])
    until(lambda: denylist(mapped, 0)["links"] == [HELD], "h0 denies")
    old.close()
    mapped.run(mapped.stop_mapper())
    assert denylist(mapped, 0)["links"] == [HELD]  # fail static
    until(lambda: not mapped.agents[0].snapshot().connected, "h0 saw the mapper go")
    time.sleep(0.5)
    assert denylist(mapped, 0)["links"] == [HELD] and denylist(mapped, 3)["links"] == [HELD]
    mapped.run(mapped.start_mapper())  # a new mapper knows nothing: it learns from the hosts
    until(lambda: agents(mapped)["h0"]["connected"] and agents(mapped)["h3"]["connected"],
          "the agents are back")  # fmt: skip
    until(lambda: agents(mapped)["h0"]["current"] and agents(mapped)["h0"]["applied_version"],
          "h0 took the new mapper's list")  # fmt: skip
    doc = status(mapped)
    assert doc["denylist"]["links"] == [HELD]
    assert next(lk for lk in doc["links"] if lk["link"] == HELD)["state"] == "held"
    for host in (0, 3):
        assert denylist(mapped, host)["links"] == [HELD]
    assert mapped.agents[0].snapshot().sessions >= 2


def test_a_held_link_comes_back_after_the_hold_down(tmp_path: Path) -> None:
    d = Daemons(tmp_path, mapper=_config(hold_down=0.5)).start()
    try:
        hold(d, [HELD])
        until(lambda: denylist(d, 0)["links"] == [HELD], "h0 denies")
        until(lambda: d.mapper_tick() or denylist(d, 0)["links"] == [], "h0 allows it again")
        assert [h["state"] for h in status(d)["history"]] == ["held", "up"]
    finally:
        d.stop()


def _mrcmapper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mrcstack.daemons.mrcmapper.main", *args],
        capture_output=True, text=True, timeout=WAIT, check=False,
        env=os.environ | {"PYTHONPATH": str(REPO)},
    )  # fmt: skip


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[mrcmapper]\nlisten_adress = '[::1]:1'\n", "mrcmapper.listen_adress: unknown key"),
        ("[mrcmapper]\nhold_down = -1\n", "mrcmapper.hold_down: must be a number"),
        ("[mrcmapper]\noverlap = 0\n", "mrcmapper.overlap: must be an integer in 1..16"),
        ("[mrcmapper]\nlisten_address = 'nowhere'\n", "mrcmapper.listen_address: not an address"),
        ("[mrcmapper]\n[mrcmapper.auth]\nmode = 'psk'\n", "mrcmapper.auth.psk_file: required"),
        ("[fabric]\nplanes = 0\n[mrcmapper]\n", "fabric.planes"),
        ("[mrcmapper.auth]\nmode = 'x'\n", "mrcmapper.auth.mode"),
    ],
)
def test_a_bad_config_is_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "mapper.toml"
    path.write_text(text)
    done = _mrcmapper("--config", str(path), "--check")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert message in done.stderr


def test_check_version_and_a_missing_key_file(tmp_path: Path) -> None:
    assert _mrcmapper("--version").stdout.startswith("mrcmapper (mrcstack) ")
    path = tmp_path / "mapper.toml"
    path.write_text(f"[mrcmapper]\n[mrcmapper.auth]\npsk_file = '{tmp_path / 'none.key'}'\n")
    done = _mrcmapper("--config", str(path), "--check")
    assert done.returncode == 2 and "mrcmapper.auth.psk_file" in done.stderr
    (tmp_path / "none.key").write_text(os.urandom(32).hex())
    ok = _mrcmapper("--config", str(path), "--check")
    assert ok.returncode == 0 and "ok (4 hosts, 4 planes)" in ok.stdout


def test_the_agent_config_is_checked_in_one_line() -> None:
    base = "[mrcd]\nhost = 0\n[mrcd.auth]\npsk_file = '/k'\n[mrcd.mapper]\nenabled = true\n"
    with pytest.raises(MrcdConfigError, match=r"mrcd\.mapper\.address: missing"):
        MrcdConfig.from_toml(base)
    with pytest.raises(MrcdConfigError, match=r"mrcd\.mapper\.interval: must be a number"):
        MrcdConfig.from_toml(base + "address = '[::1]:1'\ninterval = 'fast'\n")
    with pytest.raises(MrcdConfigError, match=r"mrcd\.mapper\.intervall: unknown key"):
        MrcdConfig.from_toml(base + "intervall = 1\n")
    cfg = MrcdConfig.from_toml(base + "address = '[fd00::1]:4793'\n")
    assert cfg.mapper is not None and cfg.mapper.interval == 0.01
    assert MrcdConfig.from_toml(base.replace("true", "false")).mapper is None
