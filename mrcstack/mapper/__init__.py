"""The fabric mapper's core, without I/O: probe loops, the plan, agents' results, and the
localization of bad links by tomography.

The mapper daemon (``mrcmapper``), mrcd's probing agent and the simulator all drive these
objects; none of them reads a clock or opens a socket.  Modules, from the top down (each
imports only those below it):

- :mod:`.localize`: :class:`~.localize.Localizer`: results and the time in, link states
  (:class:`~.localize.LinkChange`) out; the tests it runs (down, lossy with a stated
  confidence, good again) and the hold-down.
- :mod:`.messages`: what agents and the mapper say to each other, checked on the way in.
- :mod:`.agent`: :class:`~.agent.ProbeAgent`: one host's rounds of probes and their
  results (:class:`~.agent.PathResult`).
- :mod:`.linkstate`: the link states and the one table of their transitions.
- :mod:`.denylist`: the EVs of a QP whose path crosses a denied link.
- :mod:`.cost`: packets and bytes probing costs per host and per link.
- :mod:`.plan`: :func:`~.plan.make_plan`: which host probes which loop (short loops and
  hairpins through each T1), from the fabric and :mod:`mrcstack.addrplan`.
"""
