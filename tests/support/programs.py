"""Programs on the hosts of a live testbed with mrcd, as an application writes them: a
context, a CQ and regions per host, QPs connected through a listener, completions drained
with a deadline, and the daemons' metrics read back from /metrics.
"""

from __future__ import annotations

import contextlib
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field

from mrcstack.api import (
    Access,
    AsyncEvent,
    CompletionQueue,
    Context,
    Device,
    MemoryRegion,
    QueuePair,
    WorkCompletion,
)
from tests.support.testbeds import Bed

WAIT = 60.0  # safety limit for anything that should happen; never a timing assertion


@dataclass
class End:
    """A program on one host: its context, one CQ, its regions and the QPs it made."""

    ctx: Context
    cq: CompletionQueue
    mrs: list[MemoryRegion]
    qps: list[QueuePair] = field(default_factory=list)

    @property
    def mr(self) -> MemoryRegion:
        return self.mrs[0]

    @property
    def qp(self) -> QueuePair:
        return self.qps[0]


_service = iter(range(100, 10_000))


def open_end(bed: Bed, host: int, *sizes: int, access: Access | None = None) -> End:
    """A program on ``host`` of a testbed with mrcd, with one region of each size."""
    ctx = Device.open(bed.cluster.daemons[host].api_socket).create_context()
    cq = ctx.create_cq(4096)
    mrs = [ctx.reg_mr(s) if access is None else ctx.reg_mr(s, access) for s in sizes]
    return End(ctx, cq, mrs)


def connect(a: End, b: End, remote_host: int, recvs: int = 0) -> tuple[QueuePair, QueuePair]:
    """A new QP on ``a`` connected to a new QP on ``b`` (which listens and accepts)."""
    service = next(_service)
    listener = b.ctx.listen(service)
    qa, qb = a.ctx.create_qp(a.cq), b.ctx.create_qp(b.cq)
    if recvs:
        qb.post_recv(range(recvs))
    failure: list[BaseException] = []

    def accept() -> None:
        try:
            req = listener.get_request(timeout=WAIT)
            assert req is not None
            listener.accept(req, qb, timeout=WAIT)
        except BaseException as exc:
            failure.append(exc)

    t = threading.Thread(target=accept)
    t.start()
    try:
        qa.connect(remote_host, service, timeout=WAIT)
    finally:
        t.join(WAIT)
    if failure:
        raise failure[0]
    a.qps.append(qa)
    b.qps.append(qb)
    return qa, qb


def drain(cq: CompletionQueue, n: int, timeout: float = WAIT) -> list[WorkCompletion]:
    """The next ``n`` completions of ``cq`` (fails if they do not come within ``timeout``)."""
    out: list[WorkCompletion] = []
    deadline = time.monotonic() + timeout
    while len(out) < n:
        left = deadline - time.monotonic()
        assert left > 0, f"only {len(out)} of {n} completions in {timeout}s"
        out += cq.poll_wait(n - len(out), timeout=left)
    return out


def async_events(*ends: End, wait: float = 0.1) -> list[AsyncEvent]:
    """The asynchronous events mrcd sent these programs (reading their sockets ``wait`` s)."""
    out: list[AsyncEvent] = []
    for e in ends:
        while (ev := e.ctx.get_async_event(timeout=wait)) is not None:
            out.append(ev)
    return out


@contextlib.contextmanager
def closing(*ends: End) -> Iterator[None]:
    """Close these programs' contexts however the body ends."""
    try:
        yield
    finally:
        for e in ends:
            e.ctx.close()


# Metrics ------------------------------------------------------------------------------------
_SAMPLE = re.compile(r"^(\w+)(?:\{([^}]*)\})? (\S+)$")


def scrape(bed: Bed, host: int) -> str:
    """Host ``host``'s mrcd /metrics page."""
    with urllib.request.urlopen(bed.cluster.daemons[host].metrics_url, timeout=10) as resp:
        return str(resp.read().decode())


def samples(page: str) -> dict[tuple[str, str], float]:
    """``{(name, 'label="v",...'): value}`` of a text exposition page."""
    out: dict[tuple[str, str], float] = {}
    for line in page.splitlines():
        m = _SAMPLE.match(line)
        if m:
            out[(m.group(1), m.group(2) or "")] = float(m.group(3))
    return out


def metric(bed: Bed, host: int, name: str, labels: str = "") -> float:
    """One sample of host ``host``'s metrics (0 when absent)."""
    return samples(scrape(bed, host)).get((name, labels), 0.0)


def by_label(bed: Bed, host: int, name: str) -> dict[str, float]:
    """One labelled family as ``{label value: sample}`` (single-label families)."""
    out = {}
    for (n, labels), v in samples(scrape(bed, host)).items():
        if n == name and labels:
            out[labels.split('"')[1]] = v
    return out


def plane_sent(bed: Bed, host: int, plane: int) -> float:
    """Packets host ``host``'s mrcd sent on ``plane``."""
    return metric(bed, host, "mrc_sent_packets_total", f'plane="{plane}"')
