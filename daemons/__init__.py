"""The daemon side of mrcstack: ``mrcd`` (:mod:`.mrcd`), ``mrcctl``, the perftest-style tools
(:mod:`.tools`) and one mrcd per testbed host (:mod:`.cluster`)."""
