"""The sans-IO protocol core: one MRC connection (a QP), its EV set, loss recovery and CC.

Nothing here reads a clock, opens a socket or draws global randomness: time is a parameter
and randomness an injected, seeded ``random.Random`` (:mod:`.connection` is the entry).

- :mod:`.connection`: the QP: API calls, datagrams and the timer in; datagrams and events out
- :mod:`.sender`: work requests, spraying over EVs, ACK/SACK/NACK intake, completions
- :mod:`.recovery`: loss recovery (in flight, RTT/RTO, RACK, tail-loss probe, stall timer),
  chosen by mode from a registry (go-back-N for the RoCE baseline)
- :mod:`.receiver`: placement on arrival, the cumulative PSN and SACK bitmap, NACKs
- :mod:`.evs`: EV profiles, the EV set and backups, the one EV state table
- :mod:`.cc`: congestion control, a base class and a registry (NSCC by default)
- :mod:`.memory`: registered regions and the rkey/range/permission check
- :mod:`.config`, :mod:`.events`, :mod:`.reasons`, :mod:`.tx`, :mod:`.psn`: what crosses the
  core's boundary (configuration, stats, frozen events, reason enums), the send side's
  records, PSN arithmetic
"""
