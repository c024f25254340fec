"""The simulated cluster's moving parts: requests and the jobs (stage calls) they submit, replicas,
pools with Serve's handle routing (power of two choices, per-caller queue limits), and `Cores`,
processor sharing of a host's CPU cores among everything running at once."""

from __future__ import annotations

import heapq
import math
from array import array
from collections import deque
from typing import TYPE_CHECKING

from capacity.profile import Call, PoolSettings, Profile

if TYPE_CHECKING:
    from capacity.simulate import Simulation

class Request:
    __slots__ = ("arrived", "phases", "phase", "pending", "failed", "replica", "path", "in_flight", "phase_started",
                 "ran_on")

    def __init__(self, arrived: float, path: str, phases):
        self.arrived, self.path, self.phases = arrived, path, phases
        self.phase_started = arrived  # when its current phase's calls were sent (their stage times start there)
        self.phase, self.pending, self.failed, self.replica = 0, 0, False, None  # replica: its Router
        self.in_flight = False  # counted among the requests in flight (the Router took it)
        self.ran_on: dict | None = None  # pool name -> the replica its last call there went to (affinity)


class Job:
    """One call in a pool: the unit that is queued, batched and completed."""
    __slots__ = ("request", "call", "submitted", "left", "replica", "company")

    def __init__(self, request: Request, call: Call, now: float, company: int = 0):
        self.request, self.call, self.submitted, self.left, self.replica = request, call, now, call.steps, None
        self.company = company  # other requests in flight when it was sent (the app's GenerationRequest.company)


class Replica:
    __slots__ = ("pool", "index", "ongoing", "queue", "wake", "full", "compute_s", "last_job", "last_gap",
                 "retired", "born", "died")

    def __init__(self, pool: Pool, index: int):
        self.pool, self.index = pool, index
        self.ongoing, self.queue, self.wake, self.full = 0, deque(), None, None
        self.compute_s = 0.0
        self.retired = False  # autoscaled away: takes no new jobs, stops when its own are done
        self.born, self.died = pool.sim.env.now, None  # when it came up and stopped (replica seconds)
        self.last_job, self.last_gap = -math.inf, math.inf  # when its last job came, and the gap before it

    def worth_waiting(self, wait_s: float, vision: bool = False) -> bool:
        """The app's adaptive wait: an idle replica waits for a batch while jobs come closer together
        than the wait, or (a model server) while the job's sender has other requests in flight."""
        if self.pool.settings.batch_wait_mode == "always" or self.last_gap < wait_s:
            return True
        return not vision and any(job.company for job in self.queue)


