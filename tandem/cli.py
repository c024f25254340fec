"""The `tandem` command: build tiny checkpoints, ask a question in-process, validate a serve config.

Parses arguments and prints; the work is done by the core modules it calls.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import re
import sys
import time
from pathlib import Path

import yaml

from tandem.config import (DEPLOYMENT_NAMES, POLICY_NAMES, ROUTER_MAX_ONGOING, calls_at_once, limit_problems,
                           load_tandem_config, queue_to_hold)
from tandem.deploy_checks import GPU_MEMORY_GIB
from tandem.errors import TandemError
from tandem.policies import parse_policy_id


def _cmd_build_tiny(args) -> int:
    from tandem.checkpoints import build_tiny

    start = time.perf_counter()
    out = build_tiny(args.dir, args.size, args.seed)
    size_mb = sum(f.stat().st_size for f in Path(out).iterdir()) / 2**20
    print(f"built tiny:{args.size} (seed {args.seed}) in {out}: {size_mb:.1f} MB, "
          f"{time.perf_counter() - start:.1f} s")
    return 0


def read_tandem_args(path: str | None) -> dict:
    """Tandem args from a YAML file: either bare args or a serve config's first application."""
    if not path:
        return {}
    data = yaml.safe_load(Path(path).read_text()) or {}
    if "applications" in data:
        return data["applications"][0].get("args", {}) or {}
    return data


def _cmd_ask(args) -> int:
    from tandem.local import LocalTandem
    from tandem.schemas import AskRequest

    config = load_tandem_config(read_tandem_args(args.config))
    images = [Path(p).read_bytes() for p in args.image]
    policy, param = args.policy or (None, None)
    with LocalTandem(config) as tandem:
        result = tandem.ask(AskRequest(question=args.question, images=images, policy=policy, policy_param=param,
                                       max_tokens=args.max_tokens, reasoning_max_tokens=args.reasoning_max_tokens,
                                       latency_budget_ms=args.latency_budget_ms, request_id="cli"))
    if args.json:
        print(json.dumps({"answer": result.answer, **result.trace(),
                          "usage": {"prompt_tokens": result.prompt_tokens,
                                    "completion_tokens": result.completion_tokens}}))
    else:
        print(f"answer: {result.answer!r}\npolicy: {result.policy}  path: {result.path}  "
              f"transferred tokens: {result.transferred_tokens}")
        print("latency ms: " + ", ".join(f"{k}={v:.1f}" for k, v in result.latency_ms.items()))
        print("tokens: " + ", ".join(f"{k}={v}" for k, v in result.tokens.items()))
    return 0


def _cmd_validate_config(args) -> int:
    """Check a serve config's Tandem args, their cross-field invariants (limit_problems) and deployment
    names without starting Ray."""
    data = yaml.safe_load(Path(args.file).read_text()) or {}
    apps = data.get("applications") or []
    if not apps:
        print(f"error: {args.file}: no 'applications' list", file=sys.stderr)
        return 2
    problems = []
    for app in apps:
        name = app.get("name", "<unnamed>")
        config = None
        try:
            config = load_tandem_config(app.get("args"))
            problems += [f"application '{name}': {p}" for p in limit_problems(config)]
        except TandemError as err:
            problems.append(f"application '{name}': {err.message}")
        for dep in app.get("deployments") or []:
            if dep.get("name") not in DEPLOYMENT_NAMES:
                problems.append(f"application '{name}': unknown deployment '{dep.get('name')}'; "
                                f"known: {', '.join(DEPLOYMENT_NAMES)}")
            if problem := _router_class_problem((dep.get("request_router_config") or {}).get("request_router_class")):
                problems.append(f"application '{name}': deployment '{dep.get('name')}': {problem}")
        router = next((d for d in app.get("deployments") or [] if d.get("name") == "Router"), {})
        ongoing, limit = router.get("max_ongoing_requests", ROUTER_MAX_ONGOING), config and config.http.max_in_flight
        if limit and ongoing <= limit:
            # Serve queues (or refuses in plain text) what is past max_ongoing_requests: the Router
            # would never see enough requests to apply its own limit.
            problems.append(f"application '{name}': Router max_ongoing_requests ({ongoing}) must be above "
                            f"http.max_in_flight ({limit}): room for health probes and the Router's own fast 503s")
        if limit:
            problems += [f"application '{name}': {p}" for p in _queue_problems(config, app.get("deployments") or [])]
        if config is not None:
            problems += [f"application '{name}': {p}" for p in _deployment_problems(config, app, args)]
    for problem in problems:
        print(f"error: {args.file}: {problem}", file=sys.stderr)
    if not problems:
        print(f"{args.file}: {len(apps)} application(s) valid")
    return 2 if problems else 0


