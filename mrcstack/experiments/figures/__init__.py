"""The experiments, one module each, named after the experiment (``fig14-shared-ev``:
:mod:`.fig14_shared_ev`).  A module ends with its ``EXPERIMENT``, which
:mod:`mrcstack.experiments.registry` lists; inside it, the runs, the analysis, the claims
and the prose are separate functions."""
