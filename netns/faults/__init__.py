"""The fault harness: reversible kernel faults on a running testbed, and timed scenarios of them."""

from mrcstack.netns.faults.harness import Armed, Faults
from mrcstack.netns.faults.plan import FaultError
from mrcstack.netns.faults.records import Fault

__all__ = ["Armed", "Fault", "FaultError", "Faults"]