def _deployment_problems(config, app: dict, args) -> list[str]:
    """Drain times; with --profile, the stage deadline against the longest reasoning; with --gpu, the
    memory arithmetic of every GPU deployment (a table on stdout)."""
    from tandem.deploy_checks import drain_problems, gpu_fit, stage_timeout_problem

    deployments = app.get("deployments") or []
    problems = drain_problems(config, deployments)
    if args.profile:
        steps = _profile_steps(json.loads(Path(args.profile).read_text()), config, deployments)
        if problem := stage_timeout_problem(config, steps):
            problems.append(problem)
    for gpu in args.gpu or []:
        print(f"{app.get('name', '<unnamed>')} on {gpu}:")
        for row in gpu_fit(config, deployments, gpu):
            print(f"  {row['deployment']:<14} num_gpus {row['num_gpus']:<4} needs {row['need_gib']:>6.1f} GiB of "
                  f"{row['have_gib']:>6.1f}  {'fits' if row['fits'] else 'DOES NOT FIT'}: {row['why']}")
            if not row["fits"]:
                problems.append(f"deployment '{row['deployment']}' does not fit {gpu}: {row['why']}")
    return problems


def _profile_steps(profile: dict, config, deployments: list[dict]) -> dict[str, float]:
    """A decode step (ms) per role from a stage profile, at the batch its deployment runs at most
    (the profile's nearest batch at or above it, else its largest)."""
    steps = {}
    for role, dep_name in (("small", "SmallReasoner"), ("large", "LargeAnswerer")):
        dep = next((d for d in deployments if d.get("name") == dep_name), {})
        batch = (config.model(role).vllm.max_num_seqs if config.engine == "vllm"
                 else (dep.get("user_config") or {}).get("max_batch_size", 8))
        curve = sorted(profile["generators"][role]["step"], key=lambda p: p["batch"])
        steps[role] = next((p["ms"] for p in curve if p["batch"] >= batch), curve[-1]["ms"])
    return steps


def _cmd_prefetch(args) -> int:
    """Download, per deployment, exactly the files it reads of each Hub checkpoint, at the config's
    revisions, into the Hugging Face cache (HF_HOME); with --pin, write each model's commit into the
    config as its `revision`."""
    from tandem.checkpoints import resolve_model_ref
    from tandem.hub import deployment_parts, fetch, is_hub_id

    text = Path(args.file).read_text()
    pins: dict[str, str] = {}
    for app in (yaml.safe_load(text) or {}).get("applications") or []:
        config = load_tandem_config(app.get("args"))
        names = [d.get("name") for d in app.get("deployments") or []] or list(DEPLOYMENT_NAMES)
        for name, loads in deployment_parts(config.engine).items():
            if name not in names:
                continue
            for role, part in loads:
                model = resolve_model_ref(config.model(role).model)
                if not is_hub_id(model):
                    print(f"{name}: {role} {model}: local, nothing to fetch")
                    continue
                root, files = fetch(model, config.model(role).revision, part)
                pins[model] = root.name  # a snapshot's folder is named by its commit
                print(f"{name}: {role} {model}@{root.name} ({part}): {', '.join(files)}")
    if args.pin:
        for model, sha in pins.items():
            text, n = _pin_revision(text, model, sha)
            if not n:
                print(f"error: {model}: no `model: {model}` in {args.file} to pin", file=sys.stderr)
                return 2
        Path(args.file).write_text(text)
        print(f"{args.file}: pinned " + ", ".join(f"{m}@{s}" for m, s in pins.items()))
    return 0


def _pin_revision(text: str, model: str, sha: str) -> tuple[str, int]:
    """`revision: sha` beside every `model: <model>` of a YAML text, in a flow mapping or a block one,
    replacing a revision already there; the rest of the text (its comments) untouched."""
    lines, n, out = text.splitlines(keepends=True), 0, []
    skip_revision_at = None
    for line in lines:
        if skip_revision_at is not None and line.startswith(skip_revision_at + "revision:"):
            skip_revision_at = None
            continue
        skip_revision_at = None
        at = line.find(f"model: {model}")
        rest = line[at + len(f"model: {model}"):] if at >= 0 else ""
        if at < 0 or (rest[:1] not in ("", ",", "}", "\n", " ", "#")):
            out.append(line)
            continue
        n += 1
        if "{" in line[:at]:  # flow: {model: X, revision: Y, ...}
            out.append(re.sub(rf"model: {re.escape(model)}(,\s*revision: [\w./-]+)?", f"model: {model}, revision: {sha}", line))
        else:  # block: a key line of its own at the same indent
            indent = line[:at]
            out += [line, f"{' ' * len(indent)}revision: {sha}\n"]
            skip_revision_at = " " * len(indent)
    return "".join(out), n


