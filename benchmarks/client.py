"""The client side the benchmarks share: synthetic request bodies, one timed HTTP request, and
starting serve_config.yaml's app locally (with an optional model-free twin for the bare cost)."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def synthetic_png(seed: int) -> str:
    """A seeded random image, 48-160 pixels a side, as a data URL."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    size = (int(rng.randint(48, 160)), int(rng.randint(48, 160)))
    buf = io.BytesIO()
    Image.fromarray((rng.rand(size[1], size[0], 3) * 255).astype("uint8")).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat_body(policy: str, question: str, image_url: str | None = None, max_tokens: int = 8) -> dict:
    content: list[dict] = [{"type": "image_url", "image_url": {"url": image_url}}] if image_url else []
    content.append({"type": "text", "text": question})
    return {"model": f"tandem:{policy}", "max_tokens": max_tokens, "messages": [{"role": "user", "content": content}]}


def item_body(item, policy: str = "mutual") -> dict:
    """A dataset item (tasks.datasets.Item) as a chat request: its image as a data URL, then its
    question and options; no max_tokens, so the config's answer limit applies."""
    image = "data:image/png;base64," + base64.b64encode(item.image).decode()
    return {"model": f"tandem:{policy}", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": item.prompt()}]}]}


def add_asker_args(ap, n: int) -> None:
    """The item and endpoint options of the scripts that ask item by item through `Asker`."""
    ap.add_argument("--dataset", default="grid", help="grid (held-out items), a JSONL file or an MMBench TSV")
    ap.add_argument("--n", type=int, default=n, help="items (first n of a file)")
    ap.add_argument("--seed", type=int, default=0, help="grid: which held-out items")
    ap.add_argument("--url", help="through this server's HTTP API instead of in-process")
    ap.add_argument("--api-key", default=os.environ.get("TANDEM_API_KEY"))
    ap.add_argument("--config", help="in-process: YAML with Tandem args or a serve config (default: the trained pair)")


class Asker:
    """One policy's answer and trace for an item: in-process through the pipeline, or over HTTP."""

    def __init__(self, url: str | None, api_key: str | None, config_path: str | None):
        self.url, self.api_key = url, api_key
        if not url:
            from tandem.cli import read_tandem_args
            from tandem.config import load_tandem_config
            from tandem.local import load_engines, local_stages
            from tandem.pipeline import Pipeline

            config = load_tandem_config(read_tandem_args(config_path))
            self.pipeline = Pipeline(config, local_stages(load_engines(config)))
            self.where = f"in-process ({config.small.model} + {config.large.model})"
        else:
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            self.http = httpx.Client(timeout=300, headers=headers)
            self.where = f"HTTP {url}"

    def __call__(self, item, model: str, **options) -> tuple[str, dict]:
        """(answer, trace) for `model` = `<policy>` or `<policy>@<value>`; `options` are the body's
        `tandem` object (reasoning_max_tokens, latency_budget_ms)."""
        if self.url:
            body = item_body(item, model)
            if options:
                body["tandem"] = options
            r = self.http.post(f"{self.url}/v1/chat/completions", json=body)
            r.raise_for_status()
            data = r.json()
            return data["choices"][0]["message"]["content"], data["tandem"]
        from tandem.policies import parse_policy_id
        from tandem.schemas import AskRequest

        policy, param = parse_policy_id(model)
        result = asyncio.run(self.pipeline.answer(AskRequest(question=item.prompt(), images=[item.image],
                                                             policy=policy, policy_param=param, **options)))
        return result.answer, result.trace()


@dataclass
class Outcome:
    status: int | str
    latency_ms: float
    finished_s: float = 0.0
    completion_tokens: int = 0
    trace: dict = field(default_factory=dict)
    ttft_ms: float | None = None  # streamed: to the first delta (reasoning or content)
    ttfc_ms: float | None = None  # streamed: to the first content delta
    itl_ms: list[float] = field(default_factory=list)  # streamed: gaps between deltas


async def poisson_sends(rate: float, seed: int, duration_s: float):
    """An open loop's send times: Poisson at `rate` for `duration_s`, each send at its time on a
    schedule fixed from the start (yields when a request is due). A loop that sleeps each gap after a
    send instead lags by whatever the event loop spent on responses in between, and offers less than
    `rate` — 16.4 of 17.4 req/s in a sim_check run near saturation."""
    rng, start = random.Random(seed), time.monotonic()
    due = start
    while due - start < duration_s:
        delay = due - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        yield
        due += rng.expovariate(rate)


async def stream_chat(http: httpx.AsyncClient, url: str, body: dict, t0: float = 0.0,
                      abandon: bool = False) -> Outcome:
    """One streamed request, timed delta by delta as the client receives them. `abandon`: hang up
    after the first delta (status "abandoned"), as a client that lost interest."""
    import json

    start = time.monotonic()
    stamps, first_content, data, status = [], None, {}, 0
    try:
        async with http.stream("POST", f"{url}/v1/chat/completions", json={**body, "stream": True}) as r:
            status = r.status_code
            async for line in r.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    status = chunk["error"].get("code") or "stream_error"
                    continue
                delta = chunk["choices"][0]["delta"] if chunk.get("choices") else {}
                if delta.get("content") or delta.get("reasoning_content"):
                    stamps.append(time.monotonic())
                    if first_content is None and delta.get("content"):
                        first_content = stamps[-1]
                    if abandon:
                        status = "abandoned"
                        break
                if chunk.get("usage"):
                    data = chunk
    except httpx.TimeoutException:
        status = "timeout"
    except httpx.HTTPError as err:
        status = type(err).__name__
    end = time.monotonic()
    ms = lambda t: (t - start) * 1000  # noqa: E731
    return Outcome(status, ms(end), end - t0, data.get("usage", {}).get("completion_tokens", 0), data.get("tandem", {}),
                   ttft_ms=ms(stamps[0]) if stamps else None,
                   ttfc_ms=ms(first_content) if first_content else None,
                   itl_ms=[(b - a) * 1000 for a, b in zip(stamps, stamps[1:])])


async def post_chat(http: httpx.AsyncClient, url: str, body: dict, t0: float = 0.0) -> Outcome:
    start = time.monotonic()
    try:
        r = await http.post(f"{url}/v1/chat/completions", json=body)
        status: int | str = r.status_code
        data = r.json() if r.status_code == 200 else {}
    except httpx.TimeoutException:
        status, data = "timeout", {}
    except httpx.HTTPError as err:
        status, data = type(err).__name__, {}
    end = time.monotonic()
    return Outcome(status, (end - start) * 1000, end - t0, data.get("usage", {}).get("completion_tokens", 0),
                   data.get("tandem", {}))


class LocalApps:
    """serve_config.yaml's app at `/`, started with `serve run` in its own session as a user
    would; with bare=True also a model-free twin (fake engine, same four deployments and hops) at
    `/bare`, for the bare cost of the Serve composition; with an `engine`, the checkpoints of
    serve_config.vllm-cpu.yaml on that engine (vllm: that config as it is). `edit` changes the app's
    config (a dict, in place) before any twin is copied from it; each of `twins` (name -> edit) adds a
    copy of the app at `/<name>`, changed by its edit. A context manager: stops what it started."""

    def __init__(self, port: int = 8020, bare: bool = False, startup_timeout_s: float = 300, models: str = "trained",
                 engine: str | None = None, edit=None, twins: dict | None = None):
        self.port, self.bare, self.timeout, self.models, self.engine = port, bare, startup_timeout_s, models, engine
        self.edit, self.twins = edit, dict(twins or {})
        if bare:
            self.twins["bare"] = lambda app: app["args"].update(engine="fake")
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> "LocalApps":
        import copy
        import subprocess
        import tempfile

        import yaml

        config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
        config["http_options"]["port"] = self.port
        if self.models == "tiny":  # the random-init pair: they never stop early, so every request decodes to its limit
            config["applications"][0]["args"]["small"] = {"model": "tiny:small", "reasoning_format": "think_tags"}
            config["applications"][0]["args"]["large"] = {"model": "tiny:large", "reasoning_format": "prompted"}
        if self.engine:  # engines compared on the checkpoints both can run: serve_config.vllm-cpu.yaml's
            vllm = yaml.safe_load((ROOT / "serve_config.vllm-cpu.yaml").read_text())
            if self.engine == "vllm":
                config["applications"] = vllm["applications"]
            else:
                args = config["applications"][0]["args"]
                args.update(small=vllm["applications"][0]["args"]["small"], large=vllm["applications"][0]["args"]["large"],
                            engine=self.engine)
        if self.edit:
            self.edit(config["applications"][0])
        for name, edit in self.twins.items():
            twin = copy.deepcopy(config["applications"][0])
            twin.update(name=name, route_prefix=f"/{name}")
            edit(twin)
            config["applications"].append(twin)
        self._config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        yaml.safe_dump(config, self._config)
        self._config.close()
        self._log = open(tempfile.mktemp(suffix=".serve.log"), "w")
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        # The `serve` beside this interpreter: a venv's python run without activating the venv finds it.
        here = Path(sys.executable).parent / "serve"
        serve_cli = str(here) if here.exists() else "serve"
        self._proc = subprocess.Popen([serve_cli, "run", self._config.name], cwd=ROOT, env=env, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(["/"] + [f"/{name}/" for name in self.twins])
        return self

    def _wait_ready(self, prefixes: list[str]) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(f"serve run exited; see {self._log.name}")
            try:
                if all(httpx.get(f"{self.url}{p}readyz", timeout=5).status_code == 200 for p in prefixes):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1)
        raise TimeoutError(f"apps not ready after {self.timeout} s; see {self._log.name}")

    def __exit__(self, *exc) -> None:
        import signal
        import subprocess

        try:
            # SIGTERM: Ray's driver handler shuts the local cluster down; SIGINT may arrive ignored.
            self._proc.terminate()
            self._proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(self._proc.pid, signal.SIGKILL)
        finally:
            os.unlink(self._config.name)
