"""Typed configuration of the Tandem pipeline, validated once (pydantic, unknown keys rejected).

Owns the structure of a deployment's `args`: which models play the small and large roles, how they
run, the default policy, the selector and the generation limits. Resources, autoscaling and other
Serve options are not here: they belong to Serve's own `deployments:` section.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from tandem.errors import ConfigError
from tandem.policies import POLICIES, POLICY_NAMES

PolicyName = Literal[POLICY_NAMES]  # type: ignore[valid-type]
SelectorName = Literal["full", "budget", "attention"]
# The Serve deployments a config may name (deployments/app.py binds exactly these).
DEPLOYMENT_NAMES: tuple[str, ...] = ("Router", "VisionEncoder", "SmallReasoner", "LargeAnswerer")
# The Router's max_ongoing_requests where a serve config sets none (deployments/app.py): validate-config
# checks http.max_in_flight against it.
ROUTER_MAX_ONGOING = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class VllmOptions(_Strict):
    """How `engine: vllm` runs one role's model (vLLM's own engine arguments, checked here without vLLM
    installed). Ignored by the other engines."""

    max_model_len: int = Field(8192, gt=0, description="Longest sequence (prompt + output) vLLM plans KV "
                                                       "cache for: at least limits.max_prompt_tokens plus the "
                                                       "longest generation (`tandem validate-config` checks it).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, description="GPU: share of the GPU's memory vLLM "
                                                                       "takes for weights, activations and KV cache.")
    tensor_parallel_size: int = Field(1, gt=0, description="GPUs one replica shards the model over (give the "
                                                           "deployment as many: a placement group bundle each).")
    max_num_seqs: int = Field(64, gt=0, description="Most requests decoded together (continuous batching).")
    block_size: int | None = Field(None, gt=0, description="KV cache block in tokens; prefix caching reuses whole "
                                                           "blocks. None: vLLM's default for the platform.")
    enable_prefix_caching: bool = Field(True, description="Reuse the KV cache of a prompt head seen before (the "
                                                          "transfer prompt shares system, image and question with "
                                                          "the direct one).")
    enforce_eager: bool = Field(False, description="No CUDA graphs or torch.compile (the CPU config sets it: "
                                                   "compiling costs minutes there).")
    cpu_kv_cache_gib: int = Field(1, gt=0, description="CPU only: KV cache size in GiB (VLLM_CPU_KVCACHE_SPACE).")


class ModelConfig(_Strict):
    """One model role (small reasoner or large answerer)."""

    model: str = Field(description="Hub id (e.g. Qwen/Qwen3-VL-8B-Instruct), local path, trained:small / "
                                   "trained:large for the pair trained on the grid task (shipped), tiny:small / "
                                   "tiny:large for an offline random-init checkpoint built on first use, or "
                                   "random:qwen3-vl-<2b|4b|8b|32b> for one at a real model's size.")
    revision: str | None = Field(None, pattern=r"^[\w./-]{1,100}$",
                                 description="For a Hub id: the commit (SHA) every loader of every replica reads "
                                             "(`tandem prefetch --pin` writes the current one); none: the cached "
                                             "snapshot of main.")
    reasoning_format: Literal["think_tags", "prompted"] = Field(
        "think_tags", description="How the model reasons: inside <think>...</think> (Thinking variants) or "
                                  "when asked to in the prompt (Instruct variants).")
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = Field("float32", description="Weights dtype.")
    device: str = Field("cpu", pattern=r"^(cpu|cuda(:\d+)?|auto)$",
                        description="torch device: cpu, cuda, cuda:N, or auto (layers spread over all the "
                                    "GPUs given to the replica, e.g. a 32B model on num_gpus: 2).")
    min_pixels: int = Field(32 * 32, gt=0, description="Images are resized to at least this many pixels.")
    max_pixels: int = Field(256 * 256, gt=0, description="Images are resized to at most this many pixels "
                                                         "(bounds the number of visual tokens).")
    trust_remote_code: bool = Field(False, description="Allow code shipped with a checkpoint to run. Off "
                                                       "unless the operator turns it on.")
    vllm: VllmOptions = Field(VllmOptions(), description="Engine arguments when `engine: vllm`.")

    @model_validator(mode="after")
    def _pixels_ordered(self) -> "ModelConfig":
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels ({self.min_pixels}) exceeds max_pixels ({self.max_pixels})")
        return self


class PolicyConfig(_Strict):
    """Which policy runs by default and the knobs of the ones that decide."""

    default: PolicyName = Field("mutual", description="Policy for model name `tandem`.")
    # Bounds from the policy table, which also checks a per-request value against them.
    confidence_threshold: float = Field(
        0.5, ge=POLICIES["confidence"].param.low, le=POLICIES["confidence"].param.high,
        description="`confidence`, `confidence_mutual`: transfer when the large model's mean answer-token "
                    "probability is under this (per request: tandem:confidence@<threshold>).")
    random_transfer_p: float = Field(
        0.5, ge=POLICIES["random"].param.low, le=POLICIES["random"].param.high,
        description="`random`: probability of a transfer (per request: tandem:random@<p>).")
    speculative: bool = Field(False, description="`mutual`: start the small model's reasoning during "
                                                 "stage 1 and cancel it when the answers agree.")
    seed: int = Field(0, description="Seed of the `random` policy's draws.")
    budget_min_reasoning_tokens: int = Field(
        8, gt=0, description="Under a request's latency budget, reasoning shorter than this is not worth "
                             "transferring: the large model answers directly instead.")
    on_small_failure: Literal["degrade", "fail"] = Field(
        "degrade", description="When the small reasoner fails or times out: answer with the large model and "
                               "mark the answer degraded, or fail the request.")


class SelectorConfig(_Strict):
    """What part of the small model's reasoning is transferred to the large model."""

    kind: SelectorName = Field("budget", description="full: all of it; budget: head and tail under budget; "
                                                     "attention: the spans the small model's answer attended to most.")
    budget_tokens: int = Field(128, gt=0, description="Most reasoning tokens transferred.")
    head_fraction: float = Field(0.5, ge=0.0, le=1.0, description="`budget`: share of the budget taken "
                                                                   "from the start of the reasoning.")
    span_tokens: int = Field(16, gt=0, description="`attention`: reasoning is scored in spans of this many tokens.")


