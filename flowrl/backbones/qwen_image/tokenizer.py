"""A word-level tokenizer shaped like Qwen2's for the tiny Qwen-Image pipeline (built locally, no download).

``QwenImagePipeline`` wraps every prompt in a chat template and, after the text encoder, drops the first
``prompt_template_encode_start_idx`` (34) hidden states: the system message and ``<|im_start|>user\\n``.
That index is a constant of the pipeline, tuned to Qwen2's byte-level BPE, so a stand-in tokenizer must
cut the template's prefix into exactly 34 tokens too, or the prompt's own first tokens are dropped (or
template tokens kept). This one does, by construction:

- ``<|im_start|>``, ``<|im_end|>`` and ``<|endoftext|>`` (the padding token, as in Qwen2) are special tokens,
  never split and never lower-cased;
- the line break is a token of its own (Qwen2's BPE keeps ``\\n`` too), every other run of word characters
  or of punctuation is one token, spaces are dropped;
- no token is added around a sequence (Qwen2 adds no BOS or EOS either).

The template's prefix is then ``<|im_start|> system \\n describe the image ... background : <|im_end|> \\n
<|im_start|> user \\n``: 34 tokens. :func:`template_prefix_length` counts them for any tokenizer, and the tiny
twin's tests check that a prompt's own tokens are exactly what survives the drop (followed by the template's
five closing tokens, as with the real tokenizer).

The edit pipelines (``QwenImageEditPipeline``, ``QwenImageEditPlusPipeline``) use a longer system message and
drop 64 tokens: everything before ``<|vision_start|>``, where the source image's vision tokens begin. The edit
twin's tokenizer (``edit=True``) knows that message's words and the vision tokens (``<|vision_start|>``,
``<|image_pad|>``, ``<|vision_end|>``, ``<|video_pad|>``, special) and keeps an apostrophe with the letters after
it (``user's`` is ``user 's``, as Qwen2's BPE splits it), which makes that prefix 64 tokens too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from flowrl.backbones.common.tokenizer import DEFAULT_WORDS

PAD, IM_START, IM_END, UNK, NEWLINE = "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>", "\n"
SPECIAL = (PAD, IM_START, IM_END, UNK)
PAD_ID, IM_START_ID, IM_END_ID, UNK_ID, NEWLINE_ID = 0, 1, 2, 3, 4

# The words of QwenImagePipeline's system prompt and chat roles, so that the template is no <unk> soup.
_TEMPLATE_TEXT = """
    system user assistant describe the image by detailing color , shape size texture quantity text spatial
    relationships of objects and background :
"""
TEMPLATE_WORDS: tuple[str, ...] = tuple(_TEMPLATE_TEXT.split())
# The vision tokens of Qwen2.5-VL's processor, and the words of the edit pipelines' system prompt
VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD = "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"
VISION_SPECIAL = (VISION_START, IMAGE_PAD, VISION_END, VIDEO_PAD)
_EDIT_TEMPLATE_TEXT = """
    system user assistant describe the key features of input image ( color , shape size texture objects background ),
    then explain how 's text instruction should alter or modify . generate a new that meets requirements while
    maintaining consistency with original where appropriate picture : 1 2 3 4 5 6 7 8 9
"""
EDIT_TEMPLATE_WORDS: tuple[str, ...] = tuple(_EDIT_TEMPLATE_TEXT.split())


def build_qwen_word_tokenizer(words: Sequence[str] = DEFAULT_WORDS, edit: bool = False) -> PreTrainedTokenizerFast:
    """A fast word-level tokenizer over :data:`TEMPLATE_WORDS` and ``words`` (lower-cased, de-duplicated)
    with Qwen2's special tokens; pads on the right with ``<|endoftext|>``, maps unknown words to ``<unk>``.
    ``edit``: the edit pipelines' words (:data:`EDIT_TEMPLATE_WORDS`), the vision tokens and ``'s`` kept whole."""
    special = (*SPECIAL, *VISION_SPECIAL) if edit else SPECIAL
    vocab = {tok: i for i, tok in enumerate((*SPECIAL, NEWLINE, *special[len(SPECIAL):]))}
    for word in (*(EDIT_TEMPLATE_WORDS if edit else TEMPLATE_WORDS), *words):
        w = word.strip().lower()
        if w and w not in vocab:
            vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    # keep the matches (words, punctuation runs, line breaks), drop everything else (spaces)
    pattern = r"'\w+|\w+|[^\w\s]+|\n" if edit else r"\w+|[^\w\s]+|\n"
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="removed", invert=True)
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in special])
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=2048,  # the pipeline asks for at most 1024 + 34 tokens
        padding_side="right",
        truncation_side="right",
        pad_token=PAD,
        unk_token=UNK,
        eos_token=IM_END,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
    )


def template_prefix_length(tokenizer: Any, template: str) -> int:
    """How many tokens ``tokenizer`` makes of ``template``'s text before the prompt's slot ``{}`` or, in an edit
    template, before the source image's ``<|vision_start|>``, whichever comes first."""
    prefix = template.split("{}")[0].split(VISION_START)[0]
    return len(tokenizer(prefix, add_special_tokens=False)["input_ids"])
