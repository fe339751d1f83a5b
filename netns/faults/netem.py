"""netem faults: delay, jitter, burst loss, reordering, duplication, corruption, rate, slots.

Pure planning (:class:`NetemSpec`, :func:`parse_spec`, :func:`tc_args`) and the two kernel
operations (:func:`attach`, :func:`detach`).  netem goes on a port's egress without
replacing what shapes or trims it: on a port whose root is a tbf (the testbed's shaping of
that tier, or a ``shape`` fault) it becomes the tbf's child, so packets are delayed and then
shaped; on a trimmed port (the trim program's htb) it becomes the child of the data class,
so trimmed headers still jump the queue; elsewhere it is the root qdisc.  Its handle is
``6e65:`` ("ne"), so undo removes exactly it.

Where the kernel has no ``sch_netem`` (the project's CI kernel, built without modules, is
one), :func:`require_netem` says so in one line before anything is applied.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from mrcstack.fabric import format_rate, parse_rate
from mrcstack.netns import testbed
from mrcstack.netns.faults import plan
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.run import TestbedError, one_line, run

HANDLE = "6e65:"
#: The keys of a scenario's netem step (the CLI's flags, with underscores).
NETEM_KEYS = frozenset({"delay", "jitter", "distribution", "loss", "loss_gemodel", "reorder",
                        "gap", "duplicate", "corrupt", "rate", "slot", "limit"})  # fmt: skip
DISTRIBUTIONS = ("normal", "pareto", "paretonormal")
TRIM_DATA_CLASS = "7472:20"  # the trim program's htb class for data (mrcstack.netns.trim)
_TIME = re.compile(r"^(\d+(?:\.\d+)?)(s|ms|us)$")
_SCALE = {"s": 1.0, "ms": 1e-3, "us": 1e-6}


@dataclass(frozen=True, slots=True)
class NetemSpec:
    """One netem setting; zero/None fields are left out of the qdisc."""

    delay_s: float = 0.0
    jitter_s: float = 0.0
    distribution: str | None = None
    loss: float = 0.0
    loss_gemodel: tuple[float, float, float, float] | None = None  # p, r, 1-h, 1-k
    reorder: float = 0.0
    gap: int = 0
    duplicate: float = 0.0
    corrupt: float = 0.0
    rate_bps: float | None = None
    slot: tuple[str, ...] = ()  # tc's own slot arguments, e.g. ("800us", "1ms", "packets", "8")
    limit: int | None = None

    def to_params(self) -> dict[str, Any]:
        """The JSON form recorded with the fault (what :func:`parse_spec` reads back)."""
        out: dict[str, Any] = {}
        for key in ("delay_s", "jitter_s", "loss", "reorder", "duplicate", "corrupt"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        for key in ("distribution", "rate_bps", "limit"):
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
        if self.gap:
            out["gap"] = self.gap
        if self.loss_gemodel is not None:
            out["loss_gemodel"] = list(self.loss_gemodel)
        if self.slot:
            out["slot"] = list(self.slot)
        return out


def parse_time(text: str, what: str) -> float:
    match = _TIME.match(str(text).strip())
    if match is None:
        raise FaultError(f"netem: {what} {text!r}: expected a time like 10ms, 500us or 1s")
    return float(match.group(1)) * _SCALE[match.group(2)]


def parse_probability(text: str | float, what: str) -> float:
    """``1%`` or ``0.01``, in (0, 1] (the harness's own rule for loss probabilities)."""
    try:
        return plan.parse_probability(text)
    except FaultError:
        raise FaultError(
            f"netem: {what} {text!r}: expected a probability in (0, 1] like 1% or 0.01"
        ) from None


def parse_spec(args: dict[str, Any]) -> NetemSpec:
    """A spec from CLI flags or a scenario step (keys as the flags, without dashes, or the
    recorded names); one-line FaultError on any mistake, including tc's own rules."""

    def get(*names: str) -> Any:
        for name in names:
            if args.get(name) not in (None, "", ()):
                return args[name]
        return None

    delay = get("delay_s") if get("delay_s") is not None else get("delay")
    jitter = get("jitter_s") if get("jitter_s") is not None else get("jitter")
    spec = NetemSpec(
        delay_s=float(delay) if isinstance(delay, int | float) else (
            parse_time(delay, "delay") if delay is not None else 0.0),
        jitter_s=float(jitter) if isinstance(jitter, int | float) else (
            parse_time(jitter, "jitter") if jitter is not None else 0.0),
        distribution=get("distribution"),
        loss=parse_probability(get("loss"), "loss") if get("loss") is not None else 0.0,
        loss_gemodel=_gemodel(get("loss_gemodel", "loss-gemodel")),
        reorder=parse_probability(get("reorder"), "reorder") if get("reorder") is not None else 0.0,
        gap=int(get("gap") or 0),
        duplicate=(parse_probability(get("duplicate"), "duplicate")
                   if get("duplicate") is not None else 0.0),
        corrupt=parse_probability(get("corrupt"), "corrupt") if get("corrupt") is not None else 0.0,
        rate_bps=_rate(get("rate_bps", "rate")),
        slot=tuple(str(x) for x in (get("slot") or ())) if not isinstance(get("slot"), str)
        else tuple(str(get("slot")).split()),
        limit=int(get("limit")) if get("limit") is not None else None,
    )  # fmt: skip
    check(spec)
    return spec


def _gemodel(value: Any) -> tuple[float, float, float, float] | None:
    if value is None:
        return None
    parts = value.split(",") if isinstance(value, str) else list(value)
    if len(parts) != 4:
        raise FaultError(f"netem: loss-gemodel {value!r}: expected p,r,1-h,1-k (four values)")
    p, r, h, k = (parse_probability(x, "loss-gemodel") for x in parts)
    return (p, r, h, k)


def _rate(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value) if isinstance(value, int | float) else float(parse_rate(str(value)))
    except ValueError as exc:
        raise FaultError(f"netem: rate {value!r}: {exc}") from None


def check(spec: NetemSpec) -> None:
    """tc's rules, said before tc says them less clearly."""
    if spec.jitter_s and not spec.delay_s:
        raise FaultError("netem: --jitter needs --delay")
    if spec.distribution is not None:
        if spec.distribution not in DISTRIBUTIONS:
            raise FaultError(
                f"netem: distribution {spec.distribution!r}: one of {', '.join(DISTRIBUTIONS)}"
            )
        if not spec.jitter_s:
            raise FaultError("netem: --distribution needs --jitter")
    if spec.loss and spec.loss_gemodel is not None:
        raise FaultError("netem: give --loss or --loss-gemodel, not both")
    if spec.reorder and not spec.delay_s:
        raise FaultError("netem: --reorder needs --delay (netem reorders by not delaying)")
    if spec.gap and not spec.reorder:
        raise FaultError("netem: --gap needs --reorder")
    if spec.gap < 0 or (spec.limit is not None and spec.limit < 1):
        raise FaultError("netem: --gap must be >= 0 and --limit >= 1")
    if spec.rate_bps is not None and spec.rate_bps <= 0:
        raise FaultError("netem: --rate must be positive")
    if spec == NetemSpec():
        raise FaultError("netem: nothing to do: give at least one of --delay, --loss, ...")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f}us"


