"""The transformers engine: one checkpoint loaded with `from_pretrained`, serving its vision tower,
its decoder, or both.

Generation takes precomputed image features (`mm_encoder_outputs`) instead of pixels, so the vision
tower never runs twice for one image; a batch is left-padded and generated in one call per group of
equal sampling parameters. Returns text, token ids, per-token log-probabilities and timing.
"""

from __future__ import annotations

import itertools
import time

import torch
from transformers import AutoModelForImageTextToText, LogitsProcessor, LogitsProcessorList
from transformers.models.qwen3_vl.modeling_qwen3_vl import BaseModelOutputWithDeepstackFeatures

from tandem.checkpoints import resolve_model_ref
from tandem.config import ModelConfig
from tandem.errors import BadRequest
from tandem.images import decode_image
from tandem.processors import load_processor
from tandem.prompts import IMAGE_PAD, IMAGE_PLACEHOLDER
from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures, SamplingParams

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


class _StepClock(LogitsProcessor):
    """Records when each decoding step's logits arrive: the first one marks the end of prefill."""

    def __init__(self):
        self.times: list[float] = []

    def __call__(self, input_ids, scores):
        self.times.append(time.perf_counter())
        return scores


class TransformersEngine:
    def __init__(self, config: ModelConfig, *, name: str, vision: bool = True, language: bool = True,
                 max_prompt_tokens: int = 4096):
        self.config, self.name, self.max_prompt_tokens = config, name, max_prompt_tokens
        path = resolve_model_ref(config.model)
        self.processor = load_processor(path, trust_remote_code=config.trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        # device "auto": accelerate spreads the layers over every GPU this replica was given.
        placement = {"device_map": "auto"} if config.device == "auto" else {}
        model = AutoModelForImageTextToText.from_pretrained(
            path, dtype=_DTYPES[config.dtype], trust_remote_code=config.trust_remote_code, **placement)
        # A server that only encodes drops the decoder, and one that only generates drops the tower.
        if not language:
            model.model.language_model, model.lm_head = None, None
        if not vision:
            model.model.visual = None
        self.model = (model if placement else model.to(config.device)).eval()
        self.device = self.model.device if placement else torch.device(config.device)
        self.image_token_id = self.processor.image_token_id
        self.merge_size = self.processor.image_processor.merge_size
        self.stop_token_ids = self._stop_token_ids()

    def _stop_token_ids(self) -> set[int]:
        eos = self.model.generation_config.eos_token_id
        ids = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        ids.add(self.tokenizer.pad_token_id)
        return {i for i in ids if i is not None}

    def warm_up(self) -> None:
        """Run each loaded part once, so the first client request does not pay lazy initialisation."""
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (64, 64), (127, 127, 127)).save(buf, "PNG")
        if self.model.model.visual is not None:
            feats = self.encode_images([buf.getvalue()])
            if self.model.model.language_model is not None:
                self.generate([GenerationRequest(IMAGE_PLACEHOLDER + "hi", feats, SamplingParams(max_tokens=2))])
        elif self.model.model.language_model is not None:
            self.generate([GenerationRequest("hi", [], SamplingParams(max_tokens=2))])

    # --- vision ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def encode_images(self, images: list[bytes]) -> list[ImageFeatures]:
        if not images:
            return []
        pil = [decode_image(b) for b in images]
        size = {"shortest_edge": self.config.min_pixels, "longest_edge": self.config.max_pixels}
        inputs = self.processor.image_processor(images=pil, size=size, return_tensors="pt")
        grid = inputs["image_grid_thw"]
        out = self.model.model.get_image_features(inputs["pixel_values"].to(self.device), grid.to(self.device),
                                                  return_dict=True)
        return [ImageFeatures(model=self.name, embeds=out.pooler_output[i].cpu(),
                              deepstack=[layer[i].cpu() for layer in out.deepstack_features],
                              grid_thw=tuple(int(x) for x in grid[i]), merge_size=self.merge_size)
                for i in range(len(pil))]

    # --- generation -----------------------------------------------------------------------------
    def generate(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        outputs: list[GenerationOutput | None] = [None] * len(batch)
        key = lambda i: (batch[i].sampling.temperature, batch[i].sampling.stop)  # noqa: E731
        for _, group in itertools.groupby(sorted(range(len(batch)), key=key), key=key):
            idx = list(group)
            for i, out in zip(idx, self._generate_group([batch[i] for i in idx])):
                outputs[i] = out
        return outputs  # type: ignore[return-value]

    def validate(self, request: GenerationRequest) -> None:
        n = len(self.tokenizer(self._expand_placeholders(request))["input_ids"])
        if n > self.max_prompt_tokens:
            raise BadRequest(f"prompt is {n} tokens for model '{self.name}'; the limit is {self.max_prompt_tokens}",
                             param="messages")

    def _expand_placeholders(self, request: GenerationRequest) -> str:
        parts = request.prompt.split(IMAGE_PAD)
        if len(parts) - 1 != len(request.images):
            raise BadRequest(f"prompt has {len(parts) - 1} image placeholders for {len(request.images)} images")
        for feat in request.images:
            if feat.model != self.name:
                raise BadRequest(f"features from model '{feat.model}' sent to model '{self.name}'")
        pads = [IMAGE_PAD * f.num_tokens for f in request.images] + [""]
        return "".join(p + pad for p, pad in zip(parts, pads))

    def _model_inputs(self, batch: list[GenerationRequest]) -> dict:
        texts = [self._expand_placeholders(r) for r in batch]
        enc = self.tokenizer(texts, return_tensors="pt", padding=True, padding_side="left")
        inputs = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"],
                  "mm_token_type_ids": (enc["input_ids"] == self.image_token_id).long()}
        feats = [f for r in batch for f in r.images]
        if feats:
            inputs["image_grid_thw"] = torch.tensor([f.grid_thw for f in feats], dtype=torch.long)
            dtype = self.model.dtype
            inputs["mm_encoder_outputs"] = {"image": BaseModelOutputWithDeepstackFeatures(
                pooler_output=tuple(f.embeds.to(self.device, dtype) for f in feats),
                deepstack_features=[tuple(f.deepstack[k].to(self.device, dtype) for f in feats)
                                    for k in range(len(feats[0].deepstack))])}
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}

    @torch.inference_mode()
    def _generate_group(self, batch: list[GenerationRequest]) -> list[GenerationOutput]:
        sampling = batch[0].sampling
        inputs = self._model_inputs(batch)
        prompt_len = inputs["input_ids"].shape[1]
        clock = _StepClock()
        kwargs = dict(do_sample=sampling.temperature > 0)
        if sampling.temperature > 0:
            kwargs.update(temperature=sampling.temperature, top_k=0, top_p=1.0)
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.tokenizer)
        start = time.perf_counter()
        out = self.model.generate(**inputs, max_new_tokens=max(r.sampling.max_tokens for r in batch),
                                  output_logits=True, return_dict_in_generate=True,
                                  logits_processor=LogitsProcessorList([clock]), **kwargs)
        latency_ms = (time.perf_counter() - start) * 1000
        ttft_ms = ((clock.times[0] if clock.times else time.perf_counter()) - start) * 1000
        logprobs = torch.stack(out.logits, dim=1).float().log_softmax(-1) if out.logits else None
        outputs = [self._output(r, i, out.sequences[i, prompt_len:], logprobs, inputs, latency_ms, ttft_ms, len(batch))
                   for i, r in enumerate(batch)]
        for request, output in zip(batch, outputs):
            if request.attend_to is not None:
                output.span_token_texts, output.span_scores = self._attention_over(request, output.text)
        return outputs

    def _attention_over(self, request: GenerationRequest, answer: str) -> tuple[list[str], list[float]]:
        """Tokens of `request.attend_to` within the prompt, each with the attention the answer's tokens
        paid it (mean over layers, heads and answer positions). One eager forward over prompt+answer:
        it materialises every layer's attention, fine for a small reasoner, not for a 32B model."""
        prompt_text = self._expand_placeholders(request)
        start = prompt_text.rfind(request.attend_to)
        if start < 0 or not request.attend_to:
            return [], []
        end = start + len(request.attend_to)
        full = GenerationRequest(request.prompt + answer, request.images)
        text = self._expand_placeholders(full)
        offsets = self.tokenizer(text, return_offsets_mapping=True)["offset_mapping"]
        n_prompt = len(self.tokenizer(prompt_text)["input_ids"])
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")  # sdpa does not return attention weights
        try:
            out = self.model(**self._model_inputs([full]), output_attentions=True, logits_to_keep=1)
        finally:
            self.model.set_attn_implementation(previous)
        attn = torch.stack([a[0] for a in out.attentions]).float()  # layers, heads, query, key
        queries = list(range(n_prompt, attn.shape[2])) or [attn.shape[2] - 1]
        scores = attn[:, :, queries, :].mean(dim=(0, 1, 2))
        keep = [j for j, (a, b) in enumerate(offsets) if b > a and a >= start and b <= end]
        return [text[offsets[j][0]:offsets[j][1]] for j in keep], [float(scores[j]) for j in keep]

    def _output(self, request, i, new_tokens, logprobs, inputs, latency_ms, ttft_ms, batch_size) -> GenerationOutput:
        ids = new_tokens.tolist()[: request.sampling.max_tokens]
        finish = "length"
        for n, t in enumerate(ids):
            if t in self.stop_token_ids:
                ids, finish = ids[:n], "stop"
                break
        texts = [self.tokenizer.decode([t], skip_special_tokens=True) for t in ids]
        text = "".join(texts)
        for stop in request.sampling.stop:
            if stop in text:
                ids, texts, text, finish = self._cut_at(ids, texts, text.index(stop)) + ("stop",)
        lps = [float(logprobs[i, n, t]) for n, t in enumerate(ids)] if logprobs is not None else []
        return GenerationOutput(text=text, token_ids=ids, token_texts=texts, logprobs=lps,
                                prompt_tokens=int(inputs["attention_mask"][i].sum()), completion_tokens=len(ids),
                                finish_reason=finish, latency_ms=latency_ms, ttft_ms=ttft_ms, batch_size=batch_size)

    @staticmethod
    def _cut_at(ids: list[int], texts: list[str], char_pos: int):
        """Keep the tokens that end before char_pos (the start of a stop string)."""
        kept, length = 0, 0
        while kept < len(texts) and length + len(texts[kept]) <= char_pos:
            length += len(texts[kept])
            kept += 1
        return ids[:kept], texts[:kept], "".join(texts[:kept])
