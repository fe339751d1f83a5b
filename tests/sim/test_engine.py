"""The engine's event order: by time, then by the order events were scheduled."""

from __future__ import annotations

from mrcstack.sim.engine import Engine


def test_same_instant_events_run_in_scheduling_order() -> None:
    engine = Engine()
    ran: list[str] = []
    engine.at(2.0, ran.append, "c")
    engine.at(1.0, ran.append, "a")
    engine.at(2.0, ran.append, "d")
    engine.at(1.0, ran.append, "b")

    def chain(tag: str) -> None:
        ran.append(tag)
        engine.at(engine.now, ran.append, tag + "+")  # the same instant: after the rest

    engine.at(2.0, chain, "e")
    engine.at(2.0, ran.append, "f")
    assert engine.pending == 6
    assert engine.run(10.0) is False
    assert ran == ["a", "b", "c", "d", "e", "f", "e+"]
    assert engine.events_run == 7 and engine.now == 2.0


def test_an_older_key_is_placed_by_its_sequence_number() -> None:
    engine = Engine()
    _, _, tiebreak = engine.queue()
    ran: list[str] = []
    early = tiebreak()  # a key taken now, scheduled later (as a deferred timer is)
    engine.at(3.0, ran.append, "later")
    engine.add(3.0, (early, ran.append, "early"))
    engine.run(5.0)
    assert ran == ["early", "later"]


def test_stop_leaves_the_rest_of_an_instant_pending() -> None:
    engine = Engine()
    ran: list[str] = []

    def stop(tag: str) -> None:
        ran.append(tag)
        engine.stop()

    engine.at(1.0, stop, "a")
    engine.at(1.0, ran.append, "b")
    engine.at(1.0, ran.append, "c")
    assert engine.run(5.0) is True
    assert ran == ["a"] and engine.pending == 2
    assert engine.run(5.0) is False
    assert ran == ["a", "b", "c"]


def test_events_past_until_stay_pending() -> None:
    engine = Engine()
    ran: list[float] = []
    engine.at(1.0, ran.append, 1.0)
    engine.at(7.0, ran.append, 7.0)
    assert engine.run(5.0) is False
    assert ran == [1.0] and engine.now == 5.0 and engine.pending == 1
