"""Running the perftest-style tools (mrc-write-bw, mrc-write-lat) from tests: a command
line for a tool (inside a host's namespace if asked), a server and client pair run to the
end, and their JSON output read back.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

from tests.support import REPO

PY = sys.executable
WAIT = 120.0  # safety limit for a tool run; never a timing assertion


def tool(name: str, *args: str, netns: str | None = None) -> list[str]:
    """The command line running tool ``name`` (a module of mrcstack.daemons.tools)."""
    cmd = [PY, "-m", f"mrcstack.daemons.tools.{name}", *args]
    return ["ip", "netns", "exec", netns, *cmd] if netns else cmd


def run_pair(
    name: str,
    server: list[str],
    client: list[str],
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    """Start the server, run the client, collect both."""
    srv = subprocess.Popen(
        server, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        cli = subprocess.run(
            client, check=False, cwd=REPO, capture_output=True, text=True, timeout=WAIT
        )
        out, err = srv.communicate(timeout=WAIT)
    finally:
        if srv.poll() is None:
            srv.kill()
            srv.communicate()
    return subprocess.CompletedProcess(server, srv.returncode, out, err), cli


def one_json(out: str) -> dict[str, Any]:
    """The one JSON line a tool printed."""
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1, out
    doc: dict[str, Any] = json.loads(lines[0])
    return doc


def json_lines(out: str) -> list[dict[str, Any]]:
    """Every JSON line a tool printed."""
    return [json.loads(x) for x in out.splitlines() if x.strip()]
