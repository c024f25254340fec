"""`tandem validate-config`: a broken serve config must fail here, with the key named, not on the
cluster after minutes of start-up."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(path):
    return subprocess.run([sys.executable, "-m", "tandem.cli", "validate-config", str(path)],
                          capture_output=True, text=True)


def test_shipped_config_is_valid():
    out = run(ROOT / "serve_config.yaml")
    assert out.returncode == 0, out.stderr


def test_unknown_arg_and_unknown_deployment_are_named(tmp_path):
    text = (ROOT / "serve_config.yaml").read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("budget_tokens:", "budget_tokenz:").replace("name: LargeAnswerer", "name: Large"))
    out = run(bad)
    assert out.returncode != 0
    assert "unknown key 'selector.budget_tokenz'" in out.stderr and "unknown deployment 'Large'" in out.stderr


def run_edited(tmp_path, config: str, old: str, new: str):
    """validate-config on a shipped config with one edit."""
    text = (ROOT / config).read_text()
    assert old in text
    edited = tmp_path / f"edited-{config}"
    edited.write_text(text.replace(old, new))
    return run(edited)


def test_an_admission_limit_the_router_never_reaches_is_refused(tmp_path):
    assert "max_ongoing_requests: 64" in (ROOT / "serve_config.yaml").read_text()
    out = run_edited(tmp_path, "serve_config.yaml", "max_in_flight: 24", "max_in_flight: 64")
    assert out.returncode != 0
    assert "Router max_ongoing_requests (64) must be above http.max_in_flight (64)" in out.stderr
    ok = run_edited(tmp_path, "serve_config.yaml", "max_in_flight: 24", "max_in_flight: 63")
    # (63 admitted requests overflow the model queues, a separate check: the Router's bound holds.)
    assert "Router max_ongoing_requests" not in ok.stderr and "max_queued_requests" in ok.stderr


def test_deployment_names_match_what_the_builder_binds():
    from tandem.config import DEPLOYMENT_NAMES
    import deployments.app as app
    assert set(app._DEFAULT_OPTIONS) == set(DEPLOYMENT_NAMES)


def test_gpu_config_is_valid_with_its_limits_consistent():
    out = run(ROOT / "serve_config.gpu.yaml")
    assert out.returncode == 0, out.stderr


def test_prompt_limit_below_what_the_http_limits_admit_fails_with_the_arithmetic(tmp_path):
    assert "max_pixels: 262144" in (ROOT / "serve_config.gpu.yaml").read_text()
    # Four 512 x 512 images (4 x 258 tokens), the question, a reasoning and the template: 5,120.
    out = run_edited(tmp_path, "serve_config.gpu.yaml", "max_prompt_tokens: 8192", "max_prompt_tokens: 5000")
    assert out.returncode != 0
    assert "limits.max_prompt_tokens (5000) is below the longest large prompt the HTTP limits admit: 5120" in out.stderr
    assert "4 images x 258 (large.max_pixels 262144) + 3000 (http.max_question_chars) + 1024" in out.stderr
    assert run_edited(tmp_path, "serve_config.gpu.yaml", "max_prompt_tokens: 8192", "max_prompt_tokens: 5120").returncode == 0


def test_default_config_keeps_its_own_invariants():
    from tandem.config import TandemConfig, limit_problems, longest_prompt_tokens

    config = TandemConfig()
    assert limit_problems(config) == []
    # and the check is not vacuous: one more image's worth of question text breaks it
    parts = longest_prompt_tokens(config, "small")
    over = config.limits.max_prompt_tokens - sum(parts.values()) + 1
    bigger = config.model_copy(update={"http": config.http.model_copy(
        update={"max_question_chars": config.http.max_question_chars + over})})
    assert limit_problems(bigger) and "small prompt" in limit_problems(bigger)[0]


def test_vllm_cpu_config_is_valid_and_its_engine_limits_are_checked(tmp_path):
    assert run(ROOT / "serve_config.vllm-cpu.yaml").returncode == 0  # without vLLM installed
    text = (ROOT / "serve_config.vllm-cpu.yaml").read_text()
    assert text.count("max_model_len: 8192") == 2 and "kind: budget" in text
    bad = tmp_path / "bad.yaml"
    bad.write_text(text.replace("max_model_len: 8192", "max_model_len: 4300", 1).replace("kind: budget", "kind: attention"))
    out = run(bad)
    assert out.returncode != 0
    # 4096 prompt tokens (the default limit) + the longest generation (max_request_tokens 256)
    assert "small.vllm.max_model_len (4300) is below limits.max_prompt_tokens (4096) + the longest generation (256): 4352" in out.stderr
    assert "large.vllm" not in out.stderr
    assert "selector.kind 'attention' needs the small model's attention weights" in out.stderr


def test_a_model_queue_that_cannot_hold_what_the_router_admits_is_refused(tmp_path):
    """Each admitted request encodes once per model role, both at once: the VisionEncoder's queue must
    hold 2 x max_in_flight calls, the generators' one per request (two on the small model when its
    reasoning is speculative), or a model deployment sheds requests the Router already admitted."""
    vision = ("max_ongoing_requests: 48\n        max_queued_requests: 64\n        backpressure_config: {retry_after_s: 2}\n"
              "        ray_actor_options: {num_cpus: 0}\n        user_config: {max_batch_size: 8, batch_wait_timeout_s: 0.005")
    out = run_edited(tmp_path, "serve_config.yaml", vision, vision.replace("max_queued_requests: 64", "max_queued_requests: 47"))
    assert out.returncode != 0
    assert ("VisionEncoder max_queued_requests (47) must hold the calls the Router's admitted requests can have "
            "waiting on it at once: 2 per request x http.max_in_flight (24) = 48") in out.stderr
    assert run_edited(tmp_path, "serve_config.yaml", vision,
                      vision.replace("max_queued_requests: 64", "max_queued_requests: 48")).returncode == 0
    # The small model's queue (32) holds one call per admitted request, not two: speculative reasoning breaks it.
    out = run_edited(tmp_path, "serve_config.yaml", "speculative: false", "speculative: true")
    assert out.returncode != 0
    assert "SmallReasoner max_queued_requests (32) must hold" in out.stderr and "2 per request" in out.stderr
    assert "LargeAnswerer" not in out.stderr
    # Without an admission limit there is nothing the Router promised to hold (the GPU configs).
    unlimited = tmp_path / "unlimited.yaml"
    unlimited.write_text((ROOT / "serve_config.yaml").read_text().replace("max_in_flight: 24", "max_in_flight: null")
                         .replace(vision, vision.replace("max_queued_requests: 64", "max_queued_requests: 32")))
    assert run(unlimited).returncode == 0


def test_a_request_router_class_that_does_not_import_is_refused(tmp_path):
    """The model pools route a request's stages to one replica through a RequestRouter class that Serve
    imports at deploy time; a wrong path must fail here, not in a replica's start."""
    wrong_class = run_edited(tmp_path, "serve_config.yaml", "affinity_router:StageAffinityRouter",
                             "affinity_router:NoSuchRouter")
    assert wrong_class.returncode == 2 and "'NoSuchRouter' is not defined" in wrong_class.stderr
    wrong_module = run_edited(tmp_path, "serve_config.yaml", "deployments.affinity_router:", "deployments.nowhere:")
    assert wrong_module.returncode == 2 and "'deployments.nowhere' not found" in wrong_module.stderr
