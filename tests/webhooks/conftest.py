"""Receivers (tests/utils/webhook_receiver.py) started per test and stopped after it."""

from __future__ import annotations

import pytest

from tests.utils.webhook_receiver import Receiver, Trickler


def _started(kind):
    """A factory of `kind` receivers, each stopped once the test ends."""
    started = []

    def make(**kw):
        started.append(kind(**kw).start())
        return started[-1]

    yield make
    for receiver in started:
        receiver.stop()


@pytest.fixture
def receivers():
    yield from _started(Receiver)


@pytest.fixture
def trickler():
    yield from _started(Trickler)
