"""What the cluster simulator is fed: a measured stage profile (`Profile`, its service-time `Curve`s),
the policy's path mix (`Workload`) and each pool's Serve settings (`PoolSettings`, read from a serve
config). Pure data and arithmetic; the simulation itself is capacity/simulate.py."""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tandem.curves import Curve, generator_curves

ROOT = Path(__file__).resolve().parents[1]
PROFILE_KIND = "tandem-stage-profile"
POOLS = ("Router", "VisionEncoder", "SmallReasoner", "LargeAnswerer")
GENERATORS = {"small": "SmallReasoner", "large": "LargeAnswerer"}
ROLES = ("small", "large")
AFFINITY_QUEUE = 8  # deployments/affinity_router.py's default max_queued_for_affinity (a test holds them equal)
# With shared cores: the event loops a request's calls' overheads and the Router's work run on besides
# every replica's own — the load client's and Serve's proxy's — each one thread however many
# requests are due on it (measured CPU that no stage accounts for runs beside the request as an
# activity of its own).
OUTSIDE_LOOPS = 2


# --- the profile ------------------------------------------------------------------------------------
def by_in_flight(alone: float, busy: float, count: int, in_flight: float) -> float:
    """A per-request cost measured with one request in flight (`alone`) and with `count` (`busy`), at
    `in_flight`: linear between the two counts, flat beyond them."""
    if count <= 1:
        return alone
    return alone + (busy - alone) * min(1.0, max(0.0, (in_flight - 1) / (count - 1)))


@dataclass
class Profile:
    """Per-stage service times (ms) of one deployment of the models: what `capacity.stage_profile`
    writes (CPU, tiny models; or a GPU at real sizes)."""

    router_ms: float
    vision: dict[str, Curve]    # role -> ms for a batch of n images
    prefill: dict[str, Curve]   # role -> ms for one join, by the joining rows' total prompt tokens
    step: dict[str, Curve]      # role -> ms for one decode step of n rows
    workload: dict = field(default_factory=dict)  # the path mix measured with the profile, if any
    source: dict = field(default_factory=dict)
    # What each stage call costs beyond its model's work (the handle's RPC, fetching features from
    # the object store, the stream's messages): measured on a served app, 0 where unknown.
    call_ms: dict = field(default_factory=lambda: {"encode": 0.0, "generate": 0.0})
    # Every process's CPU per request on a served app (Router, replicas, proxy, controller, client):
    # with shared cores, what the stages above do not account for is charged as parallel load.
    cpu_ms_per_request: float = 0.0
    # The same with more requests in flight, (in flight, ms), if measured: batching and the processes'
    # per-iteration loops spread part of one request's cost over the others in flight.
    cpu_busy: tuple[int, float] | None = None
    # What a served decode step costs beyond the engine's (the replica's event loop and its per-token
    # stream messages share the decode loop's process), ms per role; folded into `step` at every
    # batch size, as one loop iteration's cost.
    step_overhead_ms: dict = field(default_factory=dict)
    # The cores the machine's other processes (Ray's daemons) kept busy while the app was loaded:
    # with shared cores, not there for the app's threads.
    others_cores: float = 0.0

    @classmethod
    def from_dict(cls, d: dict) -> Profile:
        if d.get("kind") != PROFILE_KIND:
            raise ValueError(f"not a stage profile (kind {d.get('kind')!r}, expected {PROFILE_KIND!r})")
        gens = d["generators"]
        served = {r: float(v) for r, v in d.get("served", {}).get("step_overhead_ms", {}).items()}
        curves = {r: generator_curves(gens[r], served.get(r, 0.0)) for r in ROLES}
        return cls(router_ms=float(d["router"]["ms"]),
                   vision={r: Curve([(p["images"], p["ms"]) for p in d["vision"][r]]) for r in ROLES},
                   prefill={r: curves[r][0] for r in ROLES}, step={r: curves[r][1] for r in ROLES},
                   step_overhead_ms=served,
                   workload=d.get("workload", {}), source=d.get("source", {}),
                   call_ms={"encode": 0.0, "generate": 0.0, **d.get("calls", {})},
                   cpu_ms_per_request=float(sum(d.get("cpu_ms_per_request", {}).values())),
                   cpu_busy=(int(d["cpu_ms_per_request_busy"]["concurrency"]),
                             float(sum(d["cpu_ms_per_request_busy"]["ms"].values())))
                   if d.get("cpu_ms_per_request_busy") else None,
                   others_cores=float(d.get("cpu_ms_per_request_busy", {}).get("others_cores", 0.0)))

    def cpu_ms_at(self, in_flight: float) -> float | None:
        """The app's CPU per request with `in_flight` requests at once, as the simulator charges it;
        None where no CPU was measured (a GPU profile)."""
        if not self.cpu_ms_per_request:
            return None
        busy, count = (self.cpu_busy[1], self.cpu_busy[0]) if self.cpu_busy else (self.cpu_ms_per_request, 1)
        return by_in_flight(self.cpu_ms_per_request, busy, count, in_flight)

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def scaled(self, factors: dict[str, float]) -> Profile:
        """Every time of a stage multiplied by its factor (keys: router, vision, small, large)."""
        def scale(c: Curve, f: float) -> Curve:
            return Curve([(x, y * f) for x, y in zip(c.xs, c.ys)])
        return Profile(router_ms=self.router_ms * factors.get("router", 1.0),
                       vision={r: scale(c, factors.get("vision", 1.0)) for r, c in self.vision.items()},
                       prefill={r: scale(c, factors.get(r, 1.0)) for r, c in self.prefill.items()},
                       step={r: scale(c, factors.get(r, 1.0)) for r, c in self.step.items()},
                       workload=self.workload, source={**self.source, "scaled": factors},
                       call_ms={k: v * factors.get("router", 1.0) for k, v in self.call_ms.items()},
                       cpu_ms_per_request=self.cpu_ms_per_request, cpu_busy=self.cpu_busy,
                       step_overhead_ms=self.step_overhead_ms, others_cores=self.others_cores)


