"""Admission: how many chat requests one ingress answers at once, and the fast 503 past that.

An overloaded app that admits every request does work for requests it later sheds (a model pool's
queue fills after the image was encoded and a model ran), and its per-request cost grows with what is
in flight: measured on the local app, an open loop at 0.9x capacity tipped and completed 10.5 req/s
of an 18 req/s capacity (docs/capacity.md). A limit at the door rejects before
any work is spent on the request (its body read, nothing parsed, decoded or run): the requests it
admits run at the capacity the limit was sized for. Ray-free: the Router holds one, and the simulator
(capacity/simulate.py) models the same rule."""

from __future__ import annotations

from tandem.errors import Overloaded


class Slot:
    """One admitted request; `release()` is idempotent, so a stream's own `finally` and the
    finalizer that covers a stream never started can both call it."""

    __slots__ = ("_gate", "_held")

    def __init__(self, gate: Admission):
        self._gate, self._held = gate, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self._gate.in_flight -= 1


class Admission:
    def __init__(self, limit: int | None, retry_after_s: float = 1.0):
        self.limit, self.retry_after_s = limit, retry_after_s
        self.in_flight = self.peak = 0
        self.rejected = 0

    def enter(self) -> Slot:
        """A slot, or Overloaded (503 + Retry-After) when `limit` requests are in flight already."""
        if self.limit is not None and self.in_flight >= self.limit:
            self.rejected += 1
            raise Overloaded(f"this server is answering {self.in_flight} requests, its limit "
                             f"(http.max_in_flight); retry shortly", retry_after_s=self.retry_after_s)
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        return Slot(self)
