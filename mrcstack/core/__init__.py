"""The sans-IO protocol core: one MRC connection (a QP), its EV set, loss recovery and CC.

Nothing here reads a clock, opens a socket or draws global randomness: time is a parameter
and randomness an injected, seeded ``random.Random`` (:mod:`.connection` is the entry).
"""
