"""A VisionEncoder replica that dies (or is scaled down) between two stages of a request takes the
image features it owns with it: the next stage's model server cannot fetch them. The request must
not fail for it: the Router encodes the images again, on a live replica, and runs the stage again."""

from __future__ import annotations

import base64
import copy
import threading
import time

import httpx

from tests.conftest import make_png
from tests.serve.conftest import app_configs, deploy, handle


def _slow_reasoning_app() -> dict:
    app = copy.deepcopy(app_configs()[0])
    app.update(name="lost", route_prefix="/lost")
    # The small model's reasoning takes ~1.5 s (30 steps of 50 ms): time to kill the encoder after
    # the reasoning fetched its features and before the answer stage fetches them again.
    app["args"].update(engine="fake", fake={"step_s": 0.05, "answer_words": 1, "reasoning_words": 30})
    return app


def _kill_vision_encoder(app: str) -> str:
    import ray

    for actor in ray.util.list_named_actors(all_namespaces=True):
        if "VisionEncoder" in actor["name"] and f"{app}#" in actor["name"]:
            ray.kill(ray.get_actor(actor["name"], namespace=actor["namespace"]), no_restart=True)
            return actor["name"]
    raise AssertionError(f"no VisionEncoder replica of app '{app}' among {ray.util.list_named_actors(True)}")


def test_features_lost_between_stages_are_encoded_again(serve_url):
    deploy(app_configs() + [_slow_reasoning_app()])
    try:
        url = f"{serve_url}/lost/v1/chat/completions"
        image = "data:image/png;base64," + base64.b64encode(make_png(3)).decode()
        body = {"model": "tandem:small", "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": image}}, {"type": "text", "text": "How many?"}]}]}
        out = {}

        def ask():
            out["response"] = httpx.post(url, json=body, timeout=120)

        thread = threading.Thread(target=ask)
        thread.start()
        # Kill the encoder once it has encoded the image: the reasoning then decodes with features
        # that replica owns. A fixed sleep raced the first request's start-up on a slow CI machine
        # (killed before the encoding: one encode, on the replacement replica).
        encoder, deadline = handle("VisionEncoder", "lost"), time.monotonic() + 60
        while encoder.stats.remote().result()["encoded"]["small"] < 1:
            assert thread.is_alive() and time.monotonic() < deadline, "the image was never encoded"
            time.sleep(0.02)
        assert thread.is_alive(), "the request ended before the encoder could be killed"
        killed = _kill_vision_encoder("lost")
        thread.join()
        r = out["response"]
        assert r.status_code == 200, (killed, r.text)
        trace = r.json()["tandem"]
        assert trace["path"] == "small"
        assert trace["images_encoded"]["small"] == 2, trace  # once, then again after the owner died
    finally:
        deploy(app_configs())
