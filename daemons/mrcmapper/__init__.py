"""``mrcmapper``, the fabric mapper's central daemon (docs/mapper.md).

Modules, from the command down (each imports only those below it):

- :mod:`.main`: the ``mrcmapper`` command: config, start in order, stop in reverse.
- :mod:`.server`: the agents' listener: the control channel's handshake and records, one
  session per host, everything refused counted.
- :mod:`.metrics`, :mod:`.picture`: ``/metrics`` (links, hosts, the mapper) and
  ``/fabric.png``, both from the service's status.
- :mod:`.service`: the localizer fed by the agents, the denylist and its pushes, the status.
- :mod:`.status`: the status as text (``mrcstack mapper status``).
- :mod:`.config`: ``[mrcmapper]`` and ``[fabric]``, one-line errors.
"""
