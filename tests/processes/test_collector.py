"""The setup of a run is kept out of Python's garbage collections while it trains, and given back
when the last run ends (bno_hvd/processes/collector.py)."""

import gc
import weakref

import pytest

from bno_hvd.processes import collector
from bno_hvd.processes.collector import hold_setup, release_setup


class Node:
    pass


def cycle():
    """An object in a reference cycle (only a collection frees it) and a weak reference to it."""
    node = Node()
    node.me = node
    return weakref.ref(node)


@pytest.fixture(autouse=True)
def nothing_frozen():
    """No hold of another test of this worker process (a run set up in-process and not ended) counts here."""
    gc.unfreeze()
    collector._holders[0] = 0
    yield
    while gc.get_freeze_count():
        release_setup()
    collector._holders[0] = 0


def test_the_setup_is_out_of_collections_and_comes_back_when_the_last_run_ends():
    setup = cycle()  # garbage from the setup: kept while a run holds the setup
    hold_setup()
    assert gc.get_freeze_count() > 1000  # everything the test process tracks (pytest, numpy, ...)
    hold_setup()  # a second run alive at once (bench --rounds)
    trained = cycle()  # garbage made while training is still freed
    gc.collect()
    assert trained() is None and setup() is not None
    release_setup()  # one run ended, the other still trains
    gc.collect()
    assert gc.get_freeze_count() > 1000 and setup() is not None
    release_setup()
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert setup() is None


def test_a_full_collection_walks_only_what_came_after_the_setup():
    kept = [[i] for i in range(200_000)]  # long-lived objects of a setup
    gc.collect()
    before = len(gc.get_objects(generation=2))
    hold_setup()
    after = len(gc.get_objects(generation=2))
    release_setup()
    assert before >= len(kept) > 100 * after
    assert len(gc.get_objects(generation=2)) >= len(kept)


def test_releasing_more_often_than_holding_changes_nothing():
    release_setup()
    hold_setup()
    assert gc.get_freeze_count() > 0
    release_setup()
    assert gc.get_freeze_count() == 0
