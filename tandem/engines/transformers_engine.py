"""The transformers engine: one checkpoint loaded with `from_pretrained`, serving its vision tower,
its decoder, or both.

Generation takes precomputed image features instead of pixels, so the vision tower never runs twice
for one image: they go to the Qwen3-VL decoder through its own arguments (`inputs_embeds` with the
features in the placeholders' places, `visual_pos_masks`, `deepstack_visual_embeds`) — what the model's
forward does with pixels — so any transformers 5 takes them (vLLM's builds pin one below 5.21; Tandem's
own venv has 5.24). It runs step by step under a `DecodeLoop` (engines/decoding.py): this module
prefills left-padded prompts, joins batches, drops rows and decodes one step over a DynamicCache;
the loop decides who joins, who leaves and what streams.
"""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AutoModelForImageTextToText, DynamicCache

from tandem.checkpoints import resolve_model_ref
from tandem.config import ModelConfig
from tandem.hub import local_checkpoint
from tandem.engines.generation import GREEDY_BELOW, expand_placeholders, model_sampling, stop_token_ids
from tandem.engines.decoding import DecodeLoop, LoopEngine, Prepared
from tandem.engines.prefix_cache import PrefixEntry, PrefixStore
from tandem.engines.protocol import VisionEngine
from tandem.errors import BadRequest
from tandem.images import decode_image
from tandem.processors import load_processor
from tandem.prompts import IMAGE_PLACEHOLDER
from tandem.schemas import GenerationOutput, GenerationRequest, ImageFeatures, SamplingParams

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": "auto"}


def _sample(logits: torch.Tensor, s: SamplingParams) -> int:
    """One token from a row's logits at the row's temperature, within its top_k and top_p; greedy when
    the temperature is under `GREEDY_BELOW` or the probabilities come out non-finite (never NaN into
    `multinomial`)."""
    if s.temperature < GREEDY_BELOW:
        return int(logits.argmax())
    scores = logits / s.temperature
    if 0 < s.top_k < scores.numel():
        kth = torch.topk(scores, s.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, -1)
    if s.top_p < 1.0:
        ordered, order = probs.sort(descending=True)
        outside = ordered.cumsum(-1) - ordered > s.top_p  # keep the smallest head reaching top_p
        probs = probs.scatter(0, order, ordered.masked_fill(outside, 0.0))
    if not bool(torch.isfinite(probs).all()) or float(probs.sum()) <= 0:
        return int(logits.argmax())
    return int(torch.multinomial(probs, 1))


def _drop_parts(model, *, vision: bool, language: bool) -> None:
    """Remove what a deployment never runs: the vision tower, or the decoder and its head."""
    if not vision:
        model.model.visual = None
    if not language:
        model.model.language_model, model.lm_head = None, None
        model.all_tied_weights_keys = {}  # the only tie, lm_head to the embeddings, went with them


def _partial_class(cls, *, vision: bool, language: bool):
    """`cls` with the parts a deployment never runs removed as it is built — inside `from_pretrained`,
    on the meta device, before any weight is read — so their tensors are never loaded: they count as
    unexpected keys of the checkpoint and stay on disk."""
    class Partial(cls):
        def __init__(self, config, *args, **kwargs):
            super().__init__(config, *args, **kwargs)
            _drop_parts(self, vision=vision, language=language)

    Partial.__name__ = Partial.__qualname__ = cls.__name__
    return Partial


def device_placement(device: str) -> dict:
    """How from_pretrained places the weights: "auto" spreads layers over every GPU the replica was
    given (accelerate); a GPU gets each tensor as it is read, never a whole copy in host memory."""
    return {} if device == "cpu" else {"device_map": device}


def load_parts(path: str, config: ModelConfig, *, vision: bool = True, language: bool = True, **placement):
    """The checkpoint's vision tower, its decoder, or both, read straight from its files: a vision
    encoder never holds the 8B decoder in host memory, a model server never the tower (the peak of a
    part's load stays near that part's own bytes: benchmarks/load_memory.py measures it)."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING
    from transformers.utils import logging as hf_logging

    kwargs = dict(dtype=_DTYPES[config.dtype], trust_remote_code=config.trust_remote_code, **placement)
    model_config = AutoConfig.from_pretrained(path, trust_remote_code=config.trust_remote_code)
    cls = MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING.get(type(model_config), None)
    if (vision and language) or cls is None:  # both parts, or an architecture we cannot split (remote code)
        model = AutoModelForImageTextToText.from_pretrained(path, config=model_config, **kwargs)
        _drop_parts(model, vision=vision, language=language)
        return model
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the parts left on disk are reported as unexpected keys: by design
    try:
        return _partial_class(cls, vision=vision, language=language).from_pretrained(path, config=model_config,
                                                                                     **kwargs)
    finally:
        hf_logging.set_verbosity(verbosity)


@dataclass
class _Batch:
    """The running batch: its KV cache, attention mask, each row's next rotary position, and each
    row's scores for its next token."""

    cache: Any
    mask: torch.Tensor
    next_pos: torch.Tensor
    logits: torch.Tensor


