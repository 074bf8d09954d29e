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


def build_qwen_word_tokenizer(words: Sequence[str] = DEFAULT_WORDS) -> PreTrainedTokenizerFast:
    """A fast word-level tokenizer over :data:`TEMPLATE_WORDS` and ``words`` (lower-cased, de-duplicated)
    with Qwen2's special tokens; pads on the right with ``<|endoftext|>``, maps unknown words to ``<unk>``."""
    vocab = {tok: i for i, tok in enumerate((*SPECIAL, NEWLINE))}
    for word in (*TEMPLATE_WORDS, *words):
        w = word.strip().lower()
        if w and w not in vocab:
            vocab[w] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()])
    # keep the matches (words, punctuation runs, line breaks), drop everything else (spaces)
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"\w+|[^\w\s]+|\n"), behavior="removed", invert=True)
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in SPECIAL])
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
    """How many tokens ``tokenizer`` makes of ``template``'s text before the prompt's slot ``{}``."""
    return len(tokenizer(template.split("{}")[0], add_special_tokens=False)["input_ids"])
