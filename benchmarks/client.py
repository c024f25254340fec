"""The client side the benchmarks share: synthetic request bodies, one timed HTTP request, and
starting serve_config.yaml's app locally (with an optional model-free twin for the bare cost)."""

from __future__ import annotations

import base64
import io
import os
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


@dataclass
class Outcome:
    status: int | str
    latency_ms: float
    finished_s: float = 0.0
    completion_tokens: int = 0
    trace: dict = field(default_factory=dict)


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
    `/bare`, for the bare cost of the Serve composition. A context manager: stops what it started."""

    def __init__(self, port: int = 8020, bare: bool = False, startup_timeout_s: float = 300):
        self.port, self.bare, self.timeout = port, bare, startup_timeout_s
        self.url = f"http://127.0.0.1:{port}"

    def __enter__(self) -> "LocalApps":
        import copy
        import subprocess
        import tempfile

        import yaml

        config = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
        config["http_options"]["port"] = self.port
        if self.bare:
            twin = copy.deepcopy(config["applications"][0])
            twin.update(name="bare", route_prefix="/bare")
            twin["args"]["engine"] = "fake"
            config["applications"].append(twin)
        self._config = tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False)
        yaml.safe_dump(config, self._config)
        self._config.close()
        self._log = open(tempfile.mktemp(suffix=".serve.log"), "w")
        env = {**os.environ, "HF_HUB_OFFLINE": "1"}
        self._proc = subprocess.Popen(["serve", "run", self._config.name], cwd=ROOT, env=env, stdout=self._log,
                                      stderr=subprocess.STDOUT, start_new_session=True)
        self._wait_ready(["/"] + (["/bare/"] if self.bare else []))
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