class EffortFractions(_Strict):
    """What OpenAI's `reasoning_effort` sets: the share of `limits.reasoning_max_tokens` a request may
    reason for (`none` and `minimal`: no reasoning at all)."""

    low: float = Field(0.25, gt=0, le=1, description="`reasoning_effort: low`.")
    medium: float = Field(0.5, gt=0, le=1, description="`reasoning_effort: medium`.")
    high: float = Field(1.0, gt=0, le=1, description="`reasoning_effort: high`.")
    xhigh: float = Field(1.0, gt=0, le=1, description="`reasoning_effort: xhigh`.")


class GenerationLimits(_Strict):
    """Token budgets per kind of stage."""

    answer_max_tokens: int = Field(16, gt=0, le=4096, description="Short answers (direct and final).")
    reasoning_max_tokens: int = Field(128, gt=0, le=32768, description="Reasoning before an answer.")
    max_request_tokens: int = Field(256, gt=0, le=32768,
                                    description="Most tokens a client may ask for through max_tokens.")
    max_prompt_tokens: int = Field(4096, gt=0, description="Longest prompt a model server accepts (400 above).")
    stage_timeout_s: float = Field(60.0, gt=0, description="Deadline of each stage call (504 naming the stage).")
    reasoning_effort: EffortFractions = Field(default_factory=EffortFractions,
                                              description="The reasoning budget each `reasoning_effort` allows.")


