"""The ``mrcmapper`` command: the fabric mapper's central daemon.

It listens for the probing agents of the fabric's mrcds (authenticated as mrcd's control
channel is), localizes bad links from their results, pushes the denylist to every agent,
and serves ``/metrics``, ``/status`` (JSON) and ``/fabric.png`` on its web address.  Each
part starts in order and is recorded; ``finally`` stops whatever started, in reverse.
SIGTERM or SIGINT stops it; the agents keep the last denylist until it is back.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path

from mrcstack import add_version_flag
from mrcstack.daemons.mrcd.config import MrcdConfigError, parse_address
from mrcstack.daemons.mrcd.control.auth import Credentials, KeyFileError
from mrcstack.daemons.mrcd.ops.metrics import ListenAddressError, serve
from mrcstack.daemons.mrcmapper import picture
from mrcstack.daemons.mrcmapper.config import MapperConfig, MapperConfigError
from mrcstack.daemons.mrcmapper.metrics import make_registry
from mrcstack.daemons.mrcmapper.server import AgentServer
from mrcstack.daemons.mrcmapper.service import TICK, MapperService
from mrcstack.errors import LocalError

log = logging.getLogger("mrcmapper")

INDEX = (
    b'<html><body><h1>mrcmapper</h1><p><a href="/metrics">metrics</a> '
    b'<a href="/status">status</a> <a href="/fabric.png">fabric</a></p></body></html>\n'
)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        """One line, exit 2: no usage dump for a bad flag."""
        sys.stderr.write(f"mrcmapper: error: {message}\n")
        raise SystemExit(2)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = _Parser(prog="mrcmapper", description="the fabric mapper: probes in, denylists out")
    add_version_flag(p)
    p.add_argument("--config", required=True, type=Path, help="TOML file ([mrcmapper] + [fabric])")
    p.add_argument(
        "--web.listen-address",
        dest="web_listen_address",
        help="address for /metrics, /status, /fabric.png (default from the config)",
    )
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    p.add_argument("--check", action="store_true", help="validate the config and its keys, exit")
    return p.parse_args(argv)


def credentials(cfg: MapperConfig) -> Credentials:
    """The mapper's credentials ([mrcmapper.auth]); KeyFileError names the file."""
    try:
        return Credentials.from_config(cfg.name, cfg.auth)
    except KeyFileError as exc:
        raise KeyFileError(str(exc).replace("mrcd.auth.", "mrcmapper.auth.", 1)) from None


async def run(cfg: MapperConfig, web: str, stop: asyncio.Event | None = None) -> None:
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    cleanups: list[Callable[[], Awaitable[None] | None]] = []
    service = MapperService(cfg)
    try:
        server = AgentServer(service, credentials(cfg), cfg.listen_address)
        await server.start()
        cleanups.append(server.stop)
        pages = {
            "/status": lambda: (
                "application/json",
                json.dumps(service.status(), allow_nan=False).encode() + b"\n",
            ),
            "/fabric.png": lambda: ("image/png", picture.draw(service.status())),
        }
        web_server = await serve(make_registry(service.status), web, pages, INDEX)
        cleanups.append(web_server.stop)
        log.info("event=web_listening url=%s", web_server.url.removesuffix("/metrics"))
        log.info(
            "event=ready mapper=%s loops=%d links=%d",
            cfg.name, len(service.plan.paths), len(service.plan.links),
        )  # fmt: skip
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), TICK)
            service.tick()
        log.info("event=stopping mapper=%s", cfg.name)
    finally:
        for cleanup in reversed(cleanups):
            try:
                result = cleanup()
                if result is not None:
                    await result
            except Exception:
                log.exception(
                    "event=cleanup_failed step=%s", getattr(cleanup, "__qualname__", cleanup)
                )
        for sig in (signal.SIGTERM, signal.SIGINT):
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = MapperConfig.load(args.config)
        web = args.web_listen_address or cfg.web_listen_address
        parse_address(web, "--web.listen-address")
    except (MapperConfigError, MrcdConfigError) as exc:
        sys.stderr.write(f"mrcmapper: {exc}\n")
        return 2
    if args.check:
        try:
            credentials(cfg)
        except KeyFileError as exc:
            sys.stderr.write(f"mrcmapper: {exc}\n")
            return 2
        print(
            f"mrcmapper: {args.config}: ok ({cfg.fabric.hosts} hosts, {cfg.fabric.planes} planes)"
        )
        return 0
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger("mrcmapper")
    root.handlers[:] = [handler]
    root.setLevel((args.log_level or cfg.log_level).upper())
    root.propagate = False
    try:
        asyncio.run(run(cfg, web))
    except (LocalError, ListenAddressError) as exc:
        sys.stderr.write(f"mrcmapper: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
