"""The ingress's admission limit (tandem/admission.py): at most `limit` requests in flight, a 503
with Retry-After past it, and slots that come back however a request ends."""

from __future__ import annotations

import pytest

from tandem.admission import Admission
from tandem.errors import Overloaded


def test_past_the_limit_a_request_is_overloaded_until_a_slot_comes_back():
    gate = Admission(2, retry_after_s=3)
    a, b = gate.enter(), gate.enter()
    with pytest.raises(Overloaded) as err:
        gate.enter()
    assert err.value.status == 503 and err.value.retry_after_s == 3 and "max_in_flight" in str(err.value)
    assert (gate.in_flight, gate.peak, gate.rejected) == (2, 2, 1)
    a.release()
    c = gate.enter()
    assert gate.in_flight == 2
    for slot in (b, c):
        slot.release()
    assert gate.in_flight == 0 and gate.peak == 2


def test_a_slot_released_twice_frees_one_place():
    gate = Admission(1)
    slot = gate.enter()
    slot.release()
    slot.release()  # a stream's finally and its finalizer may both run
    assert gate.in_flight == 0
    gate.enter()
    with pytest.raises(Overloaded):
        gate.enter()


def test_without_a_limit_every_request_is_admitted():
    gate = Admission(None)
    slots = [gate.enter() for _ in range(1000)]
    assert gate.in_flight == 1000 and gate.rejected == 0
    for s in slots:
        s.release()
    assert gate.in_flight == 0
