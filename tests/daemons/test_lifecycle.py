"""What both daemons do alike once started (``mrcstack.daemons.lifecycle``)."""

from __future__ import annotations

import gc

from mrcstack.daemons import lifecycle


def test_settling_leaves_what_start_up_built_out_of_full_collections() -> None:
    """After :func:`lifecycle.settle` a full collection walks only what came after it: the
    start-up's objects (here a thousand lists) are in the permanent generation."""
    built = [[i] for i in range(1000)]
    frozen = gc.get_freeze_count()
    try:
        lifecycle.settle()
        assert gc.get_freeze_count() >= frozen + len(built)
        assert not any(o is built for o in gc.get_objects(generation=2))
        later: list[list[int]] = [[1]]
        gc.collect(1)  # (its survivors move up to the oldest generation)
        assert any(o is later for o in gc.get_objects(generation=2))
    finally:
        gc.unfreeze()  # (this process is the test runner, not a daemon)
