"""The testbed's side of a figure: mrcd next to kernel TCP and MPTCP across one fault.

Each experiment builds its own testbed of the default fabric with every link shaped to
200 Mbit/s (so the fabric, not the daemons' CPU, is the bottleneck), runs mrcd on every
host, and moves data h0 -> h3 (different racks) across a fault with each stack in turn:
mrcd (one QP, 256 KiB writes), kernel TCP between the plane-0 addresses (the fabric's ECMP
picks its path) and MPTCP with one subflow per plane.  The measurement and the figures of
merit are the failover benchmark's (:mod:`.live`, :func:`mrcstack.progress.analyze`):
progress lost as milliseconds at the stack's own pre-fault rate, and the time until its
goodput is back within 10% of that rate.  Needs root (network namespaces).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mrcstack.experiments import live
from mrcstack.experiments.analysis import median
from mrcstack.experiments.base import Claim, Experiment, Op, Outcome, Plot, Table, scaled
from mrcstack.experiments.live import FaultCase, Run
from mrcstack.experiments.plots import bars, lines
from mrcstack.fabric import Fabric
from mrcstack.progress import Impact

BIN_S = 0.050  # 256 KiB writes complete in bursts: 10 ms bins are mostly noise
WINDOW_S = 1.5
#: Milliseconds a stack's recovery may take and still count as "tens of milliseconds".
MRCD_RECOVERY_MS = 100.0
#: Per stack, the medians over its runs: ``restore_ms``, ``lost_ms``, ``recovery_ms``,
#: ``pre_mbps`` (see :func:`outcome`).
Figures = dict[str, dict[str, float]]


def on_testbed(
    name: str, figure: str, shows: str, run: Callable[[str, int], Outcome]
) -> Experiment:
    """A testbed experiment (it needs root: it builds network namespaces)."""
    return Experiment(name, figure, shows, "testbed", run, needs_root=True)


# The runs -----------------------------------------------------------------------------------
def testbed_runs(profile: str, case: FaultCase, testbed_name: str) -> dict[str, list[Run]]:
    """Every stack across ``case`` on a fresh shaped testbed, once each in the quick
    profile, three times in the full one."""
    with live.bed(live.shaped(Fabric()), testbed_name) as (state, cluster):
        live.mptcp_setup(state)
        return live.measure(
            state, cluster, case, live.STACKS, scaled(profile, 1, 3), window_s=WINDOW_S
        )


# The analysis -------------------------------------------------------------------------------
def _impact(run: Run) -> Impact | None:
    """The run's own figures (its recovery does not depend on a row's horizon); None for
    a run that moved nothing before the fault."""
    try:
        return run.impact(live.PRE_S, WINDOW_S)
    except ValueError:
        return None


def _ended_s(run: Run, back_at_s: float) -> float:
    """When a lasting fault ended in ``run`` (s after the fault): at the end of its last later
    step (the command that brings ports back, their addresses and routes included), or at
    ``back_at_s`` for a run that recorded none."""
    return run.steps_ms[-1] / 1e3 if run.steps_ms else back_at_s


def _since(recovery_ms: float, back_at_s: float) -> float:
    """A recovery time counted from ``back_at_s`` after the fault; not back within the
    window counts as the window (a number a bar can show)."""
    return max(0.0, min(recovery_ms, WINDOW_S * 1e3) - back_at_s * 1e3)


def _figures(rs: Sequence[Run], back_at_s: float) -> dict[str, float]:
    """One stack's medians over its runs (a run that never started is left out)."""
    row, _ = live.impacts(rs, live.PRE_S, WINDOW_S)  # progress lost counted to one horizon for all
    ended = [(_ended_s(r, back_at_s) if back_at_s else 0.0, i)
             for r in rs if (i := _impact(r)) is not None]  # fmt: skip
    recoveries = [_since(i.recovery_ms, at) for at, i in ended]
    return {
        "restore_ms": median([(at - back_at_s) * 1e3 for at, _ in ended]),
        "lost_ms": median([i.lost_ms for i in row]),
        # Rounded: float residue must not fail a claim at its threshold (a recovery of
        # exactly 100 ms after the ports returned once read 100.00000000000011).
        "recovery_ms": round(median(recoveries), 6),
        "pre_mbps": median([i.pre_rate_bps / 1e6 for i in row]),
    }


def _timeline(runs: Sequence[Run], start_s: float, end_s: float) -> list[float]:
    """The first run's goodput in Mbit/s per bin, relative to its fault."""
    return [b / 1e6 for b in runs[0].timeline(BIN_S, start_s, end_s)]


