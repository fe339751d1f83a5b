"""The simulator's side of a figure: one place that turns a figure's settings, its profile
and its seed into simulator runs, and keeps every run as a scenario file.

Time scaling: the paper's links run at 400 Gbit/s for seconds; here links run at
:data:`RATE` (10 Gbit/s) for milliseconds, so a run stays small enough for a laptop.  The
protocol's reactions are counted in RTTs, which scale with the link delay and packet size
alike; each result states its rate, fabric and time scale in its parameters.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from mrcstack.experiments.base import Experiment, Mechanism, Outcome, scaled
from mrcstack.fabric import Fabric
from mrcstack.sim import SimConfig, SimResult
from mrcstack.sim import run as sim_run
from mrcstack.sim import scenario as scenario_file

RATE = 10e9
RATE_TEXT = f"{RATE / 1e9:g} Gbit/s per link"
#: MRC next to RoCE mode: one path per flow and go-back-N, what RoCEv2 on ECMP does.
MODES = ("mrc", "roce")
#: How a plot's legend names each mode: the stack and the paths it uses.
MODE_LABELS = {
    "mrc": "MRC (each flow sprayed over every plane)",
    "roce": "RoCE mode (one ECMP path per flow)",
}


def capacity_gbps(fabric: Fabric, pairs: tuple[tuple[int, int], ...]) -> float:
    """What ``pairs`` could move at most (Gbit/s): every plane of each sender, or of each
    receiver, whichever are fewer."""
    ends = min(len({s for s, _ in pairs}), len({d for _, d in pairs}))
    return ends * fabric.planes * RATE / 1e9


def without(mechanism: Mechanism, cfg: SimConfig) -> SimConfig:
    """``cfg`` with ``mechanism`` taken away: MRC runs as RoCE mode, switches that drop
    instead of trimming, switches that never mark ECN (thresholds above the queue), or no
    fabric mapper."""
    if mechanism is Mechanism.MRC:
        return replace(cfg, mode="roce") if cfg.mode == "mrc" else cfg
    if mechanism is Mechanism.TRIMMING:
        return replace(cfg, trim=False)
    if mechanism is Mechanism.ECN:
        queue = cfg.queue_bytes or cfg.fabric.queue_bytes
        return replace(cfg, ecn_kmin_bytes=queue - 2, ecn_kmax_bytes=queue - 1)
    if mechanism is Mechanism.MAPPER:
        return replace(cfg, mapper=None)
    raise ValueError(f"the simulator cannot run without {mechanism}")


@dataclass(slots=True)
class Sim:
    """One figure's runs in one profile and seed: sizes scaled by the profile, every
    configuration at :data:`RATE`, and every run kept, in order, as a scenario file."""

    profile: str
    seed: int
    #: Every run without this mechanism (:func:`without`), None: as shipped.
    sabotage: Mechanism | None = None
    #: The experiment's name (what a caller tuning one figure's runs goes by).
    name: str = ""
    #: (file stem, TOML text) of each run so far.
    scenarios: list[tuple[str, str]] = field(default_factory=list)

    def size(self, quick: int, full: int) -> int:
        return scaled(self.profile, quick, full)

    def seeds(self, quick: int, full: int) -> list[int]:
        """The figure's seed and the ones after it, ``size(quick, full)`` in all."""
        return [self.seed + k for k in range(self.size(quick, full))]

    def config(self, fabric: Fabric, *, seed: int | None = None, **settings: Any) -> SimConfig:
        """A run on ``fabric`` at :data:`RATE`, with the figure's seed unless ``seed``."""
        return SimConfig(
            fabric=fabric, rate_bps=RATE, seed=self.seed if seed is None else seed, **settings
        )

    def run(self, cfg: SimConfig) -> SimResult:
        """The simulator (without the figure's sabotaged mechanism, if any); the run is kept
        as a scenario file, so any one can be rerun alone."""
        if self.sabotage is not None:
            cfg = without(self.sabotage, cfg)
        result = sim_run(cfg)
        stem = f"{len(self.scenarios) + 1:03d}-{cfg.mode}-seed{cfg.seed}"
        self.scenarios.append((stem, scenario_file.dumps(cfg)))
        return result


def params(fabric: str, more: dict[str, Any]) -> dict[str, Any]:
    """A figure's parameters: its fabric and the link rate first, as every result states
    them, then its own."""
    return {"fabric": fabric, "rate": RATE_TEXT, **more}


def simulated(
    name: str,
    figure: str,
    shows: str,
    make: Callable[[Sim], Outcome],
    mechanisms: tuple[Mechanism, ...] = (Mechanism.MRC,),
) -> Experiment:
    """A simulator experiment: ``make`` draws the figure from its runs, which the outcome
    then keeps as scenario files; ``mechanisms``: what its claims credit."""

    def run(profile: str, seed: int, sabotage: Mechanism | None = None) -> Outcome:
        sim = Sim(profile, seed, sabotage, name)
        outcome = make(sim)
        outcome.scenarios.extend(sim.scenarios)
        return outcome

    return Experiment(name, figure, shows, "sim", run, mechanisms=mechanisms)
