"""The fault harness: reversible faults on a live testbed, on a kernel without netem.

Every fault is planned as data first (:class:`Fault`: what to do and, exactly, how to undo
it), recorded in ``<STATE_DIR>/<name>.faults.json`` *before* it is applied (so a crash
halfway leaves something ``restore_all`` can undo, from any process), then applied, and
logged with an ISO timestamp to the caller's log (stderr by default) and to
``<STATE_DIR>/<name>.faults.log``.  A lock on the state directory serialises harness
processes.

How each fault is made (docs/faults.md explains the choices):

- ``link_down``: both ends ``ip link set down``.  The kernel then deletes every route
  through them and flushes their IPv6 addresses, even the static ``fe80::1``/``fe80::2``
  (docs/linux.md, trap 1), so the undo records the addresses beforehand and, after ``up``,
  re-adds them and re-installs the namespace's recorded routes (``route replace``; while
  other ports of that namespace are still down, only the routes that avoid them, and
  multipath routes with their live nexthops only), waits until both ends are operational
  and flushes their neighbour entries (a stale INCOMPLETE entry on a port that only lost
  its carrier would hold traffic for up to 1 s).  ``keep_addr_on_down`` does not help:
  the kernel flushes link-local addresses regardless.  A switch's own uN route hangs off
  its ``sid`` ifb device (see netns/topology.py), so it survives its ports going down.
- ``nic_down``: only the host's end goes down (its T0 port sees no carrier, keeps its routes).
- ``switch_fail``: every port of the switch goes down; ``switch_blackhole``: an nftables
  ``forward`` hook drop in the switch (links stay up, ND still works, nothing is forwarded).
- ``loss``: ``numgen random mod N < k`` drop in the inet ``forward`` hook, per direction, at
  the sending switch's egress (``oifname``) or, for a host's packets, at its T0's ingress.
- ``loss_path``: drop in the switch's ``prerouting`` hook for ``ip6 daddr LOCATOR/48``: the
  packets that arrive with this switch's uSID active, i.e. every uSID packet it would
  forward, before its uN shift (in ``forward`` the address is already shifted).
- ``shape``/``trim``: the sending end's egress port, through the testbed's shaper and the
  trim program (switch egress only).

This module plans, records and undoes; :mod:`.records` holds what is recorded (each
operation a frozen dataclass) and :mod:`.ops` runs the operations.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack, suppress
from typing import Any

from mrcstack.addrplan import parse_node
from mrcstack.fabric import Fabric
from mrcstack.netns.faults import netem, ops
from mrcstack.netns.faults.netem import NetemSpec
from mrcstack.netns.faults.plan import (
    FaultError,
    directions,
    is_host,
    loss_site,
    nft_random_drop,
    nft_ruleset,
    nft_table_name,
    now_iso,
    parse_probability,
    path_loss_rule,
    resolve_link,
    resolve_switch,
    trim_settings,
)
from mrcstack.netns.faults.records import (
    Fault,
    FaultKind,
    NamespaceOp,
    NetemAttach,
    NetemDetach,
    Nft,
    NftDelete,
    Operation,
    PortDown,
    PortOp,
    PortUp,
    Records,
    Routes,
    Settle,
    Shape,
    Tier,
    TrimAttach,
    TrimDetach,
    Unshape,
    harness_lock,
    load_records,
    locked_records,
    netem_resource,
    port_resource,
    qdisc_resource,
    save_records,
    summary,
)
from mrcstack.netns.run import TestbedError, resident_netns
from mrcstack.netns.state import LinkRecord, TestbedState, faults_log_path

__all__ = ["Armed", "Faults"]


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _tier(record: LinkRecord) -> Tier:
    """The testbed's shaping a port of this link returns to."""
    return Tier.HOST if record.host_facing else Tier.FABRIC


def _ports(record: LinkRecord) -> tuple[str, str]:
    return (port_resource(record.a.netns, record.a.ifname),
            port_resource(record.b.netns, record.b.ifname))  # fmt: skip


