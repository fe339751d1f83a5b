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
import sys

from mrcstack.daemons.lifecycle import (
    Cleanup,
    daemon_args,
    settle,
    setup_logging,
    stop_on_signals,
    teardown,
)
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


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return daemon_args(
        argv,
        "mrcmapper",
        "the fabric mapper: probes in, denylists out",
        "[mrcmapper] + [fabric]",
        "address for /metrics, /status, /fabric.png (default from the config)",
        "validate the config and its key files, and exit",
    )


def credentials(cfg: MapperConfig) -> Credentials:
    """The mapper's credentials ([mrcmapper.auth]); KeyFileError names the file."""
    try:
        return Credentials.from_config(cfg.name, cfg.auth)
    except KeyFileError as exc:
        raise KeyFileError(str(exc).replace("mrcd.auth.", "mrcmapper.auth.", 1)) from None


async def run(cfg: MapperConfig, web: str, stop: asyncio.Event | None = None) -> None:
    stop = stop or asyncio.Event()
    cleanups: list[Cleanup] = []
    service = MapperService(cfg)
    try:
        with stop_on_signals(stop):
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
            settle()  # (its judgements are timed: no long pause over start-up's objects)
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
        await teardown(cleanups, log)


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
    setup_logging("mrcmapper", args.log_level or cfg.log_level)
    try:
        asyncio.run(run(cfg, web))
    except (LocalError, ListenAddressError) as exc:
        sys.stderr.write(f"mrcmapper: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
