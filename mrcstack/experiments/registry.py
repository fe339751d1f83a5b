"""Every experiment, the design's arithmetic, then the simulator's, then the testbed's: the
order ``list`` prints and ``run`` follows.  A new experiment is a module in :mod:`.figures`
and a line here."""

from __future__ import annotations

from mrcstack.experiments.base import Experiment
from mrcstack.experiments.figures import (
    design_arithmetic,
    fig4_job_start,
    fig6_transceiver_flap,
    fig8_t1_reboot,
    fig9a_link_flaps,
    fig9a_testbed,
    fig9b_nic_down_up,
    fig9b_testbed,
    fig9c_many_links,
    fig9d_t1_fail,
    fig9d_testbed,
    fig10_11_switch_fail,
    fig12_lossy_ev,
    fig14_shared_ev,
    fig16_collectives,
    fig18_incast,
    fig20_permutation,
    latency_small_writes,
    mapper_localization,
)

EXPERIMENTS: tuple[Experiment, ...] = (
    design_arithmetic.EXPERIMENT,
    fig6_transceiver_flap.EXPERIMENT,
    fig8_t1_reboot.EXPERIMENT,
    fig9a_link_flaps.EXPERIMENT,
    fig9b_nic_down_up.EXPERIMENT,
    fig9c_many_links.EXPERIMENT,
    fig9d_t1_fail.EXPERIMENT,
    fig10_11_switch_fail.EXPERIMENT,
    fig12_lossy_ev.EXPERIMENT,
    fig14_shared_ev.EXPERIMENT,
    fig16_collectives.EXPERIMENT,
    fig18_incast.EXPERIMENT,
    fig20_permutation.EXPERIMENT,
    latency_small_writes.EXPERIMENT,
    fig4_job_start.EXPERIMENT,
    mapper_localization.EXPERIMENT,
    fig9a_testbed.EXPERIMENT,
    fig9b_testbed.EXPERIMENT,
    fig9d_testbed.EXPERIMENT,
)