# The harness --------------------------------------------------------------------------------
class Faults:
    """Faults on one testbed.  Every method that applies a fault returns the recorded
    :class:`Fault` records; every undo method returns the records it removed."""

    def __init__(self, state: TestbedState, log: Callable[[str], None] | None = None) -> None:
        if not state.complete:
            raise FaultError(
                f"testbed {state.name} is not completely built (`up` still running or "
                f"killed); run `mrcstack testbed clean --name {state.name}` and `up` again"
            )
        self.state = state
        self._log = stderr_log if log is None else log
        self.log_path = faults_log_path(state.name)
        self._trim_checked = False  # the kernel probe for trim runs once per harness
        self._arming: list[Fault] | None = None  # faults recorded by ``arm``, not applied

    # Logging --------------------------------------------------------------------------
    def log(self, message: str) -> str:
        line = f"{now_iso()} [{self.state.name}] {message}"
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "a", encoding="utf-8") as handle:
            handle.write(line + "\n")
        self._log(line)
        return line

    # Queries --------------------------------------------------------------------------
    def active(self) -> list[Fault]:
        return list(load_records(self.state.name).faults)

    def link(self, a: str, b: str | None = None) -> LinkRecord:
        return self.state.links[resolve_link(self.state.fabric, a, b)]

    # Links, NICs, switches ------------------------------------------------------------
    def link_down(self, a: str, b: str | None = None) -> list[Fault]:
        """Both ends of a link down; ``link_up`` brings them back exactly as before."""
        record = self.link(a, b)
        ports = [(record.a.netns, record.a.ifname), (record.b.netns, record.b.ifname)]
        return self._down(
            FaultKind.LINK_DOWN, f"down {record.name}", record.name, ports, strict=True
        )

    def link_up(self, a: str, b: str | None = None) -> list[Fault]:
        record = self.link(a, b)
        return self._undo_keys([f"down {record.name}"], f"link {record.name} is not down",
                               _ports(record))  # fmt: skip

    def nic_down(self, host: str, plane: int) -> list[Fault]:
        """The host's port to its plane-``plane`` T0 down (the T0 sees no carrier)."""
        record = self._nic(host, plane)
        end = record.end(host)
        return self._down(FaultKind.NIC_DOWN, f"down {record.name}", record.name,
                          [(end.netns, end.ifname)], strict=True)  # fmt: skip

    def nic_up(self, host: str, plane: int) -> list[Fault]:
        record = self._nic(host, plane)
        return self._undo_keys([f"down {record.name}"], f"{host} plane {plane} is not down",
                               _ports(record))  # fmt: skip

    def _nic(self, host: str, plane: int) -> LinkRecord:
        fabric = self.state.fabric
        try:
            node = parse_node(host)
            if node.plane is not None:
                raise ValueError(f"{host} is a switch, not a host")
            fabric.check_plane(plane)
            fabric.check_host(node.index)
        except ValueError as exc:
            raise FaultError(f"nic {host} plane {plane}: {exc}") from None
        t0 = Fabric.t0_name(plane, fabric.rack_of(node.index))
        return self.state.links[resolve_link(fabric, host, t0)]

    def switch_fail(self, switch: str) -> list[Fault]:
        """Every port of the switch down (its peers see no carrier)."""
        name = resolve_switch(self.state.fabric, switch)
        ports = [
            (rec.end(name).netns, rec.end(name).ifname) for rec in self.state.switch_links(name)
        ]
        return self._down(FaultKind.SWITCH_FAIL, f"switch_fail {name}", name, ports, strict=False)

    def switch_blackhole(self, switch: str) -> list[Fault]:
        """Links stay up, the switch silently drops everything it would forward."""
        name = resolve_switch(self.state.fabric, switch)
        ops.require_nft()
        return self._nft(FaultKind.BLACKHOLE, f"blackhole {name}", name, {},
                         [(self.state.ns(name), "forward", ["counter drop"])])  # fmt: skip

    def switch_restore(self, switch: str) -> list[Fault]:
        """Undo a switch's failure and/or blackhole."""
        name = resolve_switch(self.state.fabric, switch)
        return self._undo_keys([f"switch_fail {name}", f"blackhole {name}"],
                               f"switch {name} is neither failed nor blackholed")  # fmt: skip

    # Loss -----------------------------------------------------------------------------
    def loss(
        self, a: str, b: str | None, rate: float | str, *, from_node: str | None = None
    ) -> list[Fault]:
        """Random loss on a link, each direction (or only from ``from_node``) its own fault."""
        record = self.link(a, b)
        probability = parse_probability(rate)
        ops.require_nft()
        faults: list[Fault] = []
        for sender, receiver in directions(record.name, from_node):
            netns, match = loss_site(record, sender)
            faults += self._nft(
                FaultKind.LOSS,
                f"loss {record.name} {sender}>{receiver}",
                f"{record.name} {sender}>{receiver}",
                {"rate": probability},
                [(netns, "forward", [f"{match} {nft_random_drop(probability)}"])],
            )
        return faults

    def loss_path(self, sid_or_switch: str, rate: float | str) -> list[Fault]:
        """Random loss of the uSID packets crossing one switch (dropped as they arrive)."""
        name = resolve_switch(self.state.fabric, sid_or_switch)
        probability = parse_probability(rate)
        rule = path_loss_rule(self.state.fabric, name, probability)
        ops.require_nft()
        return self._nft(FaultKind.LOSS_PATH, f"loss_path {name}", name, {"rate": probability},
                         [(self.state.ns(name), "prerouting", [rule])])  # fmt: skip

    def clear_loss(
        self,
        a: str | None = None,
        b: str | None = None,
        *,
        from_node: str | None = None,
        path: str | None = None,
    ) -> list[Fault]:
        """Remove the loss on a link (both directions, or one) or on a switch's path."""
        if path is not None:
            name = resolve_switch(self.state.fabric, path)
            return self._undo_keys([f"loss_path {name}"], f"no path loss at {name}")
        if a is None:
            raise FaultError("clear_loss: give a link or path")
        record = self.link(a, b)
        keys = [f"loss {record.name} {s}>{r}" for s, r in directions(record.name, from_node)]
        return self._undo_keys(keys, f"no loss on {record.name}")

    # Shaping and trimming -------------------------------------------------------------
    def shape(
        self,
        a: str,
        b: str | None,
        rate_bps: float,
        queue_bytes: int | None = None,
        *,
        from_node: str | None = None,
    ) -> list[Fault]:
        """Shape the link's egress ports (both, or the one of ``from_node``)."""
        record = self.link(a, b)
        if not rate_bps > 0:
            raise FaultError(f"shape: rate must be positive, got {rate_bps!r}")
        faults: list[Fault] = []
        for sender, receiver in directions(record.name, from_node):
            end = record.end(sender)
            do = Shape(end.netns, end.ifname, int(rate_bps),
                       None if queue_bytes is None else int(queue_bytes))  # fmt: skip
            params: dict[str, Any] = {"rate_bps": do.rate_bps}
            if do.queue_bytes is not None:
                params["queue_bytes"] = do.queue_bytes
            undo = Unshape(end.netns, end.ifname, _tier(record))
            faults += self._setting(FaultKind.SHAPE, record, sender, receiver, params, do, undo)
        return faults

    def unshape(self, a: str, b: str | None = None, *, from_node: str | None = None) -> list[Fault]:
        record = self.link(a, b)
        self._refuse_under_netem("unshape", record, from_node)
        keys = [f"shape {record.name} {s}>{r}" for s, r in directions(record.name, from_node)]
        return self._undo_keys(keys, f"{record.name} is not shaped by a fault")

    def trim(
        self,
        a: str,
        b: str | None,
        *,
        threshold_bytes: int,
        ecn_threshold_bytes: int | None,
        rate_bps: float | None = None,
        probability: float | None = None,
        queue_bytes: int | None = None,
        from_node: str | None = None,
    ) -> list[Fault]:
        """Trimming/ECN (the trim program) on the link's switch egress ports; a host's port
        is never trimmed.  Last hop when the port faces a host.  ``rate_bps`` and
        ``queue_bytes`` default to the testbed's shaping of the link's tier and
        ``fabric.queue_bytes`` (an unshaped link needs a rate)."""
        record = self.link(a, b)
        if from_node is not None and is_host(from_node):
            raise FaultError(f"trim: {from_node} is a host; only switch ports trim")
        ports = [
            (sender, receiver, trim_settings(
                self.state.fabric, record.name, receiver, threshold_bytes=threshold_bytes,
                ecn_threshold_bytes=ecn_threshold_bytes, rate_bps=rate_bps,
                probability=probability, queue_bytes=queue_bytes))
            for sender, receiver in directions(record.name, from_node)
            if not is_host(sender)
        ]  # fmt: skip
        self._require_trim()
        faults: list[Fault] = []
        for sender, receiver, params in ports:
            end = record.end(sender)
            do = TrimAttach(end.netns, end.ifname, **params)
            undo = TrimDetach(end.netns, end.ifname, _tier(record))
            shown = {k: v for k, v in params.items() if v is not None}
            faults += self._setting(FaultKind.TRIM, record, sender, receiver, shown, do, undo)
        return faults

    def netem(
        self,
        a: str,
        b: str | None,
        spec: NetemSpec | Mapping[str, Any],
        *,
        from_node: str | None = None,
    ) -> list[Fault]:
        """netem on the link's egress ports (both, or the one of ``from_node``): under the
        port's shaping or trimming when it has one (:mod:`.netem`), else at its root."""
        if not isinstance(spec, NetemSpec):
            spec = netem.parse_spec(dict(spec))
        record = self.link(a, b)
        netem.require_netem(self.state.name)
        params = spec.to_params()
        faults: list[Fault] = []
        for sender, receiver in directions(record.name, from_node):
            end = record.end(sender)
            do = NetemAttach(end.netns, end.ifname, params)
            undo = NetemDetach(end.netns, end.ifname)
            faults += self._setting(FaultKind.NETEM, record, sender, receiver, params, do, undo)
        return faults

    def unnetem(self, a: str, b: str | None = None, *, from_node: str | None = None) -> list[Fault]:
        record = self.link(a, b)
        keys = [f"netem {record.name} {s}>{r}" for s, r in directions(record.name, from_node)]
        return self._undo_keys(keys, f"{record.name} has no netem fault")

    def _refuse_under_netem(self, kind: str, record: LinkRecord, from_node: str | None) -> None:
        """Undoing a port's shaping or trimming would take a netem under it along."""
        with locked_records(self.state.name) as records:
            for sender, _ in directions(record.name, from_node):
                end = record.end(sender)
                if (holder := records.holder(netem_resource(end.netns, end.ifname))) is not None:
                    raise FaultError(f"{kind} {record.name}: {holder.describe()} sits under it; "
                                     "clear that first")  # fmt: skip

    def _require_trim(self) -> None:
        """The up-front check for trim faults, once per harness (it builds and loads the
        program in the testbed's probe namespace, one harness process at a time)."""
        if not self._trim_checked:
            with harness_lock(self.state.name):
                ops.require_trim(self.state.name)
            self._trim_checked = True

    def untrim(self, a: str, b: str | None = None, *, from_node: str | None = None) -> list[Fault]:
        record = self.link(a, b)
        self._refuse_under_netem("untrim", record, from_node)
        keys = [f"trim {record.name} {s}>{r}" for s, r in directions(record.name, from_node)]
        return self._undo_keys(keys, f"{record.name} has no trim fault")

    # Generic undo ---------------------------------------------------------------------
    def clear(self, fault: int | str) -> list[Fault]:
        """Undo one fault by id (3, "3", "#3") or key ("down p0:t0a-t1c")."""
        text = str(fault).lstrip("#")
        with locked_records(self.state.name) as records:
            match = (
                next((f for f in records.faults if f.id == int(text)), None)
                if text.isdigit()
                else records.by_key(text)
            )
            if match is None:
                raise FaultError(f"no active fault {fault!r} (see `mrcstack fault list`)")
            self._undo(records, match)
            return [match]

    def restore_all(self) -> list[Fault]:
        """Undo every active fault, newest first; keeps going past a failure and then
        raises one error naming every fault that could not be undone."""
        errors: list[str] = []
        undone: list[Fault] = []
        with locked_records(self.state.name) as records:
            for fault in sorted(records.faults, key=lambda f: -f.id):
                try:
                    self._undo(records, fault)
                    undone.append(fault)
                except TestbedError as exc:
                    errors.append(f"#{fault.id}: {exc}")
        if errors:
            raise FaultError(f"restore_all: {len(errors)} fault(s) not undone: {'; '.join(errors)}")
        if not undone:
            self.log("restore_all: no active faults")
        return undone

    # Armed faults ---------------------------------------------------------------------
    def arm(self, action: Callable[[Faults], object]) -> Armed:
        """Plan and record what ``action`` (calls of this harness's fault methods) would do,
        without doing it yet: :meth:`Armed.fire` then applies it in one step.

        For measuring what a fault costs a running transfer.  Planning a fault (reading the
        ports' addresses, writing the record under the lock) is milliseconds of CPU that a
        real fault costs nobody; armed, only the kernel calls are left for the fault time,
        from threads already in the namespaces.  The record exists from now on, so
        ``restore_all`` and ``down`` undo an armed fault like any other (undoing one that
        never fired is harmless: a port set up again, a table already gone)."""
        if self._arming is not None:
            raise FaultError("arm: this harness is already arming a fault")
        self._arming = []
        try:
            action(self)
        except BaseException:
            self._forget(self._arming)
            raise
        finally:
            recorded, self._arming = self._arming, None
        return Armed(self, recorded)

    def _forget(self, faults: Sequence[Fault]) -> None:
        """Drop the records of faults that were never applied (nothing to undo)."""
        ids = {f.id for f in faults}
        if ids:
            with locked_records(self.state.name) as records:
                records.faults = [f for f in records.faults if f.id not in ids]

    # Machinery ------------------------------------------------------------------------
    def _undo_keys(
        self, keys: Sequence[str], missing: str, ports: Sequence[str] = ()
    ) -> list[Fault]:
        """Undo the faults with these keys; FaultError ``missing`` if there is none (naming
        the fault that holds one of ``ports`` down, if another one does)."""
        with locked_records(self.state.name) as records:
            found = [f for key in keys if (f := records.by_key(key)) is not None]
            if not found:
                holder = next((h for p in ports if (h := records.holder(p)) is not None), None)
                hint = f" by itself: {holder.describe()} holds it; undo that" if holder else ""
                raise FaultError(missing + hint)
            for fault in found:
                self._undo(records, fault)
            return found

    def _undo(self, records: Records, fault: Fault) -> None:
        """Run a fault's undo operations, then forget it (even if one failed: the error
        says what is left)."""
        if self._arming is not None:
            raise FaultError("arm: only faults being applied can be armed, not an undo")
        failures: list[str] = []
        for op in fault.undo:
            try:
                ops.execute(self.state, op, self.log)
            except TestbedError as exc:
                failures.append(str(exc))
        records.faults = [f for f in records.faults if f.id != fault.id]
        if failures:
            self.log(f"restore {fault.describe()}: FAILED: {'; '.join(failures)}")
            raise FaultError(f"restore {fault.describe()}: {failures[0]}")
        self.log(f"restore {fault.describe()}: {summary(fault.undo)}")

    def _commit(self, records: Records, fault: Fault) -> Fault:
        """Record, then apply; on failure undo what was done and forget the fault."""
        fault = Fault(fault.id, fault.kind, fault.key, fault.target, fault.params, fault.holds,
                      fault.undo, now_iso(), fault.apply)  # fmt: skip
        records.faults.append(fault)
        save_records(records)
        if self._arming is not None:
            self._arming.append(fault)  # applied by Armed.fire
            return fault
        try:
            for op in fault.apply:
                ops.execute(self.state, op, self.log)
        except BaseException:
            with suppress(TestbedError):  # the original failure is the one to report
                self._undo(records, fault)
            raise
        self.log(f"apply {fault.describe()}: {summary(fault.apply)}")
        return fault

    def _down(
        self,
        kind: FaultKind,
        key: str,
        target: str,
        ports: list[tuple[str, str]],
        *,
        strict: bool,
    ) -> list[Fault]:
        with locked_records(self.state.name) as records:
            if (old := records.by_key(key)) is not None:
                raise FaultError(f"{target} is already down ({old.describe()})")
            free: list[tuple[str, str]] = []
            for netns, ifname in ports:
                holder = records.holder(port_resource(netns, ifname))
                if holder is None:
                    free.append((netns, ifname))
                elif strict:
                    raise FaultError(f"{target}: {netns}/{ifname} is already down "
                                     f"({holder.describe()})")  # fmt: skip
            apply_ops: list[Operation] = []
            undo_ups: list[Operation] = []
            for netns, ifname in free:
                apply_ops.append(PortDown(netns, ifname))
                undo_ups.append(PortUp(netns, ifname, ops.addresses(netns, ifname)))
            settle = Settle(tuple(free))
            undo_routes = [Routes(ns) for ns in dict.fromkeys(n for n, _ in free)]
            holds = tuple(port_resource(n, i) for n, i in free)
            fault = Fault(records.next_id, kind, key, target, {}, holds,
                          (*undo_ups, *undo_routes, settle), apply=tuple(apply_ops))  # fmt: skip
            records.next_id += 1
            return [self._commit(records, fault)]

    def _nft(
        self,
        kind: FaultKind,
        key: str,
        target: str,
        params: dict[str, Any],
        sites: list[tuple[str, str, list[str]]],
    ) -> list[Fault]:
        with locked_records(self.state.name) as records:
            if (old := records.by_key(key)) is not None:
                self._undo(records, old)  # a new setting replaces the old one
            table = nft_table_name(records.next_id)
            apply_ops = [
                Nft(netns, nft_ruleset(table, hook, rules)) for netns, hook, rules in sites
            ]
            undo = [NftDelete(netns, table) for netns, _, _ in sites]
            fault = Fault(records.next_id, kind, key, target, params, (), tuple(undo),
                          apply=tuple(apply_ops))  # fmt: skip
            records.next_id += 1
            return [self._commit(records, fault)]

    def _setting(
        self,
        kind: FaultKind,
        record: LinkRecord,
        sender: str,
        receiver: str,
        params: dict[str, Any],
        apply: PortOp,
        undo: PortOp,
    ) -> list[Fault]:
        """A setting of ``sender``'s egress port on the link.  Shaping and trimming own the
        port's root qdisc and are refused while a netem sits under it (they would silently
        replace it); a netem owns the port's netem."""
        target = f"{record.name} {sender}>{receiver}"
        key = f"{kind} {target}"
        netem_here = netem_resource(apply.netns, apply.ifname)
        held = netem_here if kind == FaultKind.NETEM else qdisc_resource(apply.netns, apply.ifname)
        with locked_records(self.state.name) as records:
            if held != netem_here and (holder := records.holder(netem_here)) is not None:
                raise FaultError(f"{kind} {target}: the port has {holder.describe()}, "
                                 f"which {kind} would replace; clear it first")  # fmt: skip
            if (old := records.by_key(key)) is not None:
                self._undo(records, old)
            if (holder := records.holder(held)) is not None:
                raise FaultError(f"{kind} {target}: {held.split()[1]} is taken by "
                                 f"{holder.describe()}; clear that first")  # fmt: skip
            fault = Fault(records.next_id, kind, key, target, params, (held,), (undo,),
                          apply=(apply,))  # fmt: skip
            records.next_id += 1
            return [self._commit(records, fault)]


