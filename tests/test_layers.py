"""The import contracts hold, and they catch what they are for.

``lint-imports`` runs on the real tree, then on scratch copies of the package with one
deliberate mistake each: an upward import (the core importing the testbed) and an import
cycle inside a package.  A contract that passed those copies would guard nothing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

ROOT = REPO
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

pytestmark = pytest.mark.skipif(
    not LINT_IMPORTS.exists(), reason="import-linter is not installed (make setup)"
)


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with the project's contracts, on the package under ``tree``."""
    env = os.environ | {"PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), str(ROOT / "pyproject.toml"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def scratch(tmp_path: Path) -> Path:
    """A copy of the package (links followed) in which a test may break things."""
    shutil.copytree(
        ROOT / "mrcstack",
        tmp_path / "mrcstack",
        symlinks=False,
        ignore=shutil.ignore_patterns("__pycache__", "*.o"),
    )
    return tmp_path


def add_line(path: Path, line: str) -> None:
    text = path.read_text()
    marker = "from __future__ import annotations\n"
    assert marker in text, path
    path.write_text(text.replace(marker, marker + line + "\n", 1))


def test_the_tree_keeps_every_contract() -> None:
    proc = lint(ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    tree = scratch(tmp_path)
    add_line(tree / "mrcstack/core/psn.py", "import mrcstack.netns.testbed  # noqa")
    proc = lint(tree)
    assert proc.returncode != 0
    assert "mrcstack.core.psn -> mrcstack.netns.testbed" in proc.stdout
    assert "layers" in proc.stdout and "BROKEN" in proc.stdout


def test_a_cycle_breaks_the_acyclic_contract(tmp_path: Path) -> None:
    tree = scratch(tmp_path)
    # listeners already imports qps; qps importing listeners closes a cycle in mrcd.node.
    add_line(
        tree / "mrcstack/daemons/mrcd/node/qps.py",
        "import mrcstack.daemons.mrcd.node.listeners  # noqa",
    )
    proc = lint(tree)
    assert proc.returncode != 0
    assert "No cycles are allowed in mrcstack.daemons.mrcd.node" in proc.stdout
