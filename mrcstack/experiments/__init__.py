"""The MRC paper's experiments, reproduced side by side with the baselines, with plots.

``mrcstack experiment list`` names them; ``mrcstack experiment run NAME... [--quick]``
writes ``DIR/NAME/`` (``result.json`` with the claims, CSV data, PNG plots) and
``DIR/index.md``.  Modules: :mod:`.base` (claims, tables, the files), :mod:`.plots`
(matplotlib), :mod:`.simexp` (the simulator's experiments), :mod:`.cli`.
"""

from mrcstack.experiments.base import Claim, Experiment, Outcome, Plot, Table
from mrcstack.experiments.simexp import EXPERIMENTS

__all__ = ["EXPERIMENTS", "Claim", "Experiment", "Outcome", "Plot", "Table"]
