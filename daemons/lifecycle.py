"""What the two daemons, mrcd and mrcmapper, do alike: the command line (one-line errors,
``--version``, ``--config``, ``--web.listen-address``, ``--log-level``, ``--check``), one
log line per event, SIGTERM and SIGINT as a stop request, start-up's objects left out of
full garbage collections once started, a process's CPU time for their metrics, and the
teardown of whatever started, one step at a time in reverse, in the manner of aiohttp's
runner."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

from mrcstack import add_version_flag

LOG_LEVELS = ("debug", "info", "warning", "error")
#: A step to undo: called, and awaited if it returns an awaitable.
Cleanup = Callable[[], Awaitable[None] | None]


class OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line, exit 2: no usage dump for a bad flag."""
        sys.stderr.write(f"{self.prog}: error: {message}\n")
        raise SystemExit(2)


def daemon_args(
    argv: list[str] | None, prog: str, description: str, tables: str, web: str, check: str
) -> argparse.Namespace:
    p = OneLineParser(prog=prog, description=description)
    add_version_flag(p)
    p.add_argument("--config", required=True, type=Path, help=f"TOML file ({tables})")
    p.add_argument("--web.listen-address", dest="web_listen_address", help=web)
    p.add_argument("--log-level", choices=list(LOG_LEVELS))
    p.add_argument("--check", action="store_true", help=check)
    return p.parse_args(argv)


def setup_logging(name: str, level: str) -> None:
    """One line per event: ``time level event=... key=value``; operators grep and ship it."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger(name)
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def settle() -> None:
    """Started: what start-up built (modules, configuration, tables, sockets; tens of
    thousands of objects) is left out of the garbage collector's full collections from
    now on.  Each such collection walks every tracked object; over what start-up left, one
    paused a sending mrcd for 11 ms a few seconds into its traffic, as long as its minimum
    RTO: its peer's ACKs waited, and packets could time out although they had arrived."""
    gc.freeze()


def process_times(pid: int) -> tuple[float, float] | None:
    """(user, system) CPU seconds process ``pid`` has used, from ``/proc/PID/stat`` (whole
    clock ticks); None once it is gone.  An exited child not yet reaped still reads."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # (the command name may hold spaces)
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used (:func:`process_times`)."""
    times = process_times(pid)
    return None if times is None else times[0] + times[1]


@contextlib.contextmanager
def stop_on_signals(stop: asyncio.Event) -> Iterator[None]:
    """SIGTERM and SIGINT set ``stop`` while inside."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    try:
        yield
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


async def teardown(cleanups: list[Cleanup], log: logging.Logger) -> None:
    """Each step, newest first; a failed step is logged and does not stop the others."""
    for cleanup in reversed(cleanups):
        try:
            result = cleanup()
            if result is not None:
                await result
        except Exception:
            log.exception("event=cleanup_failed step=%s", getattr(cleanup, "__qualname__", cleanup))
