"""A tiny random-weight Qwen2-VL, built locally, for tests that need a vision-language judge.

The GenEval 2 Soft-TIFA tests need a real ``transformers`` vision-language model to ask yes/no questions
about an image and read the next-token logits. Downloading a real checkpoint is not an option in tests, so
:func:`save_tiny_vlm` builds one from scratch: a ``Qwen2VLForConditionalGeneration`` with a few thousand
weights' worth of layers (seeded, so deterministic), the real ``Qwen2VLProcessor`` and image processor, and a
small word-level tokenizer made with the ``tokenizers`` library (no download, no network). Its answers are
meaningless; what the tests get is the real loading path, chat template, image-token expansion and logits.

The folder it writes loads with ``AutoProcessor.from_pretrained(folder, local_files_only=True)`` and
``AutoModelForImageTextToText.from_pretrained(folder, local_files_only=True)``.
"""

from __future__ import annotations

import pathlib

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    PreTrainedTokenizerFast,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
    Qwen2VLImageProcessorPil,
    Qwen2VLProcessor,
)

# Special tokens of the real Qwen2-VL tokenizer, in its order (ids 0.. here, not 151643..).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
UNK_TOKEN = "<unk>"

# Qwen2-VL-Instruct's chat template, verbatim.
CHAT_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}"
    "{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}"
    "{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
COLORS = ["red", "orange", "yellow", "green", "blue", "purple", "pink", "brown", "black", "white", "gray", "grey"]
# Words of the chat template, of typical yes/no questions, and a few GenEval-style objects and relations.
WORDS = [
    "yes", "no", "true", "false", "system", "user", "assistant", "you", "are", "a", "an", "the", "helpful",
    "is", "there", "in", "on", "of", "and", "or", "to", "this", "that", "it", "image", "picture", "photo",
    "video", "answer", "word", "only", "question", "does", "do", "contain", "show", "how", "many", "what",
    "color", "shape", "object", "objects", "circle", "square", "triangle", "left", "right", "above", "below",
    "next", "near", "with", "cat", "dog", "car", "person", "bird", "apple", "banana", "cup", "chair", "table",
    "ball", "box", "bottle", "book", "clock", "tree",
]  # fmt: skip
PUNCTUATION = list(".,?!:;'\"()-/")

# Pre-tokenization: a word keeps one leading space (" yes" is its own token, as in GPT-2/Qwen), digits split
# one by one, other characters stand alone, and whitespace other than such a space is a token of its own.
SPLIT_PATTERN = r" ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]|\s"


def _vocabulary() -> list[str]:
    words: list[str] = []
    for word in [*WORDS, *NUMBER_WORDS, *COLORS]:
        words += [word, word.capitalize(), word.upper()]
    pieces = [*words, *(str(d) for d in range(10)), *PUNCTUATION]
    pieces += [" " + p for p in pieces]
    vocab = [*SPECIAL_TOKENS, UNK_TOKEN, "\n", " ", "\t"]
    for piece in pieces:
        if piece not in vocab:
            vocab.append(piece)
    return vocab


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A small word-level tokenizer with Qwen2-VL's special tokens and chat template."""
    vocab = {piece: i for i, piece in enumerate(_vocabulary())}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK_TOKEN,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=4096,
    )
    # Special tokens must match as whole strings before pre-tokenization.
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIAL_TOKENS[1:]})
    return tokenizer


def build_image_processor() -> Qwen2VLImageProcessorPil:
    """Qwen2-VL's image processor, with 8-pixel patches and a small pixel budget.

    A 32x32 image stays 32x32: 4x4 patches, merged 2x2 into 4 image tokens. Larger images shrink to at
    most 64x64 pixels (16 image tokens).
    """
    return Qwen2VLImageProcessorPil(
        patch_size=8, temporal_patch_size=2, merge_size=2, min_pixels=16 * 16, max_pixels=64 * 64
    )


def build_config(tokenizer: PreTrainedTokenizerFast) -> Qwen2VLConfig:
    ids = tokenizer.convert_tokens_to_ids
    text_config = {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 4096,
        # head_dim 16 -> 8 rotary frequencies, split over (time, height, width).
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
        "bos_token_id": ids("<|endoftext|>"),
        "eos_token_id": ids("<|im_end|>"),
        "pad_token_id": ids("<|endoftext|>"),
    }
    vision_config = {
        "depth": 2,
        "embed_dim": 32,
        "hidden_size": 64,  # output of the patch merger = text hidden size
        "mlp_ratio": 2,
        "num_heads": 2,
        "in_channels": 3,
        "patch_size": 8,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    }
    return Qwen2VLConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_id=ids("<|image_pad|>"),
        video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"),
        vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False,
    )


def save_tiny_vlm(folder: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Write a tiny random Qwen2-VL model and its processor into ``folder``; return ``folder``.

    The same ``seed`` gives the same weights. Nothing is downloaded.
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    processor = Qwen2VLProcessor(
        image_processor=build_image_processor(), tokenizer=tokenizer, chat_template=CHAT_TEMPLATE
    )
    config = build_config(tokenizer)
    generator_state = torch.random.get_rng_state()
    try:
        torch.manual_seed(seed)
        model = Qwen2VLForConditionalGeneration(config).eval()
    finally:
        torch.random.set_rng_state(generator_state)
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
