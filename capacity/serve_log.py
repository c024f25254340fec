"""What Serve's controller logged about an app's pools, stamped to the millisecond: each target it
decided (`Upscaling`/`Downscaling ... from A to B replicas`), each replica it began (`Adding N
replicas`), each it saw come up (`... started successfully`) and each running one it stopped
(`Stopping ... (currently ReplicaState.RUNNING)`).

The autoscale check takes a pool's real timeline from here: Serve's REST API, polled every 0.25 s,
sees a change only at the next poll that reaches the controller, up to a poll's period and round
trip after it happened, and that lag alone reads as the real pool scaling later than simulated.
"""

from __future__ import annotations

import datetime
import os
import re
from dataclasses import dataclass
from pathlib import Path

LINE = re.compile(r"^[A-Z]+ (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) controller \d+ -- (.*)$")
DEPLOYMENT = re.compile(r"Deployment\(name='([^']+)', app='([^']+)'\)")
REPLICA = re.compile(r"Replica\(id='[^']+', deployment='([^']+)', app='([^']+)'\)")
TARGET = re.compile(r"^(?:Up|Down)scaling .* from (\d+) to (\d+) replicas")
ADDING = re.compile(r"^Adding (\d+) replicas? to ")


@dataclass(frozen=True)
class Event:
    t: float  # wall-clock s (time.time()), as the controller's log stamps it
    pool: str
    kind: str  # "target" | "adding" | "running" | "stopping" (a running replica) | "cancelled" (a starting one)
    n: int = 1  # the new target, or the replicas added


def parse(lines, app: str) -> list[Event]:
    """The events of `app`'s pools in the controller's log lines, in order."""
    out = []
    for line in lines:
        m = LINE.match(line.rstrip("\n"))
        if not m:
            continue
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        msg = m.group(2)
        who = DEPLOYMENT.search(msg) or REPLICA.search(msg)
        if not who or who.group(2) != app:
            continue
        pool = who.group(1)
        if target := TARGET.match(msg):
            out.append(Event(t, pool, "target", int(target.group(2))))
        elif adding := ADDING.match(msg):
            out.append(Event(t, pool, "adding", int(adding.group(1))))
        elif msg.startswith("Replica(") and " started successfully" in msg:
            out.append(Event(t, pool, "running"))
        elif msg.startswith("Stopping Replica("):
            out.append(Event(t, pool, "stopping" if "ReplicaState.RUNNING" in msg else "cancelled"))
    return out


def controller_log(ray_tmp: str | None = None) -> Path | None:
    """The newest Serve controller log of the latest local Ray session (`serve run` starts one)."""
    root = Path(ray_tmp or os.environ.get("RAY_TMPDIR", "/tmp")) / "ray" / "session_latest" / "logs" / "serve"
    logs = [p for p in root.glob("controller_*.log") if p.stem.split("_", 1)[1].isdigit()]
    return max(logs, key=lambda p: p.stat().st_mtime) if logs else None


class PoolLog:
    """One pool's events from `start` (wall s) to `end`, as times from `start`: its running replicas
    and its targets at every change, and each replica's start-up from the `Adding` that began it."""

    def __init__(self, events: list[Event], pool: str, start: float, end: float, running: int, target: int):
        self.events = [e for e in events if e.pool == pool and start <= e.t <= end]
        self.start, self.running0, self.target0 = start, running, target

    def timeline(self) -> list[tuple[float, int]]:
        out, n = [(0.0, self.running0)], self.running0
        for e in self.events:
            if e.kind in ("running", "stopping"):
                n += 1 if e.kind == "running" else -1
                out.append((round(e.t - self.start, 3), n))
        return out

    def targets(self) -> list[tuple[float, int]]:
        return [(0.0, self.target0)] + [(round(e.t - self.start, 3), e.n) for e in self.events if e.kind == "target"]

    def action_gaps(self) -> list[float]:
        """From each target the controller decided to the first replica it began or stopped for it, where
        that came within a second: a control loop's period, as the next loop acts on what this one
        decided."""
        gaps = []
        for i, e in enumerate(self.events):
            if e.kind == "target":
                act = next((a for a in self.events[i + 1:] if a.kind in ("adding", "stopping", "cancelled")), None)
                if act is not None and act.t - e.t < 1.0:
                    gaps.append(round(act.t - e.t, 3))
        return gaps

    def startups(self) -> list[float | None]:
        """Each replica begun, in order: from its `Adding` to its coming up (None: stopped while
        starting; Serve stops the newest starting replica first)."""
        begun: list[float] = []
        took: list[float | None] = []
        for e in self.events:
            if e.kind == "adding":
                begun += [e.t] * e.n
                took += [None] * e.n
            elif e.kind in ("running", "cancelled"):
                waiting = [i for i, s in enumerate(took) if s is None]
                if not waiting:
                    continue
                i = waiting[0] if e.kind == "running" else waiting[-1]
                took[i] = round(e.t - begun[i], 3) if e.kind == "running" else -1.0
        return [None if s is None or s < 0 else s for s in took]
