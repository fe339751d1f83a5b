"""The experiments, one module each, named after the experiment (``fig14-shared-ev``:
:mod:`.fig14_shared_ev`).  A module ends with its ``EXPERIMENT``, which
:mod:`mrcstack.experiments.registry` lists; inside it, the runs, the analysis, the claims
and the prose are separate functions.  :mod:`.fig4_testbed` is the testbed half of
``fig4-job-start`` (:mod:`.fig4_job_start`), which runs it as root."""