def _pct(p: float) -> str:
    return f"{p * 100:.6g}%"


def tc_args(spec: NetemSpec) -> list[str]:
    """The ``netem ...`` part of a tc command for ``spec``."""
    out = ["netem"]
    if spec.limit is not None:
        out += ["limit", str(spec.limit)]
    if spec.delay_s:
        out += ["delay", _us(spec.delay_s)]
        if spec.jitter_s:
            out.append(_us(spec.jitter_s))
            if spec.distribution:
                out += ["distribution", spec.distribution]
    if spec.loss:
        out += ["loss", "random", _pct(spec.loss)]
    if spec.loss_gemodel is not None:
        out += ["loss", "gemodel", *(_pct(x) for x in spec.loss_gemodel)]
    if spec.duplicate:
        out += ["duplicate", _pct(spec.duplicate)]
    if spec.reorder:
        out += ["reorder", _pct(spec.reorder)]
        if spec.gap:
            out += ["gap", str(spec.gap)]
    if spec.corrupt:
        out += ["corrupt", _pct(spec.corrupt)]
    if spec.rate_bps is not None:
        out += ["rate", format_rate(spec.rate_bps)]
    if spec.slot:
        out += ["slot", *spec.slot]
    return out


def parent_for(root: dict[str, Any] | None) -> str:
    """Where netem goes under a port's current root qdisc (``tc -j qdisc show``'s entry):
    the tbf's class, the trim program's data class, or the root itself."""
    if root is None or root.get("kind") in (None, "noqueue", "pfifo_fast", "fq_codel", "mq"):
        return "root"
    handle = str(root.get("handle", ""))
    if root["kind"] == "tbf":
        return f"{handle}1"
    if root["kind"] == "htb" and handle == "7472:":
        return TRIM_DATA_CLASS
    raise FaultError(
        f"netem: the port's root qdisc is {root['kind']} {handle}, which netem cannot join "
        "as a child; clear it first"
    )


def attach_command(netns: str, ifname: str, parent: str, spec: NetemSpec) -> list[str]:
    where = ["root"] if parent == "root" else ["parent", parent]
    return ["tc", "-n", netns, "qdisc", "replace", "dev", ifname, *where,
            "handle", HANDLE, *tc_args(spec)]  # fmt: skip


def _qdiscs(netns: str, ifname: str) -> list[dict[str, Any]]:
    out = run(["tc", "-n", netns, "-j", "qdisc", "show", "dev", ifname]).stdout
    doc: list[dict[str, Any]] = json.loads(out or "[]")
    return doc


def attach(netns: str, ifname: str, spec: NetemSpec) -> None:
    root = next((q for q in _qdiscs(netns, ifname) if q.get("root")), None)
    run(attach_command(netns, ifname, parent_for(root), spec))


def detach(netns: str, ifname: str) -> None:
    """Remove our netem, wherever it sits; idempotent."""
    for q in _qdiscs(netns, ifname):
        if q.get("kind") == "netem" and q.get("handle") == HANDLE:
            where = ["root"] if q.get("root") else ["parent", str(q.get("parent"))]
            run(["tc", "-n", netns, "qdisc", "del", "dev", ifname, *where, "handle", HANDLE])


_NETEM_OK: dict[str, str | None] = {}


def netem_problem(name: str) -> str | None:
    """Why netem cannot be used here (None when it can): tried once per process on the
    loopback of testbed ``name``'s throwaway probe namespace."""
    if name not in _NETEM_OK:
        try:
            with testbed.probe_namespace(name) as ns:
                proc = run(["tc", "-n", ns, "qdisc", "add", "dev", "lo", "root", "netem",
                            "delay", "1ms"], check=False)  # fmt: skip
        except TestbedError as exc:
            _NETEM_OK[name] = str(exc)
        else:
            _NETEM_OK[name] = None if proc.returncode == 0 else one_line(proc.stderr) or "failed"
    return _NETEM_OK[name]


def require_netem(name: str) -> None:
    problem = netem_problem(name)
    if problem is not None:
        raise FaultError(
            f"netem: this kernel has no sch_netem (the netem qdisc): {problem.rstrip('.')}; "
            "the other faults (loss, shape, trim, link, switch, nic) do not need it"
        )
