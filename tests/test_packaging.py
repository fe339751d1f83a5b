"""The installed package is the product: a non-editable wheel in a fresh virtual environment
works from any directory, and it installs exactly one top-level import package.

The wheel is built from this checkout and installed without dependencies into a new venv;
the dependencies (scapy, uvloop, ...) come from the development venv through a path entry,
so nothing is downloaded, and the checkout itself is never on the path.
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.support import REPO

ROOT = REPO
SCRIPTS = (
    "mrcstack",
    "mrcstack-sim",
    "mrcd",
    "mrcmapper",
    "mrcctl",
    "mrc-write-bw",
    "mrc-write-lat",
)
pytestmark = pytest.mark.slow


def run(argv: list[str], cwd: Path | str = "/") -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(ROOT)])
    assert proc.returncode == 0, proc.stderr[-2000:]
    [built] = out.glob("mrcstack-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = tmp_path_factory.mktemp("venv") / "v"
    assert run([sys.executable, "-m", "venv", "--without-pip", str(env)]).returncode == 0
    python = env / "bin" / "python"
    proc = run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps",
         str(wheel)]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    site = run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
    # The dependencies, from the development venv: a plain path entry (its .pth files, such
    # as the editable install's finder, are not processed), after the fresh venv's own.
    Path(site.stdout.strip(), "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return env


def test_the_wheel_has_one_top_level_package(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        names = set(z.namelist())
    assert {t for t in tops if not t.endswith(".dist-info")} == {"mrcstack"}
    for data in (
        "mrcstack/netns/bpf/trim.c",
        "mrcstack/examples/fabric-default.toml",
        "mrcstack/examples/fabric-large.toml",
        "mrcstack/examples/scenario-flap.toml",
        "mrcstack/systemd/mrcd.service",
        "mrcstack/systemd/mrcd@.service",
        "mrcstack/systemd/mrcmapper.service",
        "mrcstack/wireshark/mrc.lua",
        "mrcstack/monitoring/grafana-dashboard.json",
        "mrcstack/monitoring/prometheus-alerts.yml",
    ):
        assert data in names, data


def test_every_console_script_runs_from_root(venv: Path) -> None:
    for script in SCRIPTS:
        proc = run([str(venv / "bin" / script), "--version"])
        assert proc.returncode == 0, (script, proc.stderr)
        assert "0." in proc.stdout, (script, proc.stdout)
    for args in (["testbed", "--help"], ["fault", "--help"], ["sim", "--bytes", "1MiB"]):
        proc = run([str(venv / "bin" / "mrcstack"), *args])
        assert proc.returncode == 0, (args, proc.stderr)


def test_the_installed_package_is_not_the_checkout(venv: Path) -> None:
    code = (
        "import mrcstack, mrcstack.netns.trim as t, mrcstack.daemons.mrcd as d;"
        "print(mrcstack.__file__); print(t.SOURCE.is_file()); print(d.__file__)"
    )
    proc = run([str(venv / "bin" / "python"), "-c", code])
    assert proc.returncode == 0, proc.stderr
    pkg, source_ok, mrcd = proc.stdout.split()
    assert pkg.startswith(str(venv)) and mrcd.startswith(str(venv))
    assert source_ok == "True"


def test_shipped_files_are_found_by_name_from_anywhere(venv: Path) -> None:
    mrcstack = str(venv / "bin" / "mrcstack")
    listing = run([mrcstack, "files"])
    assert listing.returncode == 0
    assert "examples/fabric-large.toml" in listing.stdout
    assert "systemd/mrcd@.service" in listing.stdout
    assert "wireshark/mrc.lua" in listing.stdout
    assert "monitoring/grafana-dashboard.json" in listing.stdout
    assert "monitoring/prometheus-alerts.yml" in listing.stdout
    assert "examples/scenarios/incast.toml" in listing.stdout  # subfolders too
    scenario = run([mrcstack, "files", "ring-allreduce.toml"])
    assert scenario.returncode == 0 and "[[collective]]" in scenario.stdout
    unit = run([mrcstack, "files", "mrcd@.service"])
    assert unit.returncode == 0 and "[Service]" in unit.stdout
    missing = run([mrcstack, "files", "nope.toml"])
    assert missing.returncode == 1 and "no such shipped file" in missing.stderr
    code = (
        "from mrcstack.fabric import Fabric;print(Fabric.load('examples/fabric-large.toml').planes)"
    )
    proc = run([str(venv / "bin" / "python"), "-c", code])
    assert proc.returncode == 0 and proc.stdout.strip() == "8", proc.stderr
