"""The machine's own speed over time, measured beside a load: a canary process times one fixed unit of
pure-Python work every `interval_s` — its CPU time, so waiting for a core does not count, only how fast
a core runs it. On this shared VM that time moves about 2x within seconds, with no steal reported (a
neighbour on the same physical core or its caches, or the clock): a probe's unit took 4.8-12 ms,
idle or loaded, and the app's CPU per request and closed-loop throughput moved with it
(docs/capacity.md). The simulator takes it as the machine's capacity over each
load, as it takes steal — to first order: torch's kernels do not speed up or slow down quite as much
as a Python loop, so given a checkpoint the canary also times a unit of the app's own kind of work
(a model from that config, a prefill and two decode steps at one thread), in turn with the loop —
it mostly moves with the loop and, where they part, tracks the app no better.

    with Canary(checkpoint="tandem/trained/small") as canary:
        t0 = time.monotonic(); ...; t1 = time.monotonic()
        canary.mean_ms(t0, t1); canary.window_means(t0, t1, 2.0, unit="torch")
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading

# time.monotonic is the system-wide CLOCK_MONOTONIC on Linux: the canary's stamps and the caller's agree.
# Two units, taken in turn: the pure-Python loop, and (given a checkpoint directory) the app's own kind of
# work — one thread of torch running a model built from that checkpoint's config (random weights: its
# speed does not depend on them) over a short prompt and two decode steps with a KV cache, the ops a
# replica's decode loop runs. The two need not move together: Python's loop lives in the core's caches,
# torch's kernels also walk the weights and the cache through memory a neighbour shares.
_CODE = """
import sys, time
interval, checkpoint = float(sys.argv[1]), (sys.argv[2] if len(sys.argv) > 2 else "")

def python_unit():
    s = 0
    for i in range(50000):
        s += i * i

units = [("py", python_unit)]
if checkpoint:
    import inspect
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText, DynamicCache
    torch.set_num_threads(1)
    model = AutoModelForImageTextToText.from_config(AutoConfig.from_pretrained(checkpoint)).eval()
    ids = (torch.arange(16) % 200 + 10).unsqueeze(0)
    arg = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def torch_unit():
        with torch.inference_mode():
            cache = DynamicCache()
            out = model(input_ids=ids, use_cache=True, **{arg: cache})
            for _ in range(2):
                out = model(input_ids=out.logits[:, -1:].argmax(-1), use_cache=True, **{arg: cache})

    torch_unit()  # the first call allocates; it is not the machine's speed
    units.append(("torch", torch_unit))
print("ready", flush=True)
n = 0
while True:
    name, unit = units[n % len(units)]
    n += 1
    c, t = time.thread_time(), time.monotonic()
    unit()
    print(f"{t:.4f} {(time.thread_time() - c) * 1000:.3f} {name}", flush=True)
    time.sleep(interval)
"""


class Canary:
    """A context manager: a canary subprocess and a thread reading its samples, (monotonic s, ms) per
    unit — `samples` the Python unit's, `torch_samples` the model unit's (given `checkpoint`)."""

    def __init__(self, interval_s: float = 0.25, checkpoint: str | None = None):
        self.interval_s, self.checkpoint = interval_s, checkpoint
        self.samples: list[tuple[float, float]] = []
        self.torch_samples: list[tuple[float, float]] = []
        self._proc: subprocess.Popen | None = None
        self._reader: threading.Thread | None = None
        self._ready = threading.Event()

    def __enter__(self) -> "Canary":
        self._proc = subprocess.Popen([sys.executable, "-c", _CODE, str(self.interval_s), self.checkpoint or ""],
                                      stdout=subprocess.PIPE, text=True,
                                      env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"})
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        # Loading torch and building the model takes seconds: a load measured before would have no
        # model-unit samples for its first windows.
        if not self._ready.wait(timeout=120) or self._proc.poll() is not None:
            self.__exit__(None, None, None)
            raise RuntimeError("the canary did not start")
        return self

    def _read(self) -> None:
        for line in self._proc.stdout:
            if line.startswith("ready"):
                self._ready.set()
                continue
            t, ms, unit = line.split()
            (self.torch_samples if unit == "torch" else self.samples).append((float(t), float(ms)))
        self._ready.set()  # ended (failed to start): do not wait on it

    def __exit__(self, *exc) -> None:
        self._proc.kill()
        self._proc.wait()
        self._reader.join(timeout=5)

    def _of(self, unit: str) -> list[tuple[float, float]]:
        return self.torch_samples if unit == "torch" else self.samples

    def mean_ms(self, t0: float, t1: float, unit: str = "py") -> float | None:
        return mean_ms(self._of(unit), t0, t1)

    def window_means(self, t0: float, t1: float, step_s: float, unit: str = "py") -> list[float | None]:
        return window_means(self._of(unit), t0, t1, step_s)


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
