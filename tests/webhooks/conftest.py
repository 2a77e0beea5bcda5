"""Receivers (tests/utils/webhook_receiver.py) started per test and stopped after it."""

from __future__ import annotations

import pytest

from tests.utils.webhook_receiver import Receiver, Trickler


@pytest.fixture
def receivers():
    started: list[Receiver] = []

    def make(**kw) -> Receiver:
        started.append(Receiver(**kw).start())
        return started[-1]

    yield make
    for receiver in started:
        receiver.stop()


@pytest.fixture
def trickler():
    started: list[Trickler] = []

    def make(**kw) -> Trickler:
        started.append(Trickler(**kw).start())
        return started[-1]

    yield make
    for one in started:
        one.stop()
