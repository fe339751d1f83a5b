"""One side of a TCP or MPTCP stream, run inside a host's namespace by :mod:`.live`.

``python -m mrcstack.experiments.stream --role recv|send --proto tcp|mptcp ...`` prints one
JSON line: the receiver, the bytes it read per millisecond of wall clock (until the sender
closes, or ``--seconds`` after it connected, plus a second, when a fault keeps the close
from arriving); the sender, ``{"connected": true}`` once connected (its ``--seconds`` count
from there: starting the interpreter in a namespace takes up to a second on a busy machine,
and a caller that started its clock at the spawn measured a transfer that had barely
begun), then nothing.  A sender whose path is dead stops at its time all the same.  Nothing
in the experiments package imports this module, so ``-m`` runs it once, cleanly.
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

PORT = 5301
IPPROTO_MPTCP = 262


def role_recv(args: argparse.Namespace) -> dict[str, Any]:
    """Stream receiver: bytes read per millisecond (wall clock), until the sender closes."""
    proto = IPPROTO_MPTCP if args.proto == "mptcp" else 0
    srv = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, proto)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("::", PORT))
    srv.listen(1)
    print(json.dumps({"ready": True}), flush=True)
    srv.settimeout(args.timeout)
    conn, _ = srv.accept()
    # The sender's last byte cannot come later than its --seconds after connecting (it
    # connected before this accept returned), and a second more for what is in flight.
    end = None if args.seconds is None else time.time() + args.seconds + 1.0
    buf = bytearray(1 << 20)
    per_ms: dict[int, int] = {}
    while True:
        left = args.timeout if end is None else min(args.timeout, end - time.time())
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            n = conn.recv_into(buf)
        except TimeoutError:
            continue  # the loop ends at the deadline, or a late read comes next
        if not n:
            break
        ms = int(time.time() * 1000)
        per_ms[ms] = per_ms.get(ms, 0) + n
    return {"per_ms": per_ms}


def role_send(args: argparse.Namespace) -> dict[str, Any]:
    proto = IPPROTO_MPTCP if args.proto == "mptcp" else 0
    sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM, proto)
    sock.settimeout(args.timeout)
    sock.connect((args.to, PORT))
    print(json.dumps({"connected": True}), flush=True)
    data = memoryview(b"\x5a" * (256 << 10))
    end = time.time() + (1.0 if args.seconds is None else args.seconds)
    while (left := end - time.time()) > 0:
        sock.settimeout(min(left, 0.1))  # a dead path must not hold the sender past its time
        try:
            sock.send(data)
        except TimeoutError:
            continue
    sock.close()
    return {}


ROLES: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "recv": role_recv,
    "send": role_send,
}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m mrcstack.experiments.stream")
    p.add_argument("--role", choices=sorted(ROLES), required=True)
    p.add_argument("--proto", choices=["tcp", "mptcp"], default="mptcp")
    p.add_argument("--to", default="")
    p.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="the sender sends this long (1 s); the receiver waits at most this + 1 s",
    )
    p.add_argument("--timeout", type=float, default=60.0)
    args = p.parse_args(argv)
    print(json.dumps(ROLES[args.role](args)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