# --- the workload -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Call:
    """One stage call: `role`'s vision tower (steps 0) or its language model."""

    kind: str            # "vision" | "generate"
    role: str            # "small" | "large"
    prompt_tokens: int = 0
    steps: int = 0
    stage: str = ""      # as the app's trace names it (`latency_ms`): the simulation times it by that name


Phase = tuple[Call, ...]  # calls that run concurrently; the next phase starts when all are done


# The stages of `mutual`, what each costs by default (decode steps = tokens + the stop token), and
# the phase each runs in: vision, then both direct answers; on disagreement the small model's
# reasoning, then the large model's answer from the transferred excerpt.
MUTUAL_STAGES = {"small_direct": {"prompt_tokens": 40, "decode_steps": 3},
                 "large_direct": {"prompt_tokens": 40, "decode_steps": 3},
                 "small_reasoning": {"prompt_tokens": 40, "decode_steps": 40},
                 "large_transfer": {"prompt_tokens": 100, "decode_steps": 3}}


@dataclass
class Workload:
    """Paths a request can take, with their shares. Token figures are decode steps per stage, as the
    trace's `stages` reports them."""

    paths: list[tuple[str, float, tuple[Phase, ...]]]
    images: int = 1

    @classmethod
    def mutual(cls, transfer_rate: float, stages: dict[str, dict] | None = None, *, images: int = 1) -> Workload:
        """The `mutual` policy (`stages` overrides MUTUAL_STAGES' prompt tokens and decode steps)."""
        if not 0 <= transfer_rate <= 1:
            raise ValueError(f"transfer rate {transfer_rate} is outside 0..1")
        st = {k: {**v, **(stages or {}).get(k, {})} for k, v in MUTUAL_STAGES.items()}

        def gen(name: str) -> Call:
            return Call("generate", name.split("_")[0], max(1, round(st[name]["prompt_tokens"])),
                        max(1, round(st[name]["decode_steps"])), name)
        head = ((Call("vision", "small", stage="encode_small"), Call("vision", "large", stage="encode_large")),) \
            if images else ()
        stage1 = head + ((gen("small_direct"), gen("large_direct")),)
        stage2 = ((gen("small_reasoning"),), (gen("large_transfer"),))
        return cls([("agree", 1 - transfer_rate, stage1), ("transfer", transfer_rate, stage1 + stage2)], images)

    @classmethod
    def from_measured(cls, measured: dict, transfer_rate: float | None = None) -> Workload:
        """`mutual` with what a profile measured on the app (its `workload` section), if anything."""
        rate = measured.get("transfer_rate", 0.5) if transfer_rate is None else transfer_rate
        return cls.mutual(rate, measured.get("stages"), images=measured.get("images", 1))

    @staticmethod
    def call_ms(profile: Profile, c: Call, images: int = 1) -> float:
        """One call alone: its overhead, then its model's work at batch 1 (a vision call: `images`
        images in one batch)."""
        if c.kind == "vision":
            return profile.call_ms["encode"] + profile.vision[c.role](images)
        return profile.call_ms["generate"] + profile.prefill[c.role](c.prompt_tokens) + c.steps * profile.step[c.role](1)

    def unloaded_s(self, profile: Profile, mean: bool = False) -> float:
        """The slowest path's latency with nothing else running (no batch waits): how deep the
        pipeline is; `mean`: the paths' latencies weighted by their shares instead."""
        paths = [(share, profile.router_ms + sum(max(self.call_ms(profile, c, self.images) for c in phase)
                                                 for phase in phases))
                 for _, share, phases in self.paths if share > 0]
        if mean:
            return sum(share * ms for share, ms in paths) / sum(share for share, _ in paths) / 1000
        return max(ms for _, ms in paths) / 1000

    def describe(self) -> str:
        return "; ".join(f"{name} {share:.0%}: " + " -> ".join(
            "+".join(f"{c.role[0]}{'V' if c.kind == 'vision' else f'{c.steps}s'}" for c in ph) for ph in phases)
            for name, share, phases in self.paths)


