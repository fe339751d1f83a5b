"""Which process handles what when the data path runs in ``workers`` processes.

A QP belongs to worker ``qpn % workers`` (:func:`.datapath.steer.worker_of`, what the
kernel's reuseport program computes).  Probe ids, which say whose an endpoint answer is,
are shared out the same way: the daemon's prober and each worker draw from their own
residue modulo ``workers + 1`` (:class:`ShardedProbeIds`), so whoever receives an answer
knows its owner from the id alone (:func:`.datapath.steer.probe_owner`, which the
kernel's reuseport program computes too, to hand an answer to its worker).
"""

from __future__ import annotations

import random

from mrcstack.core.endpoint import MAX_OUTSTANDING, ProbeIds
from mrcstack.wire.packets import PROBE_ID_MASK


class ShardedProbeIds(ProbeIds):
    """Probe ids ``shard`` modulo ``shards`` only."""

    __slots__ = ("shard", "shards")

    def __init__(self, shard: int, shards: int, rng: random.Random | None = None) -> None:
        if not 0 <= shard < shards:
            raise ValueError(f"shard {shard} out of range 0..{shards - 1}")
        super().__init__(rng)
        self.shard = shard
        self.shards = shards

    def allocate(self, qpn: int) -> int:
        owner = self._owner
        if len(owner) >= min(MAX_OUTSTANDING, (PROBE_ID_MASK + 1) // self.shards // 2):
            del owner[next(iter(owner))]
        ident = self._next
        while ident in owner or ident % self.shards != self.shard:
            ident = (ident + 1) & PROBE_ID_MASK
        self._next = (ident + 1) & PROBE_ID_MASK
        owner[ident] = qpn
        return ident
