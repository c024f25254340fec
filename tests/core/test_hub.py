"""Hub checkpoints, offline: a tiny Qwen3-VL saved sharded and laid out as a Hugging Face hub cache
(models--org--name/snapshots/<commit>/, refs/main), read with HF_HUB_OFFLINE=1 as a prefetched
replica reads it. Each deployment fetches and loads only the shards it needs: the VisionEncoder's
load works with the decoder's shards absent, and `tandem prefetch` lists per deployment what it
fetched; `--pin` writes the commit into the config."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tandem.hub import INDEX, is_hub_id, shards_for

ROOT = Path(__file__).resolve().parents[2]
REPO = "tandem-test/tiny-vl"
COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """HF_HUB_CACHE with REPO at COMMIT: tiny:small saved in ~100 KB shards, its processor files beside."""
    from transformers import AutoModelForImageTextToText

    from tandem.checkpoints import resolve_model_ref

    src = Path(resolve_model_ref("tiny:small"))
    cache = tmp_path_factory.mktemp("hub")
    snapshot = cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / COMMIT
    AutoModelForImageTextToText.from_pretrained(src).save_pretrained(snapshot, max_shard_size="100KB")
    for f in src.iterdir():
        if f.is_file() and not f.name.startswith("model") and not (snapshot / f.name).exists():
            shutil.copy(f, snapshot / f.name)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(COMMIT)
    return cache, snapshot


def env_for(cache: Path) -> dict:
    return {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "HF_HOME": str(cache.parent / "home")}


def config_file(tmp_path: Path, **extra) -> Path:
    base = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    base["applications"][0]["args"]["small"] = {"model": REPO, "reasoning_format": "think_tags", **extra}
    base["applications"][0]["args"]["large"] = {"model": REPO, "reasoning_format": "prompted", **extra}
    path = tmp_path / "serve_config.yaml"
    path.write_text(yaml.safe_dump(base))
    return path


def test_each_part_reads_its_own_shards(hub):
    _, snapshot = hub
    index = json.loads((snapshot / INDEX).read_text())
    vision, decoder, everything = (set(shards_for(index, part)) for part in ("vision", "decoder", "all"))
    assert len(everything) >= 4 and vision and decoder and vision | decoder == everything
    assert vision != everything and decoder != everything  # some shards hold only one part
    assert shards_for(None, "vision") == ["model.safetensors"]
    assert is_hub_id(REPO) and not is_hub_id(str(snapshot)) and not is_hub_id("trained:small")


def test_prefetch_lists_per_deployment_the_files_it_fetched_and_pins_the_commit(hub, tmp_path):
    cache, snapshot = hub
    index = json.loads((snapshot / INDEX).read_text())
    path = config_file(tmp_path)
    out = subprocess.run([sys.executable, "-m", "tandem.cli", "prefetch", str(path), "--pin"], env=env_for(cache),
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    lines = {line.split(":", 1)[0] + line.split(":", 2)[1].split()[0]: line for line in out.stdout.splitlines()
             if line.startswith(("VisionEncoder", "SmallReasoner", "LargeAnswerer"))}
    vision_line, small_line = lines["VisionEncodersmall"], lines["SmallReasonersmall"]
    assert f"{REPO}@{COMMIT} (vision)" in vision_line and "config.json" in vision_line and INDEX in vision_line
    assert all(s in vision_line for s in shards_for(index, "vision"))
    assert not any(s in vision_line for s in set(shards_for(index, "decoder")) - set(shards_for(index, "vision")))
    assert all(s in small_line for s in shards_for(index, "decoder")) and "(decoder)" in small_line
    args = yaml.safe_load(path.read_text())["applications"][0]["args"]
    assert args["small"]["revision"] == COMMIT and args["large"]["revision"] == COMMIT


def test_a_vision_encoder_loads_with_only_its_shards_and_a_decoder_names_what_is_missing(hub, tmp_path):
    """The decoder's own shards removed from the cache: the vision towers still load and encode,
    through the same from_pretrained path; the decoder's load says to prefetch."""
    cache, snapshot = hub
    partial = tmp_path / "hub"
    shutil.copytree(cache, partial, symlinks=True)
    part_snapshot = partial / snapshot.relative_to(cache)
    index = json.loads((snapshot / INDEX).read_text())
    for shard in set(shards_for(index, "decoder")) - set(shards_for(index, "vision")):
        (part_snapshot / shard).unlink()
    script = f"""
import io, sys
from PIL import Image
from tandem.config import ModelConfig
from tandem.engines.transformers_engine import TransformersEngine
config = ModelConfig(model={REPO!r}, revision={COMMIT!r})
vision = TransformersEngine(config, name="small", language=False)
buf = io.BytesIO(); Image.new("RGB", (64, 64), (200, 10, 10)).save(buf, "PNG")
print("encoded", vision.encode_images([buf.getvalue()])[0].num_tokens)
try:
    TransformersEngine(config, name="small", vision=False)
except FileNotFoundError as err:
    print("decoder:", err)
"""
    out = subprocess.run([sys.executable, "-c", script], env=env_for(partial), capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "encoded" in out.stdout and "decoder:" in out.stdout and "run `tandem prefetch`" in out.stdout


def test_pinning_keeps_the_config_as_written():
    from tandem.cli import _pin_revision

    text = (ROOT / "serve_config.gpu.yaml").read_text()
    pinned, n = _pin_revision(text, "Qwen/Qwen3-VL-8B-Instruct", COMMIT)
    again, _ = _pin_revision(pinned, "Qwen/Qwen3-VL-8B-Instruct", "f" * 40)
    assert n == 1 and pinned.count("#") == text.count("#")  # comments kept
    args = yaml.safe_load(again)["applications"][0]["args"]
    assert args["large"]["revision"] == "f" * 40 and "revision" not in args["small"]
