"""A tiny random-weight vision-language model, built locally: a stand-in judge for the GenEval 2 Soft-TIFA tests.

Soft-TIFA asks a vision-language model yes/no and counting questions about an image and reads the probabilities
of the first answer token. Tests cannot download a real judge, so :func:`save_tiny_vlm` builds one from scratch,
with nothing downloaded: a ``LlavaForConditionalGeneration`` (a 2-layer CLIP vision tower, a 2-layer Qwen2
language model, ~0.18M parameters, seeded so the weights are deterministic), the real ``LlavaProcessor`` with
CLIP's PIL image processor, and a small word-level tokenizer made with the ``tokenizers`` library that carries
Qwen2-VL's special tokens and chat template. Its answers are meaningless; what the tests get is the real loading
path (``AutoProcessor`` / ``AutoModelForImageTextToText`` with ``local_files_only=True``), chat template,
image-token expansion and vocabulary-sized logits.

Why LLaVA and not Qwen2-VL: in this transformers (5.x) ``Qwen2VLProcessor`` (like Qwen2.5-VL's and Qwen3-VL's)
always builds a video processor, and that needs torchvision, which the core test environment does not have; the
LLaVA processor has no video part and runs on PIL alone.
"""

from __future__ import annotations

import pathlib

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import (
    CLIPImageProcessorPil,
    CLIPVisionConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

# Special tokens of the real Qwen2-VL tokenizer, in its order (ids 0.. here, not 151643..). Images are
# <|vision_start|><|image_pad|><|vision_end|> as in Qwen2-VL; the processor repeats <|image_pad|> once per image token.
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
IMAGE_TOKEN = "<|image_pad|>"
IMAGE_SIDE = 32
PATCH = 8
IMAGE_TOKENS = (IMAGE_SIDE // PATCH) ** 2

# Qwen2-VL-Instruct's chat template, verbatim (ChatML, with a default system message).
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
    "yes", "no", "true", "false", "other", "system", "user", "assistant", "you", "are", "a", "an", "the", "helpful",
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
    # Special tokens match as whole strings before pre-tokenization (and are dropped by skip_special_tokens).
    backend.add_special_tokens([*SPECIAL_TOKENS, UNK_TOKEN])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        unk_token=UNK_TOKEN,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=1024,
        extra_special_tokens={"image_token": IMAGE_TOKEN},
    )
    return tokenizer


def build_image_processor() -> CLIPImageProcessorPil:
    """CLIP's image processor (as LLaVA-1.5 uses it) at 32x32: any image is resized and centre-cropped to 32x32."""
    return CLIPImageProcessorPil(
        size={"shortest_edge": IMAGE_SIDE}, crop_size={"height": IMAGE_SIDE, "width": IMAGE_SIDE}
    )


def build_config(tokenizer: PreTrainedTokenizerFast) -> LlavaConfig:
    """LLaVA: a 2-layer CLIP vision tower (8-pixel patches: 16 image tokens) and a 2-layer Qwen2 language model."""
    ids = tokenizer.convert_tokens_to_ids
    vision_config = CLIPVisionConfig(
        hidden_size=32,
        intermediate_size=64,
        projection_dim=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        image_size=IMAGE_SIDE,
        patch_size=PATCH,
    )
    text_config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=ids("<|endoftext|>"),
        eos_token_id=ids("<|im_end|>"),
        pad_token_id=ids("<|endoftext|>"),
        tie_word_embeddings=False,
    )
    return LlavaConfig(
        vision_config=vision_config,
        text_config=text_config,
        image_token_id=ids(IMAGE_TOKEN),
        image_seq_length=IMAGE_TOKENS,
        vision_feature_layer=-2,
        vision_feature_select_strategy="default",  # drop CLS: (32 / 8) ** 2 = 16 image tokens
        tie_word_embeddings=False,
    )


def save_tiny_vlm(folder: pathlib.Path, seed: int = 0) -> pathlib.Path:
    """Write a tiny random LLaVA model and its processor into ``folder``; return ``folder``.

    The same ``seed`` gives the same weights (the global torch RNG is left as it was). Nothing is downloaded.
    """
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    processor = LlavaProcessor(
        image_processor=build_image_processor(),
        tokenizer=tokenizer,
        patch_size=PATCH,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token, dropped again by the "default" strategy
        image_token=IMAGE_TOKEN,
        chat_template=CHAT_TEMPLATE,
    )
    config = build_config(tokenizer)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlavaForConditionalGeneration(config).eval()
    model.generation_config.pad_token_id = config.text_config.pad_token_id
    model.generation_config.eos_token_id = config.text_config.eos_token_id
    model.save_pretrained(folder)
    processor.save_pretrained(folder)
    return folder
