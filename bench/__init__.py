"""`make bench` (``python -m bench``): the numbers later work is measured against.

- :mod:`.__main__`: runs every section and prints its table and ratios;
- :mod:`.wire_bench`: codec packets/s and MB/s in each integrity mode;
- :mod:`.sim_bench`: a full simulated transfer, the core's CPU per packet, and the scaling
  cases as a ratio to a baseline revision measured in the same run;
- :mod:`.testbed_bench`: testbed build and teardown times;
- :mod:`.daemon_bench`: mrcd goodput next to a raw UDP blast, kernel TCP and MPTCP;
- :mod:`.mptcp`: what an MPTCP socket really did (subflows, fallback), for that baseline;
- :mod:`.failover_bench`: what a fault mid-transfer costs mrcd, next to MPTCP;
- :mod:`.mapper_bench`: the fabric mapper's probe cost, fault-to-denylist time, a long run
  with no fault;
- :mod:`.srh_bench`: how to send an SRH from user space, decided by measurement.
"""