class HttpConfig(_Strict):
    """What the ingress accepts from clients. Every limit is checked before a model sees the request."""

    max_body_bytes: int = Field(16 * 2**20, gt=0, description="Largest request body (413 above).")
    max_images: int = Field(4, ge=0, description="Most images in one request.")
    max_image_bytes: int = Field(8 * 2**20, gt=0, description="Largest decoded image file (413 above).")
    max_image_pixels: int = Field(4096 * 4096, gt=0, description="Largest image, width x height (413 above).")
    max_question_chars: int = Field(3000, gt=0, description="Longest text across a request's messages "
                                                            "(within limits.max_prompt_tokens with the images: "
                                                            "`tandem validate-config` checks it).")
    allowed_image_hosts: tuple[str, ...] = Field(
        (), description="Hosts whose http(s) image URLs may be fetched. Empty: remote URLs are refused.")
    image_fetch_timeout_s: float = Field(5.0, gt=0, description="Connect and read timeout of a remote image.")
    request_timeout_s: float = Field(120.0, gt=0, description="Whole-request deadline (504 past it).")
    max_in_flight: int | None = Field(None, gt=0, description="Chat requests one Router replica answers at once; "
                                                            "past it a request gets 503 overloaded_error with "
                                                            "Retry-After before any work is done. None: only "
                                                            "the deployment's max_ongoing_requests.")
    max_json_depth: int = Field(16, gt=2, le=256, description="Deepest nesting of arrays and objects in a request "
                                                             "body (a chat request needs 6).")
    max_json_items: int = Field(4096, gt=16, description="Most JSON values (every array element, object value and "
                                                         "scalar) in a request body, checked before validation.")
    max_jpeg_scans: int = Field(32, gt=0, description="Most scans of a JPEG image (a progressive JPEG has about 10; "
                                                      "each scan is a decode pass over the whole image).")
    api_keys_env: str | None = Field(None, description="Environment variable holding comma-separated API keys; "
                                                      "when set, requests need 'Authorization: Bearer <key>'.")
    api_keys_file: str | None = Field(None, description="File of API keys, one per line (alternative to the "
                                                       "environment variable).")


class FakeEngineConfig(_Strict):
    """The model-free engine (`engine: fake`), for orchestration tests and the bare cost of Serve."""

    step_s: float = Field(0.0, ge=0, description="Fixed cost of one decoding step, whatever the batch size "
                                                 "(as on a GPU).")
    answer_words: int = Field(1, gt=0, description="Words of a direct answer.")
    reasoning_words: int = Field(64, gt=0, description="Words of a reasoning.")
    small_answer: str = Field("A", pattern=r"^[A-Za-z0-9]{1,8}$",
                              description="The small model's direct answer (the large one answers A): another "
                                          "word makes the two disagree, so `mutual` transfers.")


class PacedEngineConfig(_Strict):
    """The paced engine (`engine: paced`): a stage profile's service times as waits, for checking the
    capacity simulator against the served app where the machine's speed cannot blur it."""

    profile: str = Field("", description="A stage profile (JSON, capacity/stage_profile.py's format).")
    transfer_rate: float | None = Field(None, ge=0, le=1, description="Share of `mutual` requests that transfer "
                                                                       "(default: the profile workload's).")


class TandemConfig(_Strict):
    """The whole pipeline: two models, the engine, the default policy, the selector and limits."""

    small: ModelConfig = Field(ModelConfig(model="trained:small"), description="The small reasoner.")
    large: ModelConfig = Field(ModelConfig(model="trained:large", reasoning_format="prompted"),
                               description="The large answerer.")
    engine: Literal["transformers", "vllm", "fake", "paced"] = Field(
        "transformers", description="Engine behind both roles: transformers (static checkpoints, Tandem's own "
                                    "decode loop), vllm (continuous batching, prefix caching; the `vllm` or "
                                    "`vllm-cpu` extra), fake (no model: orchestration tests) or paced (no model, a "
                                    "stage profile's times as waits: the capacity simulator's check).")
    fake: FakeEngineConfig = Field(FakeEngineConfig(), description="Settings of the fake engine.")
    paced: PacedEngineConfig = Field(PacedEngineConfig(), description="Settings of the paced engine.")
    policy: PolicyConfig = Field(PolicyConfig(), description="Policy defaults.")
    selector: SelectorConfig = Field(SelectorConfig(), description="Reasoning selector.")
    limits: GenerationLimits = Field(GenerationLimits(), description="Token budgets.")
    http: HttpConfig = Field(HttpConfig(), description="Limits of the HTTP ingress.")

    def model(self, role: str) -> ModelConfig:
        return {"small": self.small, "large": self.large}[role]


# Qwen3-VL turns 16-px patches, merged 2 x 2, into one visual token: 32 x 32 pixels per token (the
# shipped tiny checkpoints keep the same geometry), plus the vision start and end tokens per image.
PIXELS_PER_VISUAL_TOKEN = 32 * 32
# The chat template's own tokens around the longest prompt (roles, think tags, the instruction lines
# of prompts.py): a margin, not a measurement of one tokenizer.
TEMPLATE_TOKENS = 64


def visual_tokens(max_pixels: int) -> int:
    """Most prompt tokens one image can take for a model resizing to at most `max_pixels`."""
    return max_pixels // PIXELS_PER_VISUAL_TOKEN + 2


