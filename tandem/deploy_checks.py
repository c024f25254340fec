"""What a serve config's deployment options must hold beyond its Tandem args, checked without Ray
(`tandem validate-config`): replicas drain what they hold before they stop, and each deployment fits
the GPU it asks for.

Drain: Serve stops a replica (downscale, upgrade, node drain) by refusing it new calls and waiting
`graceful_shutdown_timeout_s` for those in flight; a model server's call lasts at most
`limits.stage_timeout_s`, the Router's at most `http.request_timeout_s`. Kubernetes then kills the
pod after its `terminationGracePeriodSeconds`, which must be above both. And a stage deadline must
let the longest reasoning finish: `stage_timeout_s` >= 2 x reasoning_max_tokens x a decode step at
the deployment's largest batch (from a stage profile).

GPU memory, per deployment, in bf16: the weights of what it loads + KV bytes per token x its largest
batch x (the longest prompt the HTTP limits admit + the longest generation) + the kept prompt heads
+ the peak activations of its largest prefill + a CUDA context, against num_gpus x the GPU's memory.
vLLM engines take `gpu_memory_utilization` of the GPU each: those sharing one must sum to at most
0.9, and that share must hold the weights and one longest sequence (else vLLM refuses to start).
"""

from __future__ import annotations

import math

from tandem.config import TandemConfig, longest_generation_tokens, longest_prompt_tokens

DRAIN_MARGIN_S = 5  # past the longest call: time to return its answer and close the stream
# Memory the driver reports on each GPU (nvidia-smi's total, GiB), not the datasheet's GB.
GPU_MEMORY_GIB = {"L4": 22.5, "A10G": 22.5, "L40S": 45.0, "A100-40GB": 39.5, "A100-80GB": 79.3,
                  "H100": 79.6, "H200": 139.8}
CUDA_CONTEXT_GIB = 1.0  # CUDA context, cuBLAS workspaces, allocator slack: per process
VLLM_SHARED_MAX = 0.9
MODEL_DEPLOYMENTS = {"SmallReasoner": "small", "LargeAnswerer": "large"}
GIB = 2**30


def drain_defaults(config: TandemConfig) -> dict[str, float]:
    """Each deployment's graceful_shutdown_timeout_s: its longest call, plus a margin."""
    stage = config.limits.stage_timeout_s + DRAIN_MARGIN_S
    return {"Router": config.http.request_timeout_s + DRAIN_MARGIN_S, "VisionEncoder": stage,
            "SmallReasoner": stage, "LargeAnswerer": stage}


def drain_problems(config: TandemConfig, deployments: list[dict]) -> list[str]:
    problems = []
    for dep in deployments:
        name, want = dep.get("name"), drain_defaults(config).get(dep.get("name"))
        got = dep.get("graceful_shutdown_timeout_s")
        if want is not None and got is not None and got < want:
            longest = "http.request_timeout_s" if name == "Router" else "limits.stage_timeout_s"
            problems.append(f"deployment '{name}': graceful_shutdown_timeout_s ({got}) is below its longest call "
                            f"({longest}) + {DRAIN_MARGIN_S} s = {want}: stopping a replica would fail calls in flight")
    return problems


def pod_grace_needed(config: TandemConfig, deployments: list[dict]) -> float:
    """The terminationGracePeriodSeconds a pod needs: above every deployment's drain."""
    drains = drain_defaults(config)
    return max(max(d.get("graceful_shutdown_timeout_s", drains.get(d.get("name"), 0)) for d in deployments)
               if deployments else 0, *drains.values()) + DRAIN_MARGIN_S


def stage_timeout_problem(config: TandemConfig, step_ms: dict[str, float]) -> str | None:
    """`step_ms`: a decode step (ms) per model role at its deployment's largest batch."""
    need = max(2 * config.limits.reasoning_max_tokens * ms / 1000 for ms in step_ms.values())
    if config.limits.stage_timeout_s < need:
        return (f"limits.stage_timeout_s ({config.limits.stage_timeout_s}) is below 2 x reasoning_max_tokens "
                f"({config.limits.reasoning_max_tokens}) x a decode step ({max(step_ms.values()):.1f} ms): {need:.0f} s")
    return None


# --- GPU memory ----------------------------------------------------------------------------------
def real_size_name(model: str) -> str | None:
    """The REAL_SIZES entry of a Qwen3-VL checkpoint id (Qwen/Qwen3-VL-8B-Instruct -> qwen3-vl-8b)."""
    from tandem.checkpoints import REAL_SIZES

    low = model.lower()
    for name in REAL_SIZES:
        if f"{name}-" in low or low.endswith(name) or f"random:{name}" == low:
            return name
    return None


def model_shape(model: str) -> dict:
    """Parameters (decoder, vision tower) and the decoder's shape, counted on the meta device."""
    import torch
    from transformers import Qwen3VLForConditionalGeneration

    from tandem.checkpoints import REAL_SIZES, real_size_config

    name = real_size_name(model)
    if name is None:
        raise ValueError(f"no known size for model '{model}' (known: Qwen3-VL {', '.join(REAL_SIZES)})")
    config = real_size_config(name)
    with torch.device("meta"):
        m = Qwen3VLForConditionalGeneration._from_config(config)
    vision = sum(p.numel() for p in m.model.visual.parameters())
    text, v = config.text_config, config.vision_config
    return {"decoder_params": sum(p.numel() for p in m.parameters()) - vision, "vision_params": vision,
            "kv_bytes_per_token": 2 * text.num_hidden_layers * text.num_key_value_heads * text.head_dim * 2,
            "hidden": text.hidden_size, "intermediate": text.intermediate_size,
            "vision_hidden": v.hidden_size, "vision_intermediate": v.intermediate_size}


