"""The machine's own speed over time, measured beside a load: a canary process times one fixed unit of
pure-Python work every `interval_s` — its CPU time, so waiting for a core does not count, only how fast
a core runs it. On this shared VM that time moves about 2x within seconds, with no steal reported (a
neighbour on the same physical core or its caches, or the clock): a probe's unit took 4.8-12 ms,
idle or loaded, and the app's CPU per request and closed-loop throughput moved with it
(benchmarks/README.md, "Runs 44–52"). The simulator takes it as the machine's capacity over each
load, as it takes steal — to first order: torch's kernels do not speed up or slow down quite as much.

    with Canary() as canary:
        t0 = time.monotonic(); ...; t1 = time.monotonic()
        canary.mean_ms(t0, t1); canary.window_means(t0, t1, 2.0)
"""

from __future__ import annotations

import subprocess
import sys
import threading

# time.monotonic is the system-wide CLOCK_MONOTONIC on Linux: the canary's stamps and the caller's agree.
_CODE = """
import sys, time
interval = float(sys.argv[1])
while True:
    c, t = time.thread_time(), time.monotonic()
    s = 0
    for i in range(50000):
        s += i * i
    print(f"{t:.4f} {(time.thread_time() - c) * 1000:.3f}", flush=True)
    time.sleep(interval)
"""


class Canary:
    """A context manager: a canary subprocess and a thread reading its samples, (monotonic s, ms)."""

    def __init__(self, interval_s: float = 0.25):
        self.interval_s = interval_s
        self.samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None

    def __enter__(self) -> "Canary":
        self._proc = subprocess.Popen([sys.executable, "-c", _CODE, str(self.interval_s)],
                                      stdout=subprocess.PIPE, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            t, ms = line.split()
            self.samples.append((float(t), float(ms)))

    def __exit__(self, *exc) -> None:
        self._proc.kill()
        self._proc.wait()
        self._reader.join(timeout=5)

    def mean_ms(self, t0: float, t1: float) -> float | None:
        return mean_ms(self.samples, t0, t1)

    def window_means(self, t0: float, t1: float, step_s: float) -> list[float | None]:
        return window_means(self.samples, t0, t1, step_s)


def mean_ms(samples: list[tuple[float, float]], t0: float, t1: float) -> float | None:
    """The unit's mean CPU time over [t0, t1): proportional to the work's mean CPU time per unit
    there (a mean of times, not of speeds, as CPU seconds add)."""
    inside = [ms for t, ms in samples if t0 <= t < t1]
    return round(sum(inside) / len(inside), 3) if inside else None


def window_means(samples: list[tuple[float, float]], t0: float, t1: float, step_s: float) -> list[float | None]:
    """The mean over each `step_s` from t0 to t1 (None where no sample fell)."""
    n = max(1, int(-(-(t1 - t0) // step_s)))
    return [mean_ms(samples, t0 + i * step_s, min(t1, t0 + (i + 1) * step_s)) for i in range(n)]


def slower(window_ms: list[float | None], reference_ms: float) -> list[float]:
    """Each window's unit time over the reference's — how much slower the machine ran there than when
    the reference was measured (below 1: faster). A window without a sample takes the one before."""
    out, last = [], 1.0
    for ms in window_ms:
        last = ms / reference_ms if ms else last
        out.append(round(last, 3))
    return out