# --- the cluster's settings ---------------------------------------------------------------------------
CONTROL_LOOP_S = 0.1  # Serve's RAY_SERVE_CONTROL_LOOP_INTERVAL_S


@dataclass(frozen=True)
class Autoscaling:
    """A deployment's `autoscaling_config`: the fields Serve's default policy reads, with Serve's
    defaults (a test holds them to ray.serve.config.AutoscalingConfig's)."""
    min_replicas: int = 1
    max_replicas: int = 1
    initial_replicas: int | None = None
    target_ongoing_requests: float = 2.0
    metrics_interval_s: float = 10.0
    look_back_period_s: float = 30.0
    smoothing_factor: float = 1.0
    upscaling_factor: float | None = None
    downscaling_factor: float | None = None
    upscale_delay_s: float = 30.0
    downscale_delay_s: float = 600.0

    @classmethod
    def from_config(cls, d: dict) -> "Autoscaling":
        known = {k: v for k, v in d.items() if k in cls.__dataclass_fields__}
        out = cls(**known)
        if out.min_replicas < 1 or out.max_replicas < out.min_replicas:
            # Scaling to zero is not simulated (a cold start's first request waits for a replica).
            raise ValueError(f"autoscaling needs 1 <= min_replicas <= max_replicas, got {d}")
        return out

    @property
    def up(self) -> float:
        return self.upscaling_factor or self.smoothing_factor

    @property
    def down(self) -> float:
        return self.downscaling_factor or self.smoothing_factor

    @property
    def initial(self) -> int:
        return self.min_replicas if self.initial_replicas is None else self.initial_replicas


@dataclass(frozen=True)
class ControlTiming:
    """When Serve's control loop ticks and a pool's handle records and pushes its requests, on the
    simulation's clock. Serve sleeps RAY_SERVE_CONTROL_LOOP_INTERVAL_S (0.1 s) between loops, so a
    loop's period is that plus the loop's own work (a check measures it from the controller's log);
    the loop and each handle's metrics began before the load, at phases the load does not set."""
    period_s: float = CONTROL_LOOP_S
    control_phase_s: float = 0.0  # the first tick, within one period of the start
    handle_phase_s: float = 0.0   # the handle's first record, within one record period of the start