def _activation_bytes(tokens: int, hidden: int, intermediate: int) -> int:
    """One layer's peak during a prefill of `tokens` (bf16): the MLP's gate, up and product, and the
    residual, normed and attention outputs; layers run one after another, so one layer's worth."""
    return tokens * (3 * intermediate + 4 * hidden) * 2


def _need_transformers(config: TandemConfig, role: str, dep: dict, shape: dict) -> dict:
    user = dep.get("user_config") or {}
    batch = user.get("max_batch_size", 8)
    tokens = min(sum(longest_prompt_tokens(config, role).values()), config.limits.max_prompt_tokens)
    seq = tokens + longest_generation_tokens(config)
    return {"weights": shape["decoder_params"] * 2, "kv": shape["kv_bytes_per_token"] * batch * seq,
            "prefix_heads": user.get("prefix_cache_bytes", 64 * 2**20),
            "activations": _activation_bytes(batch * tokens, shape["hidden"], shape["intermediate"]),
            "context": CUDA_CONTEXT_GIB * GIB, "_note": f"batch {batch} x {seq} tokens"}


def _need_vision(config: TandemConfig, dep: dict, shapes: dict) -> dict:
    user = dep.get("user_config") or {}
    batch = user.get("max_batch_size", 8)
    patches = {role: 4 * (config.model(role).max_pixels // 1024) for role in shapes}  # four 16-px patches a token
    act = max(_activation_bytes(batch * config.http.max_images * patches[r], s["vision_hidden"], s["vision_intermediate"])
              for r, s in shapes.items())
    return {"weights": sum(s["vision_params"] * 2 for s in shapes.values()), "activations": act,
            "context": CUDA_CONTEXT_GIB * GIB, "_note": f"both towers; batch {batch} x {config.http.max_images} images"}


def gpu_fit(config: TandemConfig, deployments: list[dict], gpu: str) -> list[dict]:
    """One row per GPU deployment: what it needs, what it has, whether it fits, and why not."""
    memory = GPU_MEMORY_GIB[gpu] * GIB
    shapes = {role: model_shape(config.model(role).model) for role in ("small", "large")}
    rows = []
    for dep in deployments:
        name = dep.get("name")
        num_gpus = (dep.get("ray_actor_options") or {}).get("num_gpus", 0)
        if not num_gpus:
            continue
        have = num_gpus * memory if num_gpus <= 1 else math.floor(num_gpus) * memory
        if name == "VisionEncoder":
            need = _need_vision(config, dep, shapes)
        elif config.engine == "vllm":
            rows.append(_vllm_row(config, MODEL_DEPLOYMENTS[name], dep, shapes[MODEL_DEPLOYMENTS[name]], gpu, memory))
            continue
        else:
            need = _need_transformers(config, MODEL_DEPLOYMENTS[name], dep, shapes[MODEL_DEPLOYMENTS[name]])
        total = sum(v for k, v in need.items() if not k.startswith("_"))
        parts = ", ".join(f"{k} {v / GIB:.1f}" for k, v in need.items() if not k.startswith("_"))
        rows.append({"deployment": name, "gpu": gpu, "num_gpus": num_gpus, "need_gib": round(total / GIB, 1),
                     "have_gib": round(have / GIB, 1), "fits": total <= have,
                     "why": f"{parts} GiB ({need['_note']})"})
    return rows


def _vllm_row(config: TandemConfig, role: str, dep: dict, shape: dict, gpu: str, memory: float) -> dict:
    """vLLM takes `gpu_memory_utilization` of the GPU; replicas sharing one GPU take it each. Its share
    must hold the whole checkpoint (vLLM loads the vision tower too), one longest sequence's KV and
    the context; what is left is KV for the batch."""
    opts = config.model(role).vllm
    num_gpus = (dep.get("ray_actor_options") or {}).get("num_gpus", 1)
    sharing = max(1, math.floor(1 / num_gpus)) if num_gpus < 1 else 1
    share = opts.gpu_memory_utilization * memory * max(1, math.floor(num_gpus)) / max(1, opts.tensor_parallel_size)
    weights = (shape["decoder_params"] + shape["vision_params"]) * 2 / opts.tensor_parallel_size
    one_seq = shape["kv_bytes_per_token"] * opts.max_model_len
    need = weights + one_seq + CUDA_CONTEXT_GIB * GIB
    kv_tokens = max(0, int((share - weights - CUDA_CONTEXT_GIB * GIB) // shape["kv_bytes_per_token"]))
    why = [f"weights {weights / GIB:.1f} + one {opts.max_model_len}-token sequence {one_seq / GIB:.1f} + context "
           f"{CUDA_CONTEXT_GIB:.1f} GiB within gpu_memory_utilization {opts.gpu_memory_utilization}; KV for "
           f"{kv_tokens} tokens ({kv_tokens // max(1, opts.max_model_len)} longest sequences)"]
    fits = need <= share
    if sharing * opts.gpu_memory_utilization > VLLM_SHARED_MAX:
        fits = False
        why.append(f"{sharing} replicas share a GPU (num_gpus {num_gpus}) at gpu_memory_utilization "
                   f"{opts.gpu_memory_utilization} each: {sharing * opts.gpu_memory_utilization:.2f} > {VLLM_SHARED_MAX}")
    return {"deployment": dep.get("name"), "gpu": gpu, "num_gpus": num_gpus, "need_gib": round(need / GIB, 1),
            "have_gib": round(share / GIB, 1), "fits": fits, "why": "; ".join(why)}