def _router_class_problem(path: str | None) -> str | None:
    """Whether a deployment's request router class (`module:Class` or `module.Class`) is there: its
    module found and the class defined in it, read without importing it (it imports Ray)."""
    if not path or path.startswith("ray."):
        return None  # Serve's own routers: importing Ray to look would load all of it
    module, _, cls = path.rpartition(":") if ":" in path else path.rpartition(".")
    try:
        spec = importlib.util.find_spec(module)
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not Path(spec.origin).is_file():
        return f"request router module '{module}' not found"
    if spec.origin.endswith(".py"):
        tree = ast.parse(Path(spec.origin).read_text())
        if not any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body):
            return f"request router class '{cls}' is not defined in {module}"
    return None


def _queue_problems(config, deployments: list[dict]) -> list[str]:
    """With an admission limit, a model deployment's queue (Serve's max_queued_requests, counted per
    calling Router replica) must hold every call the requests one Router admits can have waiting on it
    at once — not counting on the replicas' ongoing slots: Serve counts a call queued until its handle
    has assigned it one, and at 24 admitted requests (48 encode calls against 16 ongoing + 32 queued)
    the local app shed 37 of 528 requests at 0.9x capacity from the VisionEncoder's queue, after they
    were admitted (docs/capacity.md). Shed there, a request is
    turned away after work was spent on it, which admission at the door exists to prevent."""
    limit, calls = config.http.max_in_flight, calls_at_once(config.policy.speculative)
    problems = []
    for dep in deployments:
        queued, n = dep.get("max_queued_requests", -1), calls.get(dep.get("name"), 0)
        if n and queue_to_hold(queued, n, limit) != queued:
            problems.append(f"{dep['name']} max_queued_requests ({queued}) must hold the calls the "
                            f"Router's admitted requests can have waiting on it at once: {n} per request x "
                            f"http.max_in_flight ({limit}) = {n * limit}")
    return problems


def _policy_id(text: str) -> tuple[str, float | None]:
    """`--policy POLICY[@VALUE]` parsed once, as the API parses a model id: (policy, parameter)."""
    try:
        return parse_policy_id(text)
    except KeyError:
        raise argparse.ArgumentTypeError(f"unknown policy {text!r}; known: {', '.join(POLICY_NAMES)}") from None
    except TandemError as err:
        raise argparse.ArgumentTypeError(err.message) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tandem", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("build-tiny", help="write a tiny random-init Qwen3-VL checkpoint")
    p.add_argument("dir")
    p.add_argument("--size", choices=["small", "small-h32", "large"], default="small")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_cmd_build_tiny)

    p = sub.add_parser("ask", help="answer one question in-process (tiny checkpoints by default)")
    p.add_argument("question")
    p.add_argument("--image", action="append", default=[], help="image file; repeat for several")
    p.add_argument("--policy", type=_policy_id, default=None, metavar="POLICY[@VALUE]",
                   help=f"one of {', '.join(POLICY_NAMES)}; a parameter after @ (confidence@0.35)")
    p.add_argument("--reasoning-max-tokens", type=int, default=None)
    p.add_argument("--latency-budget-ms", type=float, default=None)
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--config", help="YAML with Tandem args, or a serve config (its first application)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_cmd_ask)

    p = sub.add_parser("validate-config", help="check a serve config's args and deployment names (no Ray)")
    p.add_argument("file")
    p.add_argument("--gpu", action="append", choices=sorted(GPU_MEMORY_GIB), metavar="TYPE",
                   help=f"also check each GPU deployment's memory on this GPU ({', '.join(sorted(GPU_MEMORY_GIB))}); "
                        "repeat for several")
    p.add_argument("--profile", help="a stage profile (capacity/): the stage deadline must let the longest "
                                     "reasoning finish at its decode step")
    p.set_defaults(func=_cmd_validate_config)

    p = sub.add_parser("prefetch", help="download each deployment's files of the Hub checkpoints a serve config names")
    p.add_argument("file")
    p.add_argument("--pin", action="store_true", help="write each model's commit into the config as its revision")
    p.set_defaults(func=_cmd_prefetch)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except TandemError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