def _pad_left(x: torch.Tensor, width: int, dim: int) -> torch.Tensor:
    missing = width - x.shape[dim]
    if missing <= 0:
        return x
    shape = list(x.shape)
    shape[dim] = missing
    return torch.cat([x.new_zeros(shape), x], dim)


class TransformersEngine(LoopEngine, VisionEngine):
    def __init__(self, config: ModelConfig, *, name: str, vision: bool = True, language: bool = True,
                 max_prompt_tokens: int = 4096):
        self.config, self.name, self.max_prompt_tokens = config, name, max_prompt_tokens
        part = "all" if vision and language else "vision" if vision else "decoder"
        path = local_checkpoint(resolve_model_ref(config.model), config.revision, part)
        self.processor = load_processor(path, trust_remote_code=config.trust_remote_code)
        self.tokenizer = self.processor.tokenizer
        model = load_parts(path, config, vision=vision, language=language, **device_placement(config.device))
        self.model = model.eval()  # already on its device: from_pretrained placed it
        self.device = self.model.device
        self.image_token_id = self.processor.image_token_id
        if language:  # the decoder's KV-cache argument: `cache` in transformers 5.2x, `past_key_values` before
            params = inspect.signature(model.model.language_model.forward).parameters
            self._cache_arg = "cache" if "cache" in params else "past_key_values"
        self.merge_size = self.processor.image_processor.merge_size
        self.stop_token_ids = stop_token_ids(self.model.generation_config, self.tokenizer)
        self.reasoning_sampling = model_sampling(self.model.generation_config)
        self.prefix = PrefixStore()  # off until `configure` gives it bytes
        self.loop = DecodeLoop(self, name=f"decode-{name}")

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

    def check_device(self) -> None:
        """A one-element op on the model's device, waited for: raises where the device is lost (a
        broken CUDA context fails every later call, so the replica must be replaced)."""
        probe = torch.ones(1, device=self.device) + 1
        if probe.item() != 2:
            raise RuntimeError(f"{self.name}: device {self.device} computed 1 + 1 = {probe.item()}")

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

    # --- generation: a DecodeLoop drives the steps below --------------------------------------
    def prepare(self, request: GenerationRequest) -> Prepared:
        """The prompt's token ids, checked against the limit (runs on the loop's thread); a request
        that asks for the model's own sampling gets it here."""
        if request.sampling.model_defaults:
            request.sampling = dataclasses.replace(request.sampling, model_defaults=False, **self.reasoning_sampling)
        ids = self.tokenizer(self._expand_placeholders(request))["input_ids"]
        if len(ids) > self.max_prompt_tokens:
            raise BadRequest(f"prompt is {len(ids)} tokens for model '{self.name}'; the limit is "
                             f"{self.max_prompt_tokens}", param="messages")
        entry, reused = self.prefix.match(request.request_id, ids)
        return Prepared(len(ids), (ids, entry), cached_tokens=reused)

    def _expand_placeholders(self, request: GenerationRequest) -> str:
        return expand_placeholders(request, self.name)

    def _decode(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache,
                feats: list[ImageFeatures] = (), **kwargs):
        """The decoder over `ids`: each image placeholder's embedding replaced by its image's features,
        the DeepStack levels added at those positions by the decoder's first layers."""
        lm = self.model.model.language_model
        embeds = lm.get_input_embeddings()(ids)
        extra = {}
        if feats:
            image = ids == self.image_token_id
            flat = torch.cat([f.embeds.to(self.device, embeds.dtype) for f in feats])
            if int(image.sum()) != flat.shape[0]:
                raise ValueError(f"{int(image.sum())} image placeholder tokens for {flat.shape[0]} feature rows")
            embeds = embeds.masked_scatter(image[..., None].expand_as(embeds), flat)
            extra = {"visual_pos_masks": image,
                     "deepstack_visual_embeds": [torch.cat([f.deepstack[k].to(self.device, embeds.dtype) for f in feats])
                                                 for k in range(len(feats[0].deepstack))]}
        if cache is not None:
            extra[self._cache_arg] = cache
        return lm(input_ids=None, inputs_embeds=embeds, attention_mask=mask, position_ids=positions,
                  use_cache=cache is not None, **extra, **kwargs)

    def _positions(self, ids: torch.Tensor, mask: torch.Tensor, feats: list[ImageFeatures]) -> torch.Tensor:
        """3D rotary positions of left-padded rows (text only: the same index on all three axes)."""
        if not feats:
            return (mask.cumsum(-1) - 1).clamp(min=0)[None].expand(3, -1, -1)
        grid = torch.tensor([f.grid_thw for f in feats], dtype=torch.long, device=self.device)
        types = (ids == self.image_token_id).long()
        positions, _ = self.model.model.get_rope_index(ids, mm_token_type_ids=types, attention_mask=mask,
                                                       image_grid_thw=grid)
        return positions

    def _logits(self, out) -> torch.Tensor:
        return self.model.lm_head(out.last_hidden_state[:, -1]).float()

    @torch.inference_mode()
    def prefill(self, requests: list[GenerationRequest], prepared: list[Prepared]) -> _Batch:
        """The rows' prompts through the model: those without a reusable head together (left-padded),
        each with one from the KV of its head (`_prefill_on_head`), the batch in the rows' order.
        Every row's prompt KV is kept for its request's next stage (`self.prefix`)."""
        fresh = [i for i, p in enumerate(prepared) if p.data[1] is None]
        parts = [self._prefill_fresh([requests[i] for i in fresh], [prepared[i] for i in fresh])] if fresh else []
        reused = [i for i, p in enumerate(prepared) if p.data[1] is not None]
        parts += [self._prefill_on_head(requests[i], prepared[i]) for i in reused]
        state = parts[0]
        for part in parts[1:]:
            state = self.join(state, part)
        order = fresh + reused
        if order != sorted(order):
            state = self.keep(state, sorted(range(len(order)), key=order.__getitem__))
        return state

    def _prefill_fresh(self, requests: list[GenerationRequest], prepared: list[Prepared]) -> _Batch:
        """Left-padded prompts through the model once; 3D rotary positions computed here, per row, so
        rows prefilled apart can decode together (the model's own `rope_deltas` is one per call)."""
        rows = [p.data[0] for p in prepared]
        width = max(map(len, rows))
        pad = self.tokenizer.pad_token_id
        ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=self.device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=self.device)
        feats = [f for r in requests for f in r.images]
        positions = self._positions(ids, mask, feats)
        cache = DynamicCache(config=self.model.config.get_text_config())
        out = self._decode(ids, mask, positions, cache, feats)
        for i, (request, row) in enumerate(zip(requests, rows)):
            self._keep_head(request, row, cache, i, positions[:, i, width - len(row):])
        return _Batch(cache=cache, mask=mask, next_pos=positions[:, :, -1].max(0).values + 1, logits=self._logits(out))

    def _prefill_on_head(self, request: GenerationRequest, prepared: Prepared) -> _Batch:
        """One row whose first `cached_tokens` tokens' KV is its request's kept head: only the suffix
        is computed, its rotary positions continuing from the head's (the suffix is text: the head
        covers every image token)."""
        ids, entry = prepared.data
        n = prepared.cached_tokens
        cache = DynamicCache(config=self.model.config.get_text_config())
        for layer, (k, v) in enumerate(zip(entry.keys, entry.values)):
            cache.update(k[:, :, :n].to(self.device), v[:, :, :n].to(self.device), layer)
        start = int(entry.positions[:, :n].max()) + 1
        suffix = torch.arange(start, start + len(ids) - n, device=self.device)
        positions = suffix.view(1, 1, -1).expand(3, 1, -1)
        mask = torch.ones(1, len(ids), dtype=torch.long, device=self.device)
        out = self._decode(torch.tensor([ids[n:]], device=self.device), mask, positions, cache)
        self._keep_head(request, ids, cache, 0, torch.cat([entry.positions[:, :n].to(self.device), positions[:, 0]], 1))
        return _Batch(cache=cache, mask=mask, next_pos=suffix[-1:] + 1, logits=self._logits(out))

    def _keep_head(self, request: GenerationRequest, ids: list[int], cache, row: int, positions) -> None:
        """Keep a row's prompt KV (its padding stripped) for its request's next stage."""
        if not (request.request_id and self.prefix.max_bytes):
            return
        n = len(ids)
        images = [i for i, t in enumerate(ids) if t == self.image_token_id]
        self.prefix.put(request.request_id, PrefixEntry(
            ids=list(ids), keys=[layer.keys[row:row + 1, :, -n:].clone() for layer in cache.layers],
            values=[layer.values[row:row + 1, :, -n:].clone() for layer in cache.layers],
            positions=positions.clone(), images_end=images[-1] + 1 if images else 0))

    def join(self, a: _Batch, b: _Batch) -> _Batch:
        """One batch of both: the shorter one left-padded (keys, values and mask) to the longer."""
        width = max(a.mask.shape[1], b.mask.shape[1])
        for la, lb in zip(a.cache.layers, b.cache.layers):
            la.keys = torch.cat([_pad_left(la.keys, width, 2), _pad_left(lb.keys, width, 2)])
            la.values = torch.cat([_pad_left(la.values, width, 2), _pad_left(lb.values, width, 2)])
        return _Batch(cache=a.cache, mask=torch.cat([_pad_left(a.mask, width, 1), _pad_left(b.mask, width, 1)]),
                      next_pos=torch.cat([a.next_pos, b.next_pos]), logits=torch.cat([a.logits, b.logits]))

    def keep(self, state: _Batch, rows: list[int]) -> _Batch:
        """Only these rows, and no leading columns that are padding in all of them."""
        idx = torch.tensor(rows, device=self.device)
        mask = state.mask[idx]
        first = int(mask.any(0).long().argmax())
        for layer in state.cache.layers:
            layer.keys, layer.values = layer.keys[idx, :, first:], layer.values[idx, :, first:]
        return _Batch(cache=state.cache, mask=mask[:, first:], next_pos=state.next_pos[idx], logits=state.logits[idx])

    def choose(self, state: _Batch, sampling: list[SamplingParams]) -> list[tuple[int, float | None]]:
        """Each row's next token (greedy, or sampled at its temperature), and its log-probability only
        where the row asked for it: one logsumexp per such row, not a log-softmax over the vocabulary.
        A row whose sampling raises gets its exception in its place (the decode loop fails it alone)."""
        logits, chosen = state.logits, state.logits.argmax(-1).tolist()
        out: list = []
        for i, s in enumerate(sampling):
            try:
                token = _sample(logits[i], s) if s.temperature > 0 else chosen[i]
                lp = float(logits[i, token] - torch.logsumexp(logits[i], -1)) if s.logprobs else None
                out.append((token, lp))
            except Exception as err:  # this row's sampling fails alone; the batch goes on
                out.append(err)
        return out

    @torch.inference_mode()
    def advance(self, state: _Batch, token_ids: list[int]) -> None:
        ids = torch.tensor(token_ids, device=self.device)[:, None]
        state.mask = torch.cat([state.mask, state.mask.new_ones(len(token_ids), 1)], 1)
        positions = state.next_pos.view(1, -1, 1).expand(3, -1, -1)
        out = self._decode(ids, state.mask, positions, state.cache)
        state.logits, state.next_pos = self._logits(out), state.next_pos + 1

    def detokenize(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def finish(self, request: GenerationRequest, output: GenerationOutput) -> None:
        if request.attend_to is not None:
            output.span_token_texts, output.span_scores = self._attention_over(request, output.text)

    @torch.inference_mode()
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
        enc = self.tokenizer([text], return_tensors="pt")
        ids, mask = enc["input_ids"].to(self.device), enc["attention_mask"].to(self.device)
        previous = self.model.config._attn_implementation
        self.model.set_attn_implementation("eager")  # sdpa does not return attention weights
        try:
            out = self._decode(ids, mask, self._positions(ids, mask, full.images), None, full.images,
                               output_attentions=True)
        finally:
            self.model.set_attn_implementation(previous)
        attn = torch.stack([a[0] for a in out.attentions]).float()  # layers, heads, query, key
        queries = list(range(n_prompt, attn.shape[2])) or [attn.shape[2] - 1]
        scores = attn[:, :, queries, :].mean(dim=(0, 1, 2))
        keep = [j for j, (a, b) in enumerate(offsets) if b > a and a >= start and b <= end]
        return [text[offsets[j][0]:offsets[j][1]] for j in keep], [float(scores[j]) for j in keep]