@dataclass
class PoolSettings:
    max_ongoing: int = 32
    max_queued: int = -1          # per calling replica; -1: unbounded (Serve's default)
    max_batch_size: int = 8
    batch_wait_s: float = 0.01
    batch_wait_mode: str = "adaptive"  # or "always": as the deployments' user_config says
    gpus_per_replica: float = 0.0
    admit: int | None = None      # Router: the app's http.max_in_flight, requests a replica answers at once
    autoscaling: Autoscaling | None = None  # None: the pool keeps the replicas it is given
    startup_s: float = 0.0        # autoscaling: from a replica's start to its first request (loading weights)
    startups: tuple[float, ...] = ()  # a check's replay: each new replica's own start-up, in order; then startup_s
    timing: ControlTiming = ControlTiming()  # autoscaling: when the controller and the pool's handle act
    # The StageAffinityRouter's max_queued_for_affinity where the deployment routes by it: a request's
    # later call goes to the replica that ran its earlier one while that replica holds at most this many.
    affinity_queue: int | None = None


def settings_from_config(path: str | Path, autoscaling: bool = False) -> dict[str, PoolSettings]:
    """Each deployment's limits and batching as a serve config file sets them; with `autoscaling`,
    also its `autoscaling_config` where it has one."""
    cfg = yaml.safe_load(Path(path).read_text())
    app = cfg["applications"][0]
    deployments = {d["name"]: d for d in app.get("deployments", [])}
    admit = ((app.get("args") or {}).get("http") or {}).get("max_in_flight")
    out = {}
    for name in POOLS:
        d = deployments.get(name, {})
        user = d.get("user_config") or {}
        router = d.get("request_router_config") or {}
        affinity = (int((router.get("request_router_kwargs") or {}).get("max_queued_for_affinity", AFFINITY_QUEUE))
                    if "StageAffinityRouter" in str(router.get("request_router_class", "")) else None)
        out[name] = PoolSettings(max_ongoing=int(d.get("max_ongoing_requests", 5)),
                                 max_queued=int(d.get("max_queued_requests", -1)),
                                 max_batch_size=int(user.get("max_batch_size", 8)),
                                 batch_wait_s=float(user.get("batch_wait_timeout_s", 0.01 if name != "VisionEncoder"
                                                                                     else 0.005)),
                                 batch_wait_mode=str(user.get("batch_wait_mode", "adaptive")),
                                 gpus_per_replica=float((d.get("ray_actor_options") or {}).get("num_gpus", 0)),
                                 admit=int(admit) if name == "Router" and admit else None,
                                 affinity_queue=affinity,
                                 autoscaling=Autoscaling.from_config(d["autoscaling_config"])
                                 if autoscaling and d.get("autoscaling_config") else None)
    return out


# --- from the command line --------------------------------------------------------------------------
def parse_replicas(text: str) -> dict[str, int]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, n = part.partition("=")
        if name not in POOLS or not n.isdigit() or int(n) < 1:
            raise argparse.ArgumentTypeError(f"bad replica count {part!r}: expected <{'|'.join(POOLS)}>=<n >= 1>")
        out[name] = int(n)
    return out



def add_workload_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--profile", required=True, help="a stage profile JSON (capacity.stage_profile)")
    p.add_argument("--config", default=str(ROOT / "serve_config.gpu.yaml"),
                   help="serve config whose limits and batching the pools take (default: the GPU config)")
    p.add_argument("--transfer-rate", type=float, default=None,
                   help="share of requests that transfer (default: the profile's measured share)")
    p.add_argument("--max-batch-size", type=parse_replicas, default={},
                   help="override the config's max_batch_size per pool, e.g. SmallReasoner=64")
    p.add_argument("--host-cores", type=float, default=None, help="replicas share this many CPU cores (local app)")
    p.add_argument("--seed", type=int, default=0)


def parse_seconds(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, _, v = part.partition("=")
        try:
            out[name] = float(v)
        except ValueError:
            out[name] = -1.0
        if name not in POOLS or out[name] < 0:
            raise argparse.ArgumentTypeError(f"bad time {part!r}: expected <{'|'.join(POOLS)}>=<seconds >= 0>")
    return out


def settings_for(args) -> dict[str, PoolSettings]:
    """The pools' settings from `--config`, with the command line's overrides; autoscaled as the config
    says only with `--autoscale` (a command that has it)."""
    settings = settings_from_config(args.config, autoscaling=getattr(args, "autoscale", False))
    for name, n in args.max_batch_size.items():
        settings[name].max_batch_size = n
    for name, s in getattr(args, "startup_s", {}).items():
        settings[name].startup_s = s
    return settings


def workload_for(args, profile: Profile) -> Workload:
    return Workload.from_measured(profile.workload, args.transfer_rate)
