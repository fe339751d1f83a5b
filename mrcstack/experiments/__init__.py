"""The MRC paper's experiments, reproduced side by side with the baselines, with plots.

``mrcstack experiment list`` names them; ``mrcstack experiment run NAME... [--quick]``
writes ``DIR/NAME/`` (``result.json`` with the claims, CSV data, PNG plots) and
``DIR/index.md``.

Modules, from the command down (each imports only those below it):

- :mod:`.cli`: ``mrcstack experiment list | run``.
- :mod:`.registry`: every experiment, in the order they are listed and run.
- :mod:`.figures`: one module per experiment, named after it; each separates its runs,
  its analysis, its claims and its prose, and ends with its ``EXPERIMENT``.
- :mod:`.simruns`: a figure's simulator runs: one :class:`~.simruns.Sim` per figure scales
  sizes and seeds by the profile, builds every ``SimConfig`` at the figures' link rate and
  keeps each run as a scenario file; ``simulated()`` makes it an experiment.
- :mod:`.goodput`: goodput over time in the simulator: fault runs of MRC and RoCE mode,
  spans, worst moments, the timeline table and its plot.
- :mod:`.testbedruns`: a figure's testbed runs (mrcd, TCP, MPTCP across one fault on a
  shaped testbed), their medians, tables and plots, the claims and notes they share;
  ``on_testbed()`` makes it an experiment.
- :mod:`.live`: faults under traffic on the testbed, the measurement shared with the
  failover benchmark; :mod:`.stream` is its TCP/MPTCP endpoint, run as a program.
- :mod:`.analysis`: means, medians, quantiles and ratios; a figure that could not be
  measured is NaN, and its claim fails.
- :mod:`.plots`: the figures' drawings (matplotlib, no display).
- :mod:`.base`: what an experiment is (:class:`Experiment`, :class:`Outcome`,
  :class:`Claim`, :class:`Table`, :class:`Plot`) and the files it writes.

A new experiment is a module in :mod:`.figures` and a line in :mod:`.registry`.
"""

from mrcstack.experiments.base import Claim, Experiment, Outcome, Plot, Table
from mrcstack.experiments.registry import EXPERIMENTS

__all__ = ["EXPERIMENTS", "Claim", "Experiment", "Outcome", "Plot", "Table"]