class Armed:
    """Faults recorded by :meth:`Faults.arm`, applied by :meth:`fire` (once) or dropped by
    :meth:`cancel`; either releases the namespace threads kept for them."""

    def __init__(self, harness: Faults, faults: Sequence[Fault]) -> None:
        self.harness = harness
        self.faults = tuple(faults)
        self._done = False
        self._threads = ExitStack()
        namespaces = [
            op.netns for f in self.faults for op in f.apply if isinstance(op, NamespaceOp)
        ]
        try:
            self._threads.enter_context(resident_netns(namespaces))
        except BaseException:
            harness._forget(self.faults)
            raise

    def fire(self) -> list[Fault]:
        """Apply every armed fault now, in order.  If one fails, it is undone and forgotten
        with those not applied yet, and the error is raised (the ones before it stay)."""
        if self._done:
            raise FaultError("armed faults fire once: these were fired or cancelled")
        self._done = True
        harness = self.harness
        try:
            for index, fault in enumerate(self.faults):
                try:
                    for op in fault.apply:
                        ops.execute(harness.state, op, harness.log)
                except BaseException:
                    with suppress(TestbedError), locked_records(harness.state.name) as records:
                        harness._undo(records, fault)  # the original failure is the one to report
                    harness._forget(self.faults[index + 1 :])
                    raise
                harness.log(f"apply {fault.describe()}: {summary(fault.apply)}")
        finally:
            self._threads.close()
        return list(self.faults)

    def cancel(self) -> None:
        """Forget faults that were never fired (nothing was applied); a no-op after fire."""
        if not self._done:
            self._done = True
            self._threads.close()
            self.harness._forget(self.faults)
