"""``mrcstack mapper status|picture``: what the fabric mapper says of the fabric.

Both read the mapper's ``/status`` page: the one the testbed's cluster runs
(``mrcstack cluster up --mapper``; ``--name`` picks the testbed), or any mrcmapper at
``--url``.  ``status`` prints each plane's links (up; lossy with its loss; down or held
with since when and on which hosts its EVs are denied), the switches that look dead and
every agent; ``picture`` writes the fabric as a PNG, links coloured by state.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mrcstack import add_version_flag
from mrcstack.daemons.mrcmapper.status import cleared, denied_everywhere, render
from mrcstack.errors import LocalError
from mrcstack.netns.faults import Faults
from mrcstack.netns.state import cluster_dir, default_name

PROG = "mrcstack mapper"
TIMEOUT = 10.0


class MapperCliError(LocalError):
    """No mapper to ask, or it did not answer."""


def mapper_url(name: str) -> str:
    """The web address of the mapper the cluster on testbed ``name`` runs."""
    record = cluster_dir(name) / "cluster.json"
    try:
        doc = json.loads(record.read_text())
    except FileNotFoundError:
        raise MapperCliError(
            f"no cluster on {name}: `mrcstack cluster up --mapper --name {name}` first"
        ) from None
    except (OSError, ValueError) as exc:
        raise MapperCliError(f"{record}: unreadable ({exc})") from None
    mapper = doc.get("mapper")
    if not isinstance(mapper, dict) or not isinstance(mapper.get("url"), str):
        raise MapperCliError(f"the cluster on {name} runs no mapper (`cluster up --mapper`)")
    return str(mapper["url"])


def fetch(url: str) -> dict[str, Any]:
    """The mapper's status at web address ``url``."""
    try:
        with urllib.request.urlopen(f"{url.rstrip('/')}/status", timeout=TIMEOUT) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise MapperCliError(f"no answer from the mapper at {url}: {reason}") from None
    except ValueError:
        raise MapperCliError(f"{url}/status is not the mapper's JSON") from None
    return doc


def wait_for(
    url: str, done: Callable[[dict[str, Any]], object], timeout: float, every: float = 0.02
) -> dict[str, Any]:
    """Poll the mapper at ``url`` until ``done(status)`` is true; that status.  LocalError
    naming the wait after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        doc = fetch(url)
        if done(doc):
            return doc
        if time.monotonic() > deadline:
            raise MapperCliError(f"the mapper at {url} did not get there in {timeout:g} s")
        time.sleep(every)


@dataclass(frozen=True, slots=True)
class FaultTiming:
    """Seconds from a fault firing to the mapper's first denylist naming its links
    (``named``) and to every connected mrcd saying it denies them (``denied``)."""

    named: float
    denied: float


def time_to_deny(
    faults: Faults,
    url: str,
    fault: Callable[[Faults], object],
    links: Sequence[str],
    timeout: float = 30.0,
) -> FaultTiming:
    """How long ``fault`` on the testbed took to be named and denied on every connected
    mrcd (as the mapper at ``url`` saw each host say so); the fault is then undone and the
    mapper waited for until nothing is denied (``timeout`` plus the hold-down).  The mapper
    stamps every step itself, so its status is read only every 0.1 s: no load on it while
    it works."""
    armed = faults.arm(fault)  # planned and recorded now: only the kernel calls at t0
    t0 = time.time()
    armed.fire()
    doc = wait_for(url, lambda d: denied_everywhere(d, links) is not None, timeout, every=0.1)
    denied = float(denied_everywhere(doc, links) or 0.0) - t0
    wanted = set(links)
    named = min(
        v["time"]
        for v in doc["denylist"]["history"]
        if v["time"] >= t0 and wanted <= set(v["links"])
    )  # there is one: every host took it
    faults.restore_all()
    wait_for(url, cleared, timeout + float(doc["hold_down_s"]), every=0.1)
    return FaultTiming(named - t0, denied)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="what the fabric mapper says of the fabric")
    add_version_flag(p)
    sub = p.add_subparsers(dest="command", required=True)
    for command, text in (
        ("status", "each plane's links, switches down, the agents"),
        ("picture", "the fabric as a PNG, links coloured by state"),
    ):
        c = sub.add_parser(command, help=text)
        where = c.add_mutually_exclusive_group()
        where.add_argument(
            "--name", default=default_name(), help="testbed (default $MRC_TESTBED or mrc)"
        )
        where.add_argument("--url", help="the mapper's web address, e.g. http://[::1]:9465")
        if command == "status":
            c.add_argument("--json", action="store_true", help="the mapper's status as JSON")
            c.add_argument("--all", action="store_true", help="every link, up ones too")
        else:
            c.add_argument("--out", required=True, type=Path, help="PNG file to write")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        doc = fetch(args.url or mapper_url(args.name))
        if args.command == "status":
            sys.stdout.write(json.dumps(doc) + "\n" if args.json else render(doc, args.all))
        else:
            # matplotlib only here: what imports this module for fetch (the demo) runs
            # without it, and without its cache directory.
            from mrcstack.daemons.mrcmapper import picture  # noqa: PLC0415

            try:
                args.out.write_bytes(picture.draw(doc))
            except OSError as exc:
                raise MapperCliError(f"cannot write {args.out}: {exc.strerror}") from None
            print(f"wrote {args.out}")
    except LocalError as exc:
        print(f"{PROG} {args.command}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
