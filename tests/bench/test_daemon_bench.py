"""The daemon bench's before/after comparison runs each side's own code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from bench import daemon_bench, sim_bench

ROOT = Path(__file__).resolve().parents[2]


def test_a_process_started_for_the_before_side_imports_the_before_tree(tmp_path: Path) -> None:
    """Started from the repository's root (where a bench is run) inside
    ``_pythonpath(tree)``: mrcstack comes from ``tree``, not from the current directory,
    which ``python -m`` (how the daemons start) and ``-c`` would otherwise put first on
    ``sys.path``; outside it, from this tree."""
    tree = tmp_path / "tree"
    assert sim_bench.export("HEAD", tree)
    where = [sys.executable, "-c", "import mrcstack; print(mrcstack.__file__)"]
    with daemon_bench._pythonpath(tree):
        inside = subprocess.run(where, cwd=ROOT, capture_output=True, text=True, check=True)
    outside = subprocess.run(where, cwd=ROOT, capture_output=True, text=True, check=True)
    assert Path(inside.stdout.strip()).is_relative_to(tree), inside.stdout
    assert Path(outside.stdout.strip()).is_relative_to(ROOT), outside.stdout