class Pool:
    def __init__(self, sim: Simulation, name: str, n: int, settings: PoolSettings, queue_limit: int):
        self.sim, self.name, self.settings = sim, name, settings
        self.replicas = [Replica(self, i) for i in range(n)]  # those taking jobs
        self.retired: list[Replica] = []  # autoscaled away
        self.waiting: deque = deque()  # the callers' queue: jobs no replica has room for yet
        self.sending = 0  # calls in their hop (RPC, feature fetch) to a replica: a handle counts them
        self.queue_limit = queue_limit
        # Looked up for every call (millions): the settings the pool keeps for the run.
        self.is_router, self.limit, self.admit = name == "Router", settings.max_ongoing, settings.admit
        self.affinity = None if self.is_router else settings.affinity_queue  # the Router's jobs are requests
        self.max_batch = settings.max_batch_size
        self._widths()
        # Every job's queueing time (s), as doubles: millions at 10,000 req/s (`Simulation.arrivals`).
        self.queue_s = array("d")
        self.rejected = 0
        self.batches = self.batched = 0  # batches run and jobs in them (decoders: steps and rows)
        # Calls in the pool (on their hop, queued for a replica or at one) now, and their time
        # integral: the mean a replica holds is what an autoscaling target is set against.
        self.held, self.held_area, self.held_since = 0, 0.0, 0.0

    def _widths(self) -> None:
        n = len(self.replicas)
        self.bits, self.bits_less = n.bit_length(), max(0, n - 1).bit_length()  # the random draws' widths

    def add_replica(self) -> Replica:
        """A new replica (autoscaling), handed the callers' queued jobs it has room for."""
        rep = Replica(self, len(self.replicas) + len(self.retired))
        self.replicas.append(rep)
        self._widths()
        while self.waiting and rep.ongoing < self.limit:
            self.assign(self.waiting.popleft(), rep)
        return rep

    def retire(self, rep: Replica) -> None:
        """Take `rep` out of routing (autoscaling down); its loop stops once its jobs are done."""
        self.replicas.remove(rep)
        self.retired.append(rep)
        self._widths()
        rep.retired = True
        if rep.wake is not None and not rep.wake.triggered:
            rep.wake.succeed()

    def replica_seconds(self, now: float) -> float:
        return sum((r.died if r.died is not None else now) - r.born for r in (*self.replicas, *self.retired))

    def pick(self) -> Replica | None:
        """Serve's power of two choices: the less loaded of two random replicas, if either has room;
        else any replica with room (the least loaded); None when all are full."""
        limit, reps = self.limit, self.replicas
        if len(reps) > 2:
            a, b = self._two()
            best = a if a.ongoing <= b.ongoing else b
            if best.ongoing < limit:
                return best
        free = [r for r in reps if r.ongoing < limit]
        return min(free, key=lambda r: r.ongoing) if free else None

    def _two(self) -> tuple[Replica, Replica]:
        """Two distinct replicas at random, the very draws `rng.sample(replicas, 2)` makes (CPython's
        algorithm, so a seed's figures stand) without its generality's cost: a sixth of a 10,000 req/s
        simulation's time went to it."""
        reps, bits, k = self.replicas, self.sim.rng.getrandbits, self.bits
        n = len(reps)
        i = bits(k)
        while i >= n:
            i = bits(k)
        if n <= 21:  # sample's pool method: a draw below n - 1, the drawn slot holding the last replica
            m, k = n - 1, self.bits_less
            j = bits(k)
            while j >= m:
                j = bits(k)
            return reps[i], reps[m if j == i else j]
        j = bits(k)
        while j >= n or j == i:
            j = bits(k)
        return reps[i], reps[j]

    def send(self) -> None:
        """A call sets off on its hop to the pool (RPC, feature fetch): Serve's handle counts it from now."""
        self.sending += 1
        self._hold(1)

    def arrived(self) -> None:
        self.sending -= 1
        self._hold(-1)

    def _hold(self, delta: int) -> None:
        now = self.sim.env.now
        self.held_area += self.held * (now - self.held_since)
        self.held, self.held_since = self.held + delta, now

    def held_mean(self, now: float) -> float:
        """Calls in the pool on average since the start, as Serve's handles count them: on their hop,
        queued for a replica or at one."""
        return (self.held_area + self.held * (now - self.held_since)) / now if now else 0.0

    def follow(self, job) -> Replica | None:
        """The StageAffinityRouter: a request's later call goes to the replica that ran its earlier
        one in this pool, while that replica still takes requests and holds at most `affinity`."""
        ran_on = job.request.ran_on
        rep = ran_on.get(self.name) if ran_on else None
        if rep is None or rep.retired or rep.ongoing > self.affinity or rep.ongoing >= self.limit:
            return None
        return rep

    def submit(self, job) -> bool:
        replica = self.pick() if self.affinity is None else (self.follow(job) or self.pick())
        if replica is None:
            if 0 <= self.queue_limit <= len(self.waiting):
                self.rejected += 1
                return False
            self._hold(1)
            self.waiting.append(job)
            return True
        if self.admit is not None and replica.ongoing >= self.admit:
            self.rejected += 1  # the Router's admission limit: turned away before any work
            return False
        self._hold(1)
        self.assign(job, replica)
        return True

    def assign(self, job, replica: Replica) -> None:
        replica.ongoing += 1
        job.replica = replica
        if self.affinity is not None:
            req = job.request
            if req.ran_on is None:
                req.ran_on = {}
            req.ran_on[self.name] = replica
        self.sim.on_assigned(self, job, replica)

    def release(self, replica: Replica) -> None:
        replica.ongoing -= 1
        self._hold(-1)
        if self.waiting:
            to = replica if not replica.retired else self.pick()
            if to is not None:
                self.assign(self.waiting.popleft(), to)


