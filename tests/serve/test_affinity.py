"""Replica affinity under real Serve, with two replicas of each model: a request's later stage on a
model lands on the replica that ran its earlier one (where its prompt head is kept), and when that
replica is gone the Router's stage call still answers on another, sent right after the death."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from deployments.router import _generate_stage
from tandem.schemas import GenerationRequest, SamplingParams
from tests.conftest import make_png
from tests.serve.conftest import ENGINE, app_configs, deploy, handle
from tests.serve.test_app import image_part

pytestmark = pytest.mark.serve


@pytest.fixture(scope="module")
def url(serve_url):
    apps = app_configs()
    pair = json.loads(json.dumps(apps[0]))
    pair.update(name="pair", route_prefix="/pair")
    for dep in pair["deployments"]:
        if dep["name"] in ("SmallReasoner", "LargeAnswerer"):
            dep["num_replicas"] = 2
    deploy(apps + [pair])
    yield f"{serve_url}/pair"
    deploy(app_configs())


async def test_a_requests_later_stages_land_on_its_earlier_stages_replica(url):
    async def ask(client, i):
        body = {"model": "tandem:mutual", "max_tokens": 3, "messages": [{"role": "user", "content": [
            image_part(make_png(500 + i)), {"type": "text", "text": f"question {i}?"}]}]}
        r = await client.post(f"{url}/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text[:300]
        return r.json()["tandem"]

    async with httpx.AsyncClient(timeout=120) as client:
        traces = await asyncio.gather(*(ask(client, i) for i in range(8)))
    transfers = [t for t in traces if t["path"] == "transfer"]
    assert transfers  # the random-init pair disagrees: mutual transfers
    stages = [t["stages"] for t in transfers]
    assert all(s["large_transfer"]["replica"] == s["large_direct"]["replica"] for s in stages), stages
    assert all(s["small_reasoning"]["replica"] == s["small_direct"]["replica"] for s in stages), stages
    assert len({s["large_direct"]["replica"] for s in stages}) >= 1
    if ENGINE != "vllm":  # vLLM caches whole 32-token blocks of its own
        assert all(s["large_transfer"]["cached_tokens"] > 0 for s in stages), stages


def _kill(unique_id: str) -> None:
    import ray
    from ray._private.state import actors

    for info in actors(actor_state_name="ALIVE").values():
        if unique_id in (info.get("Name") or ""):
            ray.kill(ray.get_actor(info["Name"], namespace="serve"), no_restart=True)
            return
    raise AssertionError(f"no live replica {unique_id}")


async def test_when_the_first_stages_replica_is_gone_the_next_stage_still_answers(url):
    large = handle("LargeAnswerer", app="pair")
    call = _generate_stage(large)  # as the Router calls a stage

    def stage(tokens: int) -> GenerationRequest:
        return GenerationRequest("<|im_start|>user\nwhich one?<|im_end|>\n<|im_start|>assistant\n", [],
                                 SamplingParams(max_tokens=tokens), request_id="affinity-kill")

    first = await call(stage(2))
    second = await call(stage(3))
    assert second.replica == first.replica and second.cached_tokens >= (0 if ENGINE == "vllm" else 1)
    _kill(first.replica)
    third = await call(stage(3))  # affinity names the dead replica until the handle hears of it
    assert third.replica != first.replica and third.completion_tokens >= 1
