"""Qwen2.5-VL's processor for the edit pipelines, without its video half.

``QwenImageEditPipeline`` and ``QwenImageEditPlusPipeline`` read their sources through a ``Qwen2VLProcessor``
(the image processor cuts each image into vision patches, the tokenizer expands each image placeholder into that
many vision tokens). transformers 5 builds that processor with a video processor too, and its video processors
need torchvision: without it the processor cannot be made or loaded at all, although the edit pipelines never
give it a video. :class:`ImageQwen2VLProcessor` is ``Qwen2VLProcessor`` with only its image processor and
tokenizer (every call the pipelines make runs Qwen2VLProcessor's own code), and :func:`load_processor` loads one
from a saved pipeline's ``processor`` folder, which the edit base hands to ``from_pretrained``. transformers is
imported when the class is first asked for (:func:`processor_class`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

_CLASS: Any = None


def processor_class() -> Any:
    """``ImageQwen2VLProcessor``: ``Qwen2VLProcessor`` with an image processor and a tokenizer, no video processor
    (made on first use, so that importing this module imports no model library)."""
    global _CLASS
    if _CLASS is None:
        from transformers import Qwen2VLProcessor

        class ImageQwen2VLProcessor(Qwen2VLProcessor):  # type: ignore[misc]
            """``Qwen2VLProcessor`` with an image processor and a tokenizer, no video processor."""

            @classmethod
            def get_attributes(cls) -> list[str]:
                return ["image_processor", "tokenizer"]

            def __init__(self, image_processor: Any = None, tokenizer: Any = None, chat_template: Any = None,
                         **kwargs: Any) -> None:
                super().__init__(image_processor, tokenizer, None, chat_template=chat_template, **kwargs)

        _CLASS = ImageQwen2VLProcessor
    return _CLASS


def load_processor(path: str) -> Any:
    """The ``processor`` of the saved pipeline at ``path`` (a local folder, or a hub id: the local cache only when
    ``HF_HUB_OFFLINE=1``) as an image-only Qwen2.5-VL processor."""
    local = Path(path).exists()
    return processor_class().from_pretrained(path, subfolder="processor", local_files_only=local)
