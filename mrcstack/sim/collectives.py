"""Collectives as flow specs: the steps of ring all-reduce, all-gather and all-to-all.

Each step's flows wait for the flows of the previous step that feed them (a host sends
in step k what it received in step k-1, after its own send of step k-1), so a slow or
lossy flow delays everything downstream of it, as in a real collective.  Every flow is
labelled ``"<name> step <k>"``; :attr:`SimResult.groups` then times each step, and the
last step's end is the collective's completion.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from mrcstack.sim.config import FlowSpec

KINDS = ("ring-allreduce", "allgather", "all-to-all")


def ring_steps(
    kind: str,
    hosts: Sequence[int],
    chunk_bytes: int,
    *,
    first_index: int = 0,
    start_s: float = 0.0,
    name: str | None = None,
) -> tuple[FlowSpec, ...]:
    """The flows of ``kind`` over ``hosts`` in ring order, each step moving one chunk.

    ``first_index`` is the index the first returned flow will have in the scenario (the
    specs refer to earlier flows by index); ``start_s`` is when the first step starts.

    - ring-allreduce: 2 (n - 1) steps (reduce-scatter then all-gather), each host sending
      one chunk to the next host of the ring;
    - allgather: n - 1 such steps;
    - all-to-all: n - 1 steps, in step k host i sends to host i + k (a shifted
      permutation; every pair once), each step after the previous one at the same host.
    """
    n = len(hosts)
    if n < 2 or len(set(hosts)) != n:
        raise ValueError(f"a collective needs two or more distinct hosts, got {list(hosts)}")
    if chunk_bytes < 1:
        raise ValueError(f"chunk size must be >= 1, got {chunk_bytes}")
    if kind not in KINDS:
        raise ValueError(f"unknown collective {kind!r}; known: {', '.join(KINDS)}")
    steps = 2 * (n - 1) if kind == "ring-allreduce" else n - 1
    shifted = kind == "all-to-all"  # step k goes k + 1 hosts on; the rings go one on
    label = name or kind
    specs: list[FlowSpec] = []
    for k in range(steps):
        for i in range(n):
            after: tuple[int, ...] = ()
            if k:
                previous = first_index + (k - 1) * n
                own = previous + i  # this host's send of the previous step
                if kind == "all-to-all":
                    after = (own,)
                else:
                    into = previous + (i - 1) % n  # what it received in the previous step
                    after = (own, into)
            specs.append(
                FlowSpec(
                    src=hosts[i],
                    dst=hosts[(i + (k + 1 if shifted else 1)) % n],
                    bytes=chunk_bytes,
                    start_s=start_s,
                    after=after,
                    group=f"{label} step {k}",
                )
            )
    return tuple(specs)


def with_qps(specs: Sequence[FlowSpec], qps: int, *, first_index: int = 0) -> tuple[FlowSpec, ...]:
    """Each flow split over ``qps`` connections (queue pairs) of an equal share of its bytes,
    as RoCE deployments do so that ECMP hashes spread one transfer over several paths; a
    flow that waited for one flow now waits for all of its parts."""
    if qps < 1:
        raise ValueError(f"qps must be >= 1, got {qps}")
    out: list[FlowSpec] = []
    for spec in specs:
        if spec.bytes is None or spec.bytes < qps:
            raise ValueError(f"flow {spec.src}:{spec.dst}: needs at least {qps} bytes, one per QP")
        after = tuple(
            first_index + (a - first_index) * qps + q for a in spec.after for q in range(qps)
        )
        share, extra = divmod(spec.bytes, qps)
        for q in range(qps):
            out.append(replace(spec, bytes=share + (q < extra), after=after))
    return tuple(out)
