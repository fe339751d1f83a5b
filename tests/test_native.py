"""The per-packet modules compiled with mypyc (mrcstack.native): the build is what runs, a
stale or unwanted build is passed over for the Python source, and both copies behave alike."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import os
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from mrcstack import native
from mrcstack.core import sender
from mrcstack.core.config import ConnectionConfig
from mrcstack.core.connection import Datagram
from mrcstack.core.evs import EvEntry, EvField, EvState, EvStatus
from mrcstack.daemons.mrcd.datapath import transport
from mrcstack.daemons.mrcd.datapath.transport import RawRoute
from mrcstack.wire.integrity import IcrcPath
from mrcstack.wire.packets import AckPacket, DataPacket

pytestmark = pytest.mark.skipif(
    not native.compiled() and native.PURE_ENV in os.environ,
    reason=f"{native.PURE_ENV} is set: this run tests the Python source",
)

#: Prints where a compiled module was loaded from, and the state line.
PROBE = (
    "import mrcstack.core.sender as s, mrcstack.native as n; "
    "print(s.__file__); print(n.state()); print(n.compiled())"
)


def probe(tree: Path, **env: str) -> list[str]:
    """PROBE run by a fresh interpreter importing mrcstack from ``tree``."""
    environ = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
    environ |= {"PYTHONPATH": str(tree), "PYTHONSAFEPATH": "1"} | env
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=environ, capture_output=True, text=True, timeout=60,
        check=True,
    )  # fmt: skip
    return out.stdout.splitlines()


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of this checkout's package, its build included (the linked folders copied as
    links, with their targets beside them)."""
    for name in ("mrcstack", "daemons", "netns", "examples", "systemd", "wireshark", "monitoring"):
        source = native.ROOT / name
        if source.exists():
            shutil.copytree(source, tmp_path / name, symlinks=True,
                            ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
    return tmp_path


def test_the_build_runs() -> None:
    """`make setup` builds the modules, so the test run uses them (as mrcd does)."""
    assert native.compiled(), native.state()
    assert sender.__file__.endswith(native.SUFFIX)
    assert transport.__file__.endswith(native.SUFFIX)


def test_a_copy_of_the_build_runs_and_an_edited_source_runs_as_python(tree: Path) -> None:
    first, state, compiled = probe(tree)
    assert first == str(tree / "mrcstack/core/sender") + native.SUFFIX
    assert compiled == "True", state
    # Rewritten unchanged (a checkout, say): its time differs, its contents do not.
    codec = tree / "mrcstack/wire/codec.py"
    os.utime(codec, ns=(1, 10**18))
    first, state, compiled = probe(tree)
    assert compiled == "True", state
    # One module edited: all of them run from source (the group calls itself directly).
    codec.write_text(codec.read_text() + "\n# edited\n")
    first, state, compiled = probe(tree)
    assert first == str(tree / "mrcstack/core/sender.py")
    assert compiled == "False"
    assert "mrcstack/wire/codec.py changed since the build" in state
    assert "make setup" in state


def test_pure_env_and_a_lost_record_run_the_python_source(tree: Path) -> None:
    first, state, _ = probe(tree, **{native.PURE_ENV: "1"})
    assert first.endswith("sender.py") and f"{native.PURE_ENV} is set" in state
    (tree / "mrcstack/native.json").unlink()
    first, state, _ = probe(tree)
    assert first.endswith("sender.py") and "incomplete" in state


@pytest.mark.parametrize(
    "args",
    [
        ["--loss", "0.01", "--seed", "3"],
        ["--pairs", "0:3,1:2", "--loss", "0.01", "--seed", "5"],
        ["--pairs", "0:3,1:2", "--seed", "2"],
    ],
)
def test_compiled_and_python_simulate_the_same(args: list[str]) -> None:
    """The simulator drives the core with its own clock: the compiled core and the Python
    source must give byte-identical results (every count, every float)."""
    outputs = []
    for pure in (False, True):
        environ = {k: v for k, v in os.environ.items() if k != native.PURE_ENV}
        if pure:
            environ[native.PURE_ENV] = "1"
        done = subprocess.run(
            [sys.executable, "-m", "mrcstack.sim", *args, "--json"],
            env=environ, capture_output=True, text=True, timeout=120, check=True,
        )  # fmt: skip
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1]
    assert '"bytes_delivered"' in outputs[0]


def test_the_cli_names_the_state_and_refuses_a_bad_command() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "mrcstack", "native", "state"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.strip() == native.state()
    bad = subprocess.run(
        [sys.executable, "-m", "mrcstack", "native", "rebuild"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert bad.returncode == 2 and "invalid choice: 'rebuild'" in bad.stderr


def test_frozen_records_survive_pickle_and_copy() -> None:
    """mrcd hands a QP to a data-path worker pickled: the core's frozen records come back
    equal (compiled, a frozen dataclass cannot be restored field by field)."""
    records = [
        EvEntry(0x123, 2),
        EvStatus(0x123, 2, EvState.GOOD, True, 0),
        EvField("entropy", 16, 1, 0xFFF, 0xFF0),
        Datagram(b"abc", 1, 0x55),
        IcrcPath("fc00::1", "fc00::2", 4791, 4792),
        RawRoute(("fc00::3", 0), b"\x60" * 48, b"\x61" * 48, 40),
        ConnectionConfig(local_qpn=1, remote_qpn=3, planes=1, evs=(EvEntry(0, 0),)),
    ]
    for record in records:
        assert pickle.loads(pickle.dumps(record)) == record
        assert copy.deepcopy(record) == record


@pytest.mark.parametrize("cls", [DataPacket, AckPacket])
def test_written_out_constructors_match_their_fields(cls: type) -> None:
    """DataPacket and AckPacket write their __init__ out (compiled, it is native code): it
    takes every field, in order, with the field's default."""
    params = list(inspect.signature(cls).parameters.values())
    fields = dataclasses.fields(cls)
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        want = inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        assert p.default == want, f.name


@pytest.mark.timeout(900)
def test_the_core_and_codec_tests_pass_as_python() -> None:
    """The suite runs the compiled modules; a researcher who edits one runs them as Python.
    The core's and the codec's tests, run again on the Python source, must pass too."""
    environ = os.environ | {native.PURE_ENV: "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider",
         str(native.ROOT / "tests" / "core"), str(native.ROOT / "tests" / "wire")],
        env=environ, cwd=native.ROOT, capture_output=True, text=True, timeout=850, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
