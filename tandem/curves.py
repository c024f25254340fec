"""A service time as a function of one size, from measured points: what a stage profile's curves are
made of, for the capacity simulator and the paced engine alike."""

from __future__ import annotations

import bisect


class Curve:
    """Milliseconds as a function of one size, piecewise linear through measured points; past either
    end, the nearest segment's line (never below the smallest measured time)."""

    def __init__(self, points: list[tuple[float, float]]):
        if not points:
            raise ValueError("a curve needs at least one measured point")
        pts = sorted(points)
        self.xs, self.ys = [float(x) for x, _ in pts], [float(y) for _, y in pts]
        self.floor = min(self.ys)
        self._at: dict[float, float] = {}  # a simulation asks for the same few sizes millions of times

    def __call__(self, x: float) -> float:
        y = self._at.get(x)
        if y is None:
            y = self._at[x] = self._interpolate(x)
        return y

    def _interpolate(self, x: float) -> float:
        xs, ys = self.xs, self.ys
        if len(xs) == 1:
            return ys[0]
        i = min(max(bisect.bisect_left(xs, x), 1), len(xs) - 1)
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        y = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
        return max(self.floor, y)


def generator_curves(gen: dict, step_overhead_ms: float = 0.0) -> tuple[Curve, Curve]:
    """A generator's (prefill, step) curves from a profile's `generators.<role>` entry: a join's
    prefill by the joining rows' total prompt tokens, a step by the rows running (plus what a served
    step costs beyond the engine's, if given)."""
    return (Curve([(p["batch"] * p["prompt_tokens"], p["ms"]) for p in gen["prefill"]]),
            Curve([(p["batch"], p["ms"] + step_overhead_ms) for p in gen["step"]]))
