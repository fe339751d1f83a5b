"""The MRC paper's experiments, reproduced side by side with the baselines, with plots.

``mrcstack experiment list`` names them; ``mrcstack experiment run NAME... [--quick]
[--without MECHANISM]`` writes ``DIR/NAME/`` (``result.json`` with the claims, CSV data, PNG
plots) and ``DIR/index.md``; ``mrcstack experiment agree DIR...`` compares reports.  Every
claim credits one mechanism, and run without it, fails.

Modules, from the command down (each imports only those below it):

- :mod:`.cli`: ``mrcstack experiment list | run | agree``.
- :mod:`.registry`: every experiment, in the order they are listed and run;
  :mod:`.report`: the report, ``index.md``, with the paper's figures and where each stands;
  :mod:`.agreement`: whether several reports agree on every claim.
- :mod:`.figures`: one module per experiment, named after it; each separates its runs,
  its analysis, its claims and its prose, and ends with its ``EXPERIMENT``.
- :mod:`.production`: the 64-host, 8-plane job the production events (Figs 6, 8) run
  under, and its throughput (the slowest QP's pace).
- :mod:`.simruns`: a figure's simulator runs: one :class:`~.simruns.Sim` per figure scales
  sizes and seeds by the profile, builds every ``SimConfig`` at the figures' link rate,
  takes away the mechanism it runs without, and keeps each run as a scenario file;
  ``simulated()`` makes it an experiment.
- :mod:`.goodput`: goodput over time in the simulator: fault runs of MRC and RoCE mode,
  where RoCE mode's flows are (to place a fault on them), spans, worst moments, claims
  pooled over seeds, the timeline table and its plot.
- :mod:`.testbedruns`: a figure's testbed runs (mrcd, TCP, MPTCP across one fault on the
  baselines' paths of a shaped testbed, several times each), their medians and ranges,
  tables and plots, the claims and notes they share; ``on_testbed()`` makes it an
  experiment.
- :mod:`.live`: faults under traffic on the testbed, the measurement shared with the
  failover benchmark; :mod:`.stream` is its TCP/MPTCP endpoint, run as a program.
- :mod:`.analysis`: means, medians, quantiles and ratios; a figure that could not be
  measured is NaN, and its claim fails.
- :mod:`.plots`: the figures' drawings (matplotlib, no display).
- :mod:`.base`: what an experiment is (:class:`Experiment`, :class:`Outcome`,
  :class:`Claim`, :class:`Mechanism`, :class:`Table`, :class:`Plot`) and the files it
  writes.

A new experiment is a module in :mod:`.figures` and a line in :mod:`.registry`.
"""

from mrcstack.experiments.base import Claim, Experiment, Mechanism, Outcome, Plot, Table
from mrcstack.experiments.registry import EXPERIMENTS

__all__ = ["EXPERIMENTS", "Claim", "Experiment", "Mechanism", "Outcome", "Plot", "Table"]