def _tables(runs: dict[str, list[Run]], figures: Figures) -> list[Table]:
    start, end = -0.3, WINDOW_S
    series = {stack: _timeline(rs, start, end) for stack, rs in runs.items()}
    count = len(next(iter(series.values())))
    goodput = tuple(
        (round((start + i * BIN_S) * 1e3, 1), *(round(series[s][i], 2) for s in live.STACKS))
        for i in range(count)
    )
    recovery = tuple(
        (s, *(round(figures[s][k], 1) for k in ("recovery_ms", "lost_ms", "pre_mbps")))
        for s in live.STACKS
    )
    return [
        Table("goodput", ("time_ms", *live.STACKS), goodput),
        Table("recovery", ("stack", "recovery_ms", "lost_ms", "pre_fault_mbps"), recovery),
    ]


def _plots(title: str, marks: Sequence[tuple[float, str]]) -> list[Plot]:
    return [
        Plot(
            "goodput",
            "goodput over time (first run of each stack)",
            lines(
                "goodput",
                "time_ms",
                list(live.STACKS),
                xlabel="time since the fault (ms)",
                ylabel="goodput (Mbit/s)",
                title=title,
                marks=marks,
            ),
        ),
        Plot(
            "recovery",
            "recovery time per stack",
            bars(
                "recovery",
                "stack",
                ["recovery_ms", "lost_ms"],
                ylabel="ms (median over runs)",
                title=f"{title}: recovery and progress lost",
            ),
        ),
    ]


def outcome(
    runs: dict[str, list[Run]],
    case: FaultCase,
    *,
    title: str,
    marks: Sequence[tuple[float, str]],
    back_at_s: float = 0.0,
) -> tuple[Outcome, Figures]:
    """The timeline and recovery bars from the runs and, per stack, the medians of
    ``lost_ms``, ``recovery_ms`` and ``pre_mbps``.  With ``back_at_s`` (when a lasting fault,
    such as ports kept down, is undone), recovery counts from the fault's end
    (:func:`_ended_s`), and ``restore_ms`` is how long undoing it took."""
    figures = {stack: _figures(rs, back_at_s) for stack, rs in runs.items()}
    result = Outcome(
        params={
            "fabric": "4 planes x 4 T1, 2 racks x 2 hosts (namespaces, kernel SRv6)",
            "links": f"every link shaped to {live.SHAPED_BPS / 1e6:.0f} Mbit/s",
            "transfer": "h0 -> h3; mrcd 256 KiB writes x 16 in flight; TCP/MPTCP 256 KiB sends",
            "fault": case.text,
            "runs_per_stack": len(runs["mrcd"]),
            "bin_ms": BIN_S * 1e3,
        },
        tables=_tables(runs, figures),
        plots=_plots(title, marks),
    )
    return result, figures


# The claims and the prose -------------------------------------------------------------------
def claims(figures: Figures, what: str) -> list[Claim]:
    """mrcd recovers within :data:`MRCD_RECOVERY_MS` ``what``, faster than MPTCP, and
    loses less progress."""
    mrcd, mptcp = figures["mrcd"], figures["mptcp"]
    return [
        Claim(
            f"mrcd's goodput is back within 10% {what} (ms, median)",
            mrcd["recovery_ms"],
            MRCD_RECOVERY_MS,
            Op.AT_MOST,
        ),
        Claim(
            f"mrcd's recovery minus MPTCP's {what} (ms; negative: mrcd is faster)",
            mrcd["recovery_ms"] - mptcp["recovery_ms"],
            0.0,
            Op.AT_MOST,
        ),
        Claim(
            "mrcd's progress lost minus MPTCP's (ms at each one's pre-fault rate)",
            mrcd["lost_ms"] - mptcp["lost_ms"],
            0.0,
            Op.AT_MOST,
        ),
    ]


def notes(figures: Figures) -> list[str]:
    tcp = figures["tcp"]
    return [
        "Kernel TCP uses plane 0 only (at most a quarter of the shaped capacity) and the "
        "fabric's ECMP hash picks its T1: it is hurt only by faults on its own path, "
        f"here {tcp['lost_ms']:.0f} ms of progress lost and {tcp['recovery_ms']:.0f} ms to "
        "recover.",
        "Times are wall clock on a shared machine: runs vary by tens of milliseconds.",
    ]


def testbed_figure(
    profile: str,
    case: FaultCase,
    testbed_name: str,
    *,
    title: str,
    marks: Sequence[tuple[float, str]],
    what: str,
) -> Outcome:
    """The runs across ``case``, their outcome, the shared claims (recovery ``what``) and
    notes: a testbed figure that states nothing of its own."""
    result, figures = outcome(
        testbed_runs(profile, case, testbed_name), case, title=title, marks=marks
    )
    result.claims = claims(figures, what)
    result.notes = notes(figures)
    return result
