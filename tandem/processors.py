"""Loading a Qwen3-VL processor where torchvision is missing (CPU machines here).

Qwen3VLProcessor insists on a video processor, which needs torchvision. Tandem answers images only,
so it ships an image-only subclass, registered with AutoProcessor so checkpoints saved with it load
through `AutoProcessor.from_pretrained` like any other.
"""

from __future__ import annotations

from transformers import AutoProcessor, Qwen3VLConfig, Qwen3VLProcessor


class TandemQwen3VLProcessor(Qwen3VLProcessor):
    """Qwen3VLProcessor without the video processor: same tokenization and image placeholders."""

    def __init__(self, image_processor=None, tokenizer=None, chat_template=None, **kwargs):
        # The parent passes (image, tokenizer, video); ProcessorMixin keeps as many as this class's
        # signature names, so the missing video processor is dropped instead of required.
        super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)


AutoProcessor.register(Qwen3VLConfig, TandemQwen3VLProcessor, exist_ok=True)


def load_processor(path: str, *, trust_remote_code: bool = False):
    """The checkpoint's processor; an image-only Qwen3-VL one when its video processor can't load.

    Raises when what loads has no image processor, so a VLM never silently runs on a bare tokenizer.
    """
    try:
        processor = AutoProcessor.from_pretrained(path, trust_remote_code=trust_remote_code)
    except ImportError as err:
        if "torchvision" not in str(err).lower():
            raise
        processor = TandemQwen3VLProcessor.from_pretrained(path)
    if getattr(processor, "image_processor", None) is None:
        raise TypeError(f"{path}: processor {type(processor).__name__} has no image processor")
    return processor
