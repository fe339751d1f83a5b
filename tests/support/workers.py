"""A data-path worker entry point for tests: worker 1 exits before it is ready, the others
run as mrcd's do.  Module level, so ``multiprocessing``'s spawn start finds it by name."""

from __future__ import annotations

import os
import socket

from mrcstack.daemons.mrcd.node.workers import messages, process

#: The exit status worker 1 leaves.
STATUS = 3


def main(start: messages.Start, sockets: list[socket.socket], chan: socket.socket) -> None:
    if start.index == 1:
        os._exit(STATUS)  # before it reads its sockets or says it is ready
    process.main(start, sockets, chan)
