"""The systemd units: the hardening they promise, `systemd-analyze verify`, and the
exposure `systemd-analyze security` gives them (printed)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support import REPO

ROOT = REPO
UNITS = ROOT / "systemd"
ANALYZE = shutil.which("systemd-analyze")
EXEC = "/usr/local/bin/mrcd"


def directives(path: Path) -> dict[str, dict[str, list[str]]]:
    """section -> key -> values (systemd allows repeated keys)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, {})
            continue
        key, sep, value = line.partition("=")
        assert sep, f"{path.name}: not key=value: {raw!r}"
        out[section].setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize(
    ("unit", "config"),
    [("mrcd.service", "/etc/mrcstack/mrcd.toml"), ("mrcd@.service", "/etc/mrcstack/%i.toml")],
)
def test_units_promise_their_hardening(unit: str, config: str) -> None:
    d = directives(UNITS / unit)
    svc = {k: v[-1] for k, v in d["Service"].items()}
    assert svc["ExecStart"] == f"{EXEC} --config {config}"
    assert set(svc["CapabilityBoundingSet"].split()) == {"CAP_NET_ADMIN", "CAP_NET_RAW"}
    assert set(svc["AmbientCapabilities"].split()) <= {"CAP_NET_ADMIN", "CAP_NET_RAW"}
    assert set(svc["RestrictAddressFamilies"].split()) == {
        "AF_UNIX",
        "AF_INET",
        "AF_INET6",
        "AF_NETLINK",
    }
    for key, value in {
        "NoNewPrivileges": "yes",
        "ProtectSystem": "strict",
        "ProtectHome": "yes",
        "PrivateTmp": "yes",
        "RuntimeDirectory": "mrcstack",
        "Restart": "on-failure",
        "KillSignal": "SIGTERM",
    }.items():
        assert svc.get(key) == value, key
    assert "User" not in svc or svc["User"] == "root"
    assert re.fullmatch(r"\d+s", svc["TimeoutStopSec"]) and re.fullmatch(r"\d+s", svc["RestartSec"])
    assert d["Install"]["WantedBy"] == ["multi-user.target"]


def test_template_differs_only_in_the_instance() -> None:
    plain = (UNITS / "mrcd.service").read_text().splitlines()
    tmpl = (UNITS / "mrcd@.service").read_text().splitlines()
    differ = [(a, b) for a, b in zip(plain, tmpl, strict=False) if a != b]
    assert all("%i" in b or a.startswith("#") for a, b in differ), (
        f"mrcd@.service drifted from mrcd.service: {differ}"
    )


def _analyze(*args: str) -> subprocess.CompletedProcess[str]:
    assert ANALYZE is not None
    return subprocess.run(
        [ANALYZE, *args], capture_output=True, text=True, timeout=120, check=False
    )


def _copies(tmp_path: Path) -> Path:
    """The units with ExecStart pointing at an executable that exists (verify insists)."""
    exe = tmp_path / "mrcd"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    for unit in ("mrcd.service", "mrcd@.service"):
        text = (UNITS / unit).read_text().replace(EXEC, str(exe))
        (tmp_path / unit).write_text(text)
    return tmp_path


@pytest.mark.requires_program("systemd-analyze")
@pytest.mark.parametrize("unit", ["mrcd.service", "mrcd@h0.service"])
def test_systemd_analyze_verify(tmp_path: Path, unit: str) -> None:
    res = _analyze("verify", str(_copies(tmp_path) / unit))
    mentions = [
        line
        for line in (res.stdout + res.stderr).splitlines()
        if "mrcd" in line or str(tmp_path) in line
    ]
    assert res.returncode == 0 and mentions == [], res.stdout + res.stderr


@pytest.mark.requires_program("systemd-analyze")
def test_verify_catches_a_broken_unit(tmp_path: Path) -> None:
    """The check above is worth something: a typo and a missing binary are reported."""
    unit = _copies(tmp_path) / "mrcd.service"
    unit.write_text(
        unit.read_text()
        .replace("NoNewPrivileges=", "NoNewPrivilege=")
        .replace(str(tmp_path / "mrcd"), "/nonexistent/mrcd")
    )
    res = _analyze("verify", str(unit))
    out = res.stdout + res.stderr
    assert "NoNewPrivilege" in out and "/nonexistent/mrcd" in out and res.returncode != 0


@pytest.mark.requires_program("systemd-analyze")
def test_security_exposure_is_low(tmp_path: Path) -> None:
    res = _analyze("security", "--offline=yes", str(_copies(tmp_path) / "mrcd@h0.service"))
    if res.returncode != 0 and "offline" in res.stderr:
        pytest.skip(f"systemd-analyze security --offline unsupported: {res.stderr.strip()}")
    m = re.search(r"Overall exposure level for \S+: ([\d.]+) (\w+)", res.stdout)
    assert m, res.stdout + res.stderr
    print(f"\nsystemd-analyze security: exposure {m.group(1)} {m.group(2)}")
    assert float(m.group(1)) < 5.0, res.stdout  # 2.2 "OK" with systemd 252


def test_the_mapper_unit_runs_mrcmapper_with_no_capability(tmp_path: Path) -> None:
    d = directives(UNITS / "mrcmapper.service")
    svc = {k: v[-1] for k, v in d["Service"].items()}
    assert svc["ExecStart"] == "/usr/local/bin/mrcmapper --config /etc/mrcstack/mrcmapper.toml"
    assert svc["CapabilityBoundingSet"] == "" and svc["AmbientCapabilities"] == ""
    for key in ("NoNewPrivileges", "ProtectHome", "PrivateTmp"):
        assert svc[key] == "yes", key
    assert svc["ProtectSystem"] == "strict" and svc["Restart"] == "on-failure"
    if ANALYZE is None:
        return
    exe = tmp_path / "mrcmapper"
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    unit = tmp_path / "mrcmapper.service"
    unit.write_text(
        (UNITS / "mrcmapper.service").read_text().replace("/usr/local/bin/mrcmapper", str(exe))
    )
    res = _analyze("verify", str(unit))
    mentions = [line for line in (res.stdout + res.stderr).splitlines() if "mrcmapper" in line]
    assert res.returncode == 0 and mentions == [], res.stdout + res.stderr


def test_units_and_readme_describe_memfd_regions() -> None:
    """Regions are sealed memfds passed over the API socket (mrcstack/api/shm.py), not files
    in /dev/shm: nothing here may say otherwise, and the README says what they are."""
    readme = (UNITS / "README.md").read_text()
    assert "sealed memfd" in readme and "SCM_RIGHTS" in readme
    for path in (UNITS / "README.md", UNITS / "mrcd.service", UNITS / "mrcd@.service"):
        for line in path.read_text().splitlines():
            if "/dev/shm" in line:
                assert "no path" in line, f"{path.name}: {line}"