def longest_prompt_tokens(config: TandemConfig, role: str) -> dict[str, int]:
    """The parts of the longest prompt a request within the HTTP limits can make for `role`: every
    image at max_pixels, the whole question at one token per character (ASCII's worst case; text in
    other scripts can take more, and is then refused with a 400 by the model server), and the
    longest text a stage adds — a reasoning (answer after reasoning) or a transferred excerpt."""
    added = max(config.limits.reasoning_max_tokens, config.selector.budget_tokens)
    return {"images": config.http.max_images * visual_tokens(config.model(role).max_pixels),
            "question": config.http.max_question_chars, "added": added, "template": TEMPLATE_TOKENS}


def longest_generation_tokens(config: TandemConfig) -> int:
    """Most tokens one stage may generate: a reasoning, an answer, or what a client asks for."""
    limits = config.limits
    return max(limits.reasoning_max_tokens, limits.answer_max_tokens, limits.max_request_tokens)


def calls_at_once(speculative: bool) -> dict[str, int]:
    """The calls one request can have waiting on each model deployment at once: an encode per model
    role, both started together; the small model's direct answer and, with policy.speculative, its
    reasoning beside it; one large-model call at a time. A model deployment's queue must hold this
    many per request its callers admit (`tandem validate-config`; the planner sizes them so)."""
    return {"VisionEncoder": 2, "SmallReasoner": 2 if speculative else 1, "LargeAnswerer": 1}


def queue_to_hold(queued: int, calls: int, limit: int | None) -> int:
    """A model deployment's max_queued_requests (per calling Router) that holds the `calls` each of
    `limit` admitted requests can have waiting on it at once: `queued` where it already does (or is
    unbounded, -1, or there is no limit), else calls x limit. Below it, the deployment sheds requests
    the Router admitted; `tandem validate-config` refuses that, and the planner writes this."""
    return queued if queued == -1 or not limit or queued >= calls * limit else calls * limit


def limit_problems(config: TandemConfig) -> list[str]:
    """Cross-field invariants that one field's validation cannot see: a request that every HTTP limit
    admits must not be refused by a model server for its prompt's length; on vLLM, the longest prompt
    and generation must fit the sequence length its KV cache is planned for."""
    problems = []
    if config.engine == "vllm":
        if config.selector.kind == "attention":
            problems.append("selector.kind 'attention' needs the small model's attention weights, which "
                            "engine 'vllm' does not return; use 'budget' or 'full'")
        need = config.limits.max_prompt_tokens + longest_generation_tokens(config)
        for role in ("small", "large"):
            have = config.model(role).vllm.max_model_len
            if have < need:
                problems.append(f"{role}.vllm.max_model_len ({have}) is below limits.max_prompt_tokens "
                                f"({config.limits.max_prompt_tokens}) + the longest generation "
                                f"({longest_generation_tokens(config)}): {need}; raise it or lower those")
    for role in ("small", "large"):
        parts = longest_prompt_tokens(config, role)
        need = sum(parts.values())
        if config.limits.max_prompt_tokens < need:
            problems.append(
                f"limits.max_prompt_tokens ({config.limits.max_prompt_tokens}) is below the longest {role} prompt the "
                f"HTTP limits admit: {need} tokens = {config.http.max_images} images x "
                f"{visual_tokens(config.model(role).max_pixels)} ({role}.max_pixels {config.model(role).max_pixels}) "
                f"+ {parts['question']} (http.max_question_chars) + {parts['added']} (reasoning or excerpt) + "
                f"{parts['template']} (template); raise it or lower those")
    return problems


def format_validation_error(err: ValidationError) -> str:
    """One line per problem, with the offending key path and value, for operators."""
    lines = []
    for e in err.errors():
        loc = ".".join(str(p) for p in e["loc"]) or "<root>"
        if e["type"] == "extra_forbidden":
            lines.append(f"unknown key '{loc}'")
        else:
            lines.append(f"'{loc}': {e['msg']} (got {e.get('input')!r})")
    return "; ".join(lines)


def load_tandem_config(data: dict | None) -> TandemConfig:
    """Validate raw args into a TandemConfig, or raise ConfigError naming the bad keys."""
    try:
        return TandemConfig.model_validate(data or {})
    except ValidationError as err:
        raise ConfigError(f"invalid Tandem config: {format_validation_error(err)}") from None
