"""Stand-ins for iproute2's ``ip`` and ``tc`` on an otherwise empty PATH, to test the
testbed's feature detection and error reporting without root or a kernel feature."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

FAKE_TOOL = """#!/bin/sh
# A stand-in for iproute2's ip and tc: logs its arguments, fails when they contain $FAKE_FAIL.
line="${0##*/} $*"
printf '%s\\n' "$line" >> "$FAKE_LOG"
if [ -n "$FAKE_FAIL" ]; then
  case "$line" in *"$FAKE_FAIL"*) printf '%s\\n' "$FAKE_STDERR" >&2; exit 2 ;; esac
fi
case "$line" in
  "ip -V") printf '%s\\n' "$FAKE_IP_VERSION" ;;
  *"route show"*) printf '%s\\n' "$FAKE_ROUTE" ;;
esac
"""
GOOD_ROUTE = (
    "fcbb:bb00:ffff::/48  encap seg6local action End flavors next-csid lblen 32 nflen 16 "
    "count dev sid metric 1024 pref medium"
)


class FakeTools:
    """``ip`` and ``tc`` on an otherwise empty PATH, as root (``os.geteuid`` says 0): they
    succeed, print what ``check_features`` reads, and fail when asked to."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.bin, self.log = tmp_path / "bin", tmp_path / "calls"
        self.bin.mkdir()
        for tool in ("ip", "tc"):
            (self.bin / tool).write_text(FAKE_TOOL)
            (self.bin / tool).chmod(0o755)
        self.monkeypatch = monkeypatch
        monkeypatch.setenv("PATH", str(self.bin))
        monkeypatch.setenv("FAKE_LOG", str(self.log))
        monkeypatch.setenv("FAKE_IP_VERSION", "ip utility, iproute2-6.1.0, libbpf 1.1.2")
        monkeypatch.setenv("FAKE_ROUTE", GOOD_ROUTE)
        monkeypatch.setattr(os, "geteuid", lambda: 0)

    def fail(self, words: str, stderr: str) -> None:
        """Calls whose command line contains ``words`` fail, printing ``stderr``."""
        self.monkeypatch.setenv("FAKE_FAIL", words)
        self.monkeypatch.setenv("FAKE_STDERR", stderr)

    def calls(self) -> list[str]:
        """Every command line the fake tools ran, in order."""
        return self.log.read_text().splitlines() if self.log.exists() else []
