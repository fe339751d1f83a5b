"""mrcctl's output: aligned tables, or mrcd's answer as JSON with ``--json``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from typing import Any


def table(rows: Sequence[Sequence[object]], header: Sequence[str]) -> str:
    cells = [list(map(str, header)), *([str(c) for c in r] for r in rows)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells
    )


def show(args: argparse.Namespace, result: Any, human: str) -> None:
    print(
        json.dumps(result, indent=None if args.cmd == "ev" and args.what == "events" else 2)
        if args.json
        else human,
        flush=True,
    )
