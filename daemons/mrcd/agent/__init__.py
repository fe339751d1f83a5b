"""The fabric mapper's probing agent in mrcd: its share of the probe plan on the fabric,
its results to the mapper, the mapper's denylist into the controller API.

- :mod:`.agent`: :class:`~.agent.MapperAgent`: the rounds (one timer), the reports, the
  denylists applied; what the metrics read.
- :mod:`.session`: the authenticated session to ``mrcmapper`` (the control channel's
  handshake and records), reconnecting while the mapper is away.
- :mod:`.linkprobes`: a UDP socket per plane for the loops, probes sealed with AES-GCM
  under a key only this mrcd holds, every refused reply counted.
"""
