"""Every experiment, simulator first: the order ``list`` prints and ``run`` follows."""

from __future__ import annotations

from mrcstack.experiments.base import Experiment
from mrcstack.experiments.simexp import EXPERIMENTS as SIM
from mrcstack.experiments.testbedexp import EXPERIMENTS as TESTBED

EXPERIMENTS: tuple[Experiment, ...] = (*SIM, *TESTBED)
