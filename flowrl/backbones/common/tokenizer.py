"""A word-level tokenizer built locally with the ``tokenizers`` library (no hub download).

The tokenizer serves both text encoders of a tiny FLUX pipeline (the CLIP slot ``tokenizer`` and the T5
slot ``tokenizer_2``). Special-token ids follow T5's layout so that one tokenizer fits both models:

====  ========  ==========================================================================
id    token     role
====  ========  ==========================================================================
0     ``<pad>`` padding (T5 ``pad_token_id`` and ``decoder_start_token_id``)
1     ``</s>``  end of sequence (T5 ``eos_token_id``; CLIP pools the hidden state at its
                first occurrence, so it must not be id 2: CLIP treats ``eos_token_id == 2``
                as a legacy config and pools at ``argmax(input_ids)`` instead)
2     ``<unk>`` unknown word
3     ``<s>``   beginning of sequence
====  ========  ==========================================================================

Every encoded sequence is ``<s> words... </s>``; truncation keeps room for both special tokens, so the end
token CLIP pools at is always present.
"""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

PAD, EOS, UNK, BOS = "<pad>", "</s>", "<unk>", "<s>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, EOS, UNK, BOS)
PAD_ID, EOS_ID, UNK_ID, BOS_ID = 0, 1, 2, 3

_DEFAULT_TEXT = """
    a an the one two three four five six seven eight nine ten some many several no
    of and or with without in on at to from by near next beside behind front top bottom
    left right above below under over between inside outside middle center corner
    red orange yellow green blue purple pink brown black white gray grey gold silver
    circle square triangle rectangle star heart cross line dot ring shape shapes
    circles squares triangles stars dots lines
    small large big tiny huge tall short long wide round bright dark light striped
    happy old young new beautiful cute simple plain
    cat cats dog dogs bird birds horse fish cow sheep bear rabbit mouse
    car cars bus bike boat plane train house tree trees flower flowers sun moon sky cloud
    water sea river mountain road city street field forest grass snow beach
    man woman person people child boy girl face hand
    apple banana cake cup bottle chair table book clock ball box bag hat lamp phone
    photo picture image painting drawing sketch portrait view scene background
    is are sitting standing running flying lying holding wearing
    , .
"""
DEFAULT_WORDS: tuple[str, ...] = tuple(_DEFAULT_TEXT.split())


def _unique_lower(words: Sequence[str]) -> list[str]:
    seen: set[str] = set(SPECIAL_TOKENS)
    out: list[str] = []
    for word in words:
        w = word.strip().lower()
        if w and w not in seen:
            seen.add(w)
            out.append(w)
    return out


def build_word_tokenizer(words: Sequence[str], max_length: int) -> PreTrainedTokenizerFast:
    """Build a word-level fast tokenizer over ``words`` (lower-cased, de-duplicated, order kept).

    Text is lower-cased and split on whitespace and punctuation; a word outside the vocabulary maps to
    ``<unk>``. Each sequence becomes ``<s> ... </s>``; the result has ``model_max_length=max_length``,
    pads on the right with ``<pad>`` and truncates on the right. Vocabulary size is
    ``len(SPECIAL_TOKENS) + len(unique words)``. It saves and loads with ``save_pretrained`` /
    ``from_pretrained`` (also as a pipeline's ``tokenizer`` / ``tokenizer_2``).
    """
    if max_length < 3:
        raise ValueError(f"max_length must leave room for <s>, </s> and one word, got {max_length}")
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for word in _unique_lower(words):
        vocab[word] = len(vocab)

    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase(), normalizers.Strip()])
    tok.pre_tokenizer = pre_tokenizers.Whitespace()  # splits into \w+ runs and punctuation runs
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A {EOS}",
        pair=f"{BOS} $A {EOS} $B:1 {EOS}:1",
        special_tokens=[(BOS, BOS_ID), (EOS, EOS_ID)],
    )
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)  # joins words with spaces

    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        model_max_length=max_length,
        padding_side="right",
        truncation_side="right",
        pad_token=PAD,
        unk_token=UNK,
        bos_token=BOS,
        eos_token=EOS,
        model_input_names=["input_ids", "attention_mask"],
        clean_up_tokenization_spaces=False,
    )
