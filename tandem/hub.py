"""Hub checkpoints pinned and fetched per deployment: which files of a checkpoint each deployment
reads, fetching exactly those at a pinned revision (`tandem prefetch`), and the local directory a
replica loads from.

Every loader of a replica (weights, processor, tokenizer, generation config, vLLM) reads one local
snapshot directory of the checkpoint at `revision`, so all of them — and every replica reading the
same cache volume — see the same upstream commit. A deployment that reads part of a checkpoint
(the VisionEncoder: the vision towers; a transformers model server: the decoder) loads from a view
of that snapshot holding only its shards, with the safetensors index cut to them: `from_pretrained`
then opens no other shard, and the prefetch downloaded no other.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"
VISION_PREFIXES = ("model.visual.", "visual.")
# What a checkpoint holds besides its weights that the loaders read: configs, tokenizer, templates.
SUPPORT = ("*.json", "*.jinja", "*.txt", "*.model", "*.tiktoken")
PARTS = ("vision", "decoder", "all")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_hub_id(model: str) -> bool:
    """A Hub repository id (org/name) that is not a local directory."""
    return bool(_HUB_ID.match(model)) and not Path(model).exists()


def shards_for(index: dict | None, part: str) -> list[str]:
    """The weight files `part` reads: shards holding any vision-tower tensor (vision), any other
    tensor (decoder), or every shard (all: vLLM loads the whole checkpoint)."""
    if index is None:
        return [SINGLE]
    vision = lambda key: key.startswith(VISION_PREFIXES)  # noqa: E731
    keep = {"vision": vision, "decoder": lambda k: not vision(k), "all": lambda k: True}[part]
    return sorted({shard for key, shard in index["weight_map"].items() if keep(key)})


def _support_files(root: Path) -> list[str]:
    import fnmatch

    return sorted(p.name for p in root.iterdir()
                  if p.is_file() and p.name != INDEX and any(fnmatch.fnmatch(p.name, pat) for pat in SUPPORT))


def fetch(model: str, revision: str | None, part: str) -> tuple[Path, list[str]]:
    """The local snapshot of `model` at `revision` with the files `part` reads, downloaded unless
    they are in the cache (under HF_HUB_OFFLINE=1 only the cache is read: a missing file raises).
    Returns the snapshot directory and the files `part` reads, relative to it."""
    from huggingface_hub import snapshot_download

    root = Path(snapshot_download(model, revision=revision, allow_patterns=[*SUPPORT, INDEX]))
    index = json.loads((root / INDEX).read_text()) if (root / INDEX).exists() else None
    shards = shards_for(index, part)
    root = Path(snapshot_download(model, revision=revision, allow_patterns=shards))
    missing = [s for s in shards if not (root / s).exists()]
    if missing:
        raise FileNotFoundError(f"{model}@{revision or 'main'}: {', '.join(missing)} not in the Hugging Face cache "
                                f"({root}); run `tandem prefetch` with the Hub reachable")
    return root, [*_support_files(root), *([INDEX] if index else []), *shards]


def local_checkpoint(model: str, revision: str | None, part: str) -> str:
    """The directory a replica loads `model` from: the model itself when it is no Hub id; else its
    snapshot at `revision`, or for one part of a sharded checkpoint a view of it holding only that
    part's shards (its index cut to them), made once under the snapshot's own cache folder."""
    if not is_hub_id(model):
        return model
    root, files = fetch(model, revision, part)
    if part == "all" or not (root / INDEX).exists():
        return str(root)
    view = root.parent.parent / "tandem-views" / root.name / part  # beside the snapshots: one per commit
    if not (view / INDEX).exists():
        staging = view.with_name(f".{part}-{os.getpid()}")
        staging.mkdir(parents=True, exist_ok=True)
        index = json.loads((root / INDEX).read_text())
        shards = set(files)
        index["weight_map"] = {k: s for k, s in index["weight_map"].items() if s in shards}
        for name in files:
            if name != INDEX:
                link = staging / name
                if not link.exists():
                    link.symlink_to(root / name)
        (staging / INDEX).write_text(json.dumps(index))
        try:
            os.rename(staging, view)
        except OSError:  # another replica made it first: theirs is the same
            if not (view / INDEX).exists():
                raise
    return str(view)


def deployment_parts(engine: str) -> dict[str, list[tuple[str, str]]]:
    """Per deployment, the (role, part) of each checkpoint it loads."""
    decoder = "all" if engine == "vllm" else "decoder"  # vLLM loads the whole checkpoint
    return {"VisionEncoder": [("small", "vision"), ("large", "vision")],
            "SmallReasoner": [("small", decoder)], "LargeAnswerer": [("large", decoder)]}
