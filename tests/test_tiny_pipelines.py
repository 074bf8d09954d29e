"""Tiny FLUX pipelines built locally: tokenizer, both variants, save/load round trips, determinism."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"

import json  # noqa: E402

import attrs  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from diffusers import FluxPipeline  # noqa: E402

from flowrl.backbones.common.tokenizer import (  # noqa: E402
    BOS_ID,
    DEFAULT_WORDS,
    EOS_ID,
    PAD_ID,
    SPECIAL_TOKENS,
    UNK_ID,
    build_word_tokenizer,
)
from flowrl.backbones.flux.tiny import TinyFluxSpec, load_tiny_flux, save_tiny_flux, tiny_flux_pipeline  # noqa: E402

PROMPTS = ["a red circle", "two dogs"]
PIXEL = TinyFluxSpec()
LATENT = TinyFluxSpec(pixel_space=False)


def _quiet(pipe: FluxPipeline) -> FluxPipeline:
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.fixture(scope="module")
def pixel_pipe() -> FluxPipeline:
    return _quiet(tiny_flux_pipeline(PIXEL))


@pytest.fixture(scope="module")
def latent_pipe() -> FluxPipeline:
    return _quiet(tiny_flux_pipeline(LATENT))


def _modules(pipe: FluxPipeline) -> dict[str, torch.nn.Module]:
    names = ("transformer", "text_encoder", "text_encoder_2", "vae")
    return {n: getattr(pipe, n) for n in names if getattr(pipe, n) is not None}


def _assert_same_weights(a: torch.nn.Module, b: torch.nn.Module) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        assert sa[key].dtype == sb[key].dtype == torch.float32, key
        assert torch.equal(sa[key], sb[key]), key


def _run_latent(pipe: FluxPipeline, seed: int = 0) -> torch.Tensor:
    return pipe(
        prompt=PROMPTS,
        num_inference_steps=4,
        height=LATENT.image_size,
        width=LATENT.image_size,
        guidance_scale=3.5,  # only used when guidance_embeds; ignored here
        max_sequence_length=LATENT.max_length,
        output_type="latent",
        generator=torch.Generator().manual_seed(seed),
    ).images


def _pixel_forward(pipe: FluxPipeline, seed: int = 0) -> torch.Tensor:
    """One transformer call on packed pixels, as the flowrl adapter will make it."""
    spec = PIXEL
    side = spec.image_size // spec.patch
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(PROMPTS), side * side, spec.in_channels, generator=gen)
    embeds, pooled, text_ids = pipe.encode_prompt(
        prompt=PROMPTS, prompt_2=None, max_sequence_length=spec.max_length
    )
    img_ids = FluxPipeline._prepare_latent_image_ids(len(PROMPTS), side, side, x.device, x.dtype)
    with torch.no_grad():
        return pipe.transformer(
            hidden_states=x,
            encoder_hidden_states=embeds,
            pooled_projections=pooled,
            timestep=torch.full((len(PROMPTS),), 0.5),
            img_ids=img_ids,
            txt_ids=text_ids,
            return_dict=False,
        )[0]


# --------------------------------------------------------------------------------------------- tokenizer


def test_tokenizer_vocabulary_and_special_ids() -> None:
    tok = build_word_tokenizer(["Cat", "dog", "cat", "  "], max_length=8)
    assert len(tok) == len(SPECIAL_TOKENS) + 2
    assert (tok.pad_token_id, tok.eos_token_id, tok.unk_token_id, tok.bos_token_id) == (
        PAD_ID,
        EOS_ID,
        UNK_ID,
        BOS_ID,
    )
    assert tok.model_max_length == 8 and tok.padding_side == "right"
    ids = tok("CAT, dog!").input_ids
    # lower-cased, punctuation split off (and unknown), wrapped in <s> ... </s>
    assert ids == [
        BOS_ID,
        tok.convert_tokens_to_ids("cat"),
        UNK_ID,
        tok.convert_tokens_to_ids("dog"),
        UNK_ID,
        EOS_ID,
    ]


_EXPECTED = "a one two three left right above below of and red blue circle square cat dog photo"


def test_default_words() -> None:
    words = set(DEFAULT_WORDS)
    assert 100 <= len(words) <= 250 and len(words) == len(DEFAULT_WORDS)
    for w in _EXPECTED.split():
        assert w in words, w
    tok = build_word_tokenizer(DEFAULT_WORDS, 16)
    assert UNK_ID not in tok("A photo of two red cats left of a blue square.").input_ids


def test_tokenizer_unknown_truncation_padding() -> None:
    tok = build_word_tokenizer(DEFAULT_WORDS, max_length=6)
    enc = tok(
        ["zorblax quux", "one two three four five six seven eight"], padding="max_length", truncation=True
    )
    assert enc.input_ids[0] == [BOS_ID, UNK_ID, UNK_ID, EOS_ID, PAD_ID, PAD_ID]
    assert enc.attention_mask[0] == [1, 1, 1, 1, 0, 0]
    # truncation keeps room for </s>: CLIP pools there
    assert enc.input_ids[1] == [BOS_ID] + tok.convert_tokens_to_ids(["one", "two", "three", "four"]) + [
        EOS_ID
    ]
    assert tok("", padding="max_length", truncation=True).input_ids == [BOS_ID, EOS_ID] + [PAD_ID] * 4
    with pytest.raises(ValueError):
        build_word_tokenizer(DEFAULT_WORDS, max_length=2)


def test_tokenizer_save_load(tmp_path) -> None:
    from transformers import AutoTokenizer

    tok = build_word_tokenizer(DEFAULT_WORDS, max_length=10)
    tok.save_pretrained(tmp_path)
    back = AutoTokenizer.from_pretrained(tmp_path, local_files_only=True)
    text = ["Two Cats above a green triangle, xyzzy", "dog"]
    kw = dict(padding="max_length", truncation=True)
    assert back(text, **kw).input_ids == tok(text, **kw).input_ids
    assert back.model_max_length == 10 and back.padding_side == "right"


# ---------------------------------------------------------------------------------------- spec, building


def test_spec_derived_sizes_and_validation() -> None:
    assert (PIXEL.in_channels, PIXEL.num_tokens) == (48, 64)
    assert (LATENT.vae_scale_factor, LATENT.in_channels, LATENT.num_tokens) == (2, 16, 64)
    with pytest.raises(ValueError, match="sum"):
        TinyFluxSpec(axes_dims_rope=(4, 4, 4))
    with pytest.raises(ValueError, match="divisible"):
        TinyFluxSpec(image_size=30)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        PIXEL.patch = 2  # type: ignore[misc]


def test_pixel_pipeline_builds_and_runs(pixel_pipe: FluxPipeline) -> None:
    assert pixel_pipe.vae is None
    cfg = pixel_pipe.transformer.config
    assert (cfg.in_channels, cfg.num_layers, cfg.num_single_layers) == (48, 2, 2)
    assert (cfg.joint_attention_dim, cfg.pooled_projection_dim, cfg.guidance_embeds) == (32, 32, False)
    assert pixel_pipe.scheduler.config.shift == 3.0 and not pixel_pipe.scheduler.config.use_dynamic_shifting
    for module in _modules(pixel_pipe).values():
        assert all(p.dtype == torch.float32 for p in module.parameters())
    out = _pixel_forward(pixel_pipe)
    assert out.shape == (2, PIXEL.num_tokens, PIXEL.in_channels) and out.isfinite().all()


@pytest.mark.parametrize("variant", ["pixel", "latent"])
def test_encode_prompt(variant: str, pixel_pipe: FluxPipeline, latent_pipe: FluxPipeline) -> None:
    pipe, spec = (pixel_pipe, PIXEL) if variant == "pixel" else (latent_pipe, LATENT)
    prompts = ["a red circle", "two dogs", "Zorblax left of a cat"]
    with torch.no_grad():
        embeds, pooled, text_ids = pipe.encode_prompt(
            prompt=prompts, prompt_2=None, max_sequence_length=spec.max_length
        )
    assert embeds.shape == (3, spec.max_length, spec.joint_attention_dim)
    assert pooled.shape == (3, spec.pooled_projection_dim)
    assert text_ids.shape == (spec.max_length, 3)
    assert embeds.isfinite().all() and pooled.isfinite().all()
    assert not torch.allclose(pooled[0], pooled[1])
    # CLIP's pooled vector is its final hidden state at </s> (eos_token_id must match the tokenizer)
    ids = pipe.tokenizer(prompts, padding="max_length", truncation=True, return_tensors="pt").input_ids
    with torch.no_grad():
        hidden = pipe.text_encoder(ids).last_hidden_state
    eos_pos = (ids == EOS_ID).int().argmax(-1)
    # exact: the same text encoder on the same padded ids (the same batch); pooled is a row of its output
    torch.testing.assert_close(pooled, hidden[torch.arange(3), eos_pos], rtol=0, atol=0)


def test_latent_pipeline_runs(latent_pipe: FluxPipeline) -> None:
    assert latent_pipe.vae is not None and latent_pipe.vae_scale_factor == 2
    assert latent_pipe.transformer.config.in_channels == 4 * latent_pipe.vae.config.latent_channels
    latents = _run_latent(latent_pipe)
    assert latents.shape == (2, LATENT.num_tokens, LATENT.in_channels)
    assert latents.isfinite().all()
    images = latent_pipe(
        prompt=PROMPTS[:1],
        num_inference_steps=2,
        height=LATENT.image_size,
        width=LATENT.image_size,
        max_sequence_length=LATENT.max_length,
        output_type="np",
        generator=torch.Generator().manual_seed(0),
    ).images
    assert images.shape == (1, LATENT.image_size, LATENT.image_size, 3)


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("variant", ["pixel", "latent"])
def test_save_load_round_trip(
    variant: str, tmp_path, pixel_pipe: FluxPipeline, latent_pipe: FluxPipeline
) -> None:
    pipe, spec = (pixel_pipe, PIXEL) if variant == "pixel" else (latent_pipe, LATENT)
    folder = save_tiny_flux(spec, tmp_path / "tiny")
    index = json.loads((folder / "model_index.json").read_text())
    assert index["_class_name"] == "FluxPipeline"
    if variant == "pixel":
        assert index["vae"] == [None, None]
        # diffusers treats vae as a required FluxPipeline component: it must be passed explicitly
        with pytest.raises(ValueError, match="expected"):
            FluxPipeline.from_pretrained(folder, local_files_only=True)
        loaded = FluxPipeline.from_pretrained(folder, vae=None, local_files_only=True)
        assert loaded.vae is None
    else:
        loaded = FluxPipeline.from_pretrained(folder, local_files_only=True)
    loaded = _quiet(loaded)
    assert _quiet(load_tiny_flux(folder)).transformer.config == loaded.transformer.config

    mods, back = _modules(pipe), _modules(loaded)
    assert mods.keys() == back.keys()
    for name in mods:
        _assert_same_weights(mods[name], back[name])
    assert loaded.tokenizer.model_max_length == loaded.tokenizer_2.model_max_length == spec.max_length
    assert loaded.scheduler.config.shift == spec.shift

    # exact from here: bitwise-equal weights, the same inputs and the same code in one process
    with torch.no_grad():
        a = pipe.encode_prompt(prompt=PROMPTS, prompt_2=None, max_sequence_length=spec.max_length)
        b = loaded.encode_prompt(prompt=PROMPTS, prompt_2=None, max_sequence_length=spec.max_length)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)

    if variant == "pixel":
        assert torch.equal(_pixel_forward(pipe), _pixel_forward(loaded))
    else:
        assert torch.equal(_run_latent(pipe), _run_latent(loaded))


def test_seed_determinism() -> None:
    a, b, c = (tiny_flux_pipeline(LATENT, seed=s) for s in (0, 0, 1))
    ma, mb, mc = _modules(a), _modules(b), _modules(c)
    for name in ma:
        _assert_same_weights(ma[name], mb[name])
        diff = [k for k, v in ma[name].state_dict().items() if not torch.equal(v, mc[name].state_dict()[k])]
        assert diff, f"{name}: seed 1 gave the same weights as seed 0"
    # modules draw separate random streams (same-shaped weights differ across modules)
    wa = ma["text_encoder"].get_input_embeddings().weight
    wb = ma["text_encoder_2"].get_input_embeddings().weight
    assert wa.shape == wb.shape and not torch.equal(wa, wb)
