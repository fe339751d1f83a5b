"""The ``mrcd`` command: load the config, run the node and its servers, stop cleanly.

Lifecycle in the manner of aiohttp's runner: each part starts in order and is recorded, and
``finally`` tears down whatever did start, one step at a time, so a failed start leaves
nothing behind.

SIGTERM and SIGINT ask for a graceful stop, in this order: no new work is taken (posts, new
QPs and connection requests are refused); writes already posted get ``drain_timeout``
seconds (default 2) to complete; the rest complete with WR_FLUSH_ERR and their QPs report
QP_FATAL; every API client then gets DEVICE_FATAL after its last completion, and the API
socket, the link watch, /metrics, the control channel and the plane sockets close.  With
``[mrcd.mapper]`` on, the fabric mapper's probing agent starts last and stops first.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import sys

import uvloop

from mrcstack import native
from mrcstack.daemons import lifecycle
from mrcstack.daemons.lifecycle import Cleanup, daemon_args, stop_on_signals, teardown
from mrcstack.daemons.mrcd.agent.agent import MapperAgent
from mrcstack.daemons.mrcd.appapi.server import AppServer
from mrcstack.daemons.mrcd.config import MrcdConfig, MrcdConfigError, parse_address
from mrcstack.daemons.mrcd.control.auth import Credentials, KeyFileError
from mrcstack.daemons.mrcd.datapath.linkwatch import watch_planes
from mrcstack.daemons.mrcd.node.node import Node
from mrcstack.daemons.mrcd.ops.metrics import (
    AgentCollector,
    ListenAddressError,
    make_registry,
    serve,
)
from mrcstack.errors import LocalError

log = logging.getLogger("mrcd")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    return daemon_args(
        argv,
        "mrcd",
        "MRC endpoint daemon and node controller",
        "[mrcd] + [fabric]",
        "address for /metrics (default from the config, else 127.0.0.1:9464)",
        "validate the config and its key files, and exit",
    )


def setup_logging(level: str) -> None:
    """mrcd's log: one line per event."""
    lifecycle.setup_logging("mrcd", level)


async def run(cfg: MrcdConfig, web: str, stop: asyncio.Event | None = None) -> None:
    """Run until ``stop`` is set (or SIGTERM/SIGINT), stop gracefully (see above), then
    tear down in reverse order."""
    loop = asyncio.get_running_loop()
    stop = stop or asyncio.Event()
    cleanups: list[Cleanup] = []
    node = Node(cfg, loop)
    try:
        with stop_on_signals(stop):
            await node.start()
            cleanups.append(functools.partial(node.stop, drain_timeout=0))
            metrics = await serve(make_registry(node.snapshot), web)
            cleanups.append(metrics.stop)
            log.info("event=metrics_listening url=%s", metrics.url)
            if cfg.data_mode == "srv6":
                watcher = watch_planes(loop, cfg.interfaces, node.set_port_link)
                cleanups.append(watcher.stop)
            app = AppServer(node, cfg.api_socket)
            await app.start()
            cleanups.append(app.stop)
            if cfg.mapper is not None:
                agent = MapperAgent(cfg, app.controller)
                await agent.start()
                cleanups.append(agent.stop)
                metrics.registry.register(AgentCollector(agent.snapshot))
            lifecycle.settle()
            # data_path: the per-packet modules compiled (mypyc) or run as Python, and why
            log.info("event=ready host=%s data_path=%r", cfg.host_name, native.state())
            await stop.wait()
            log.info("event=stopping host=%s drain_timeout=%g", cfg.host_name, cfg.drain_timeout)
            node.quiesce()
            drained = await node.drain(cfg.drain_timeout)
            flushed = node.fail_all("mrcd stopping")
            log.info("event=drained host=%s complete=%s flushed_writes=%d",
                     cfg.host_name, drained, flushed)  # fmt: skip
    finally:
        await teardown(cleanups, log)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        cfg = MrcdConfig.load(args.config)
        web = args.web_listen_address or cfg.web_listen_address
        parse_address(web, "--web.listen-address")
    except MrcdConfigError as exc:
        sys.stderr.write(f"mrcd: {exc}\n")
        return 2
    if args.check:
        try:  # the key files too: --check vouches that a start would not stop on them
            Credentials.from_config(cfg.host_name, cfg.auth)
        except KeyFileError as exc:
            sys.stderr.write(f"mrcd: {exc}\n")
            return 2
        print(f"mrcd: {args.config}: ok ({cfg.host_name}, {cfg.fabric.planes} planes)")
        return 0
    setup_logging(args.log_level or cfg.log_level)
    try:
        uvloop.run(run(cfg, web))
    except (LocalError, ListenAddressError) as exc:
        sys.stderr.write(f"mrcd: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
