"""The MRC paper's experiments, reproduced side by side with the baselines, with plots.

``mrcstack experiment list`` names them; ``mrcstack experiment run NAME... [--quick]``
writes ``DIR/NAME/`` (``result.json`` with the claims, CSV data, PNG plots) and
``DIR/index.md``.  Modules: :mod:`.base` (claims, tables, the files), :mod:`.plots`
(matplotlib), :mod:`.simexp` (the simulator's experiments), :mod:`.live` (faults under
traffic on the testbed, shared with the failover benchmark), :mod:`.testbedexp` (the
testbed's experiments: mrcd next to TCP and MPTCP), :mod:`.registry`, :mod:`.cli`.
"""

from mrcstack.experiments.base import Claim, Experiment, Outcome, Plot, Table
from mrcstack.experiments.registry import EXPERIMENTS

__all__ = ["EXPERIMENTS", "Claim", "Experiment", "Outcome", "Plot", "Table"]