def app_cores(host_cores: float, profile: Profile) -> float:
    """The cores the app's threads share: the host's, less what its other processes kept busy."""
    return max(0.5, host_cores - profile.others_cores)


class Cores:
    """Shared cores as processor sharing: every CPU activity on them runs at once, each at its share,
    recomputed whenever one starts or ends or the machine's measured speed changes — so the work they
    get done per second never exceeds the cores. Three classes of activity: a model loop's work
    (`model`, one thread each), CPU that runs beside a request as an activity of its own (`other`,
    one thread each), and call overheads with the Router's work (`overhead`), which share the event
    loops' threads (`loops`: the client's, the proxy's, every replica's): n of them due at once take
    min(n, loops) threads, each loops/n of one where n is more.
    With T threads wanting the cores' C, each thread runs at min(1, C/T) of a core, divided by the
    machine's slowdown then (the model unit's for `model`). Per class, `served` is the work one of its
    activities has got done since the start: an activity started at s with w to do ends when the
    class's `served` reaches s + w."""

    CLASSES = ("model", "other", "overhead")

    def __init__(self, sim: Simulation, cores: float, loops: int):
        self.sim, self.env, self.cores, self.loops = sim, sim.env, cores, loops
        self.served = dict.fromkeys(self.CLASSES, 0.0)
        self.due: dict[str, list] = {c: [] for c in self.CLASSES}  # heaps of (served at the end, seq, done)
        self.rate = dict.fromkeys(self.CLASSES, 0.0)
        self.last, self._seq, self._timer = 0.0, 0, 0
        self.work_s = 0.0  # all the work charged, at the profile's speed

    def count(self, cls: str) -> int:
        return len(self.due[cls])

    def rates(self) -> dict[str, float]:
        """Each class's rate now: work seconds an activity of it gets done per second."""
        n_over = self.count("overhead")
        threads = self.count("model") + self.count("other") + min(n_over, self.loops)
        share = min(1.0, self.cores / threads) if threads else 1.0
        machine, machine_model = self.sim._machine(), self.sim._machine(model=True)
        return {"model": share / machine_model, "other": share / machine,
                "overhead": share * min(n_over, self.loops) / n_over / machine if n_over else share / machine}

    def run(self, work_s: float, cls: str, done) -> None:
        """`done()` once `work_s` seconds of this machine's work at the profile's speed has run."""
        self._advance()
        self._seq += 1
        self.work_s += work_s
        heapq.heappush(self.due[cls], (self.served[cls] + work_s, self._seq, done))
        self._schedule()

    def _advance(self) -> None:
        dt = self.env.now - self.last
        if dt > 0:
            for c in self.CLASSES:
                self.served[c] += dt * self.rate[c]
        self.last = self.env.now

    def _schedule(self) -> None:
        self.rate = self.rates()
        wait = math.inf
        for c in self.CLASSES:
            if self.due[c]:
                wait = min(wait, max(0.0, self.due[c][0][0] - self.served[c]) / self.rate[c])
        sim = self.sim
        if wait < math.inf:  # the machine's speed changes at the next step, if either unit has one
            step = int(self.env.now / sim.slower_step_s) + 1
            if step < max(len(sim.slower), len(sim.slower_model)):
                wait = min(wait, max(0.0, step * sim.slower_step_s - self.env.now))
        if wait == math.inf:
            return
        self._timer += 1
        timer = self._timer
        self.env.timeout(wait).callbacks.append(lambda _e: self._wake(timer))

    def _wake(self, timer: int) -> None:
        if timer != self._timer:  # superseded by a later start or end
            return
        self._advance()
        finished = []
        for c in self.CLASSES:
            heap = self.due[c]
            while heap and heap[0][0] <= self.served[c] + 1e-12:
                finished.append(heapq.heappop(heap)[2])
        self._schedule()
        for done in finished:
            done()


