"""The FLUX attention-entropy probe: hand-computed entropies, unchanged outputs, restored processors."""

from __future__ import annotations

import inspect
import math

import diffusers
import pytest
import torch

import flowrl
from flowrl.backbones.common.probe import EntropyRecorder, softmax_entropy
from flowrl.backbones.common.probe_options import AttentionEntropyOptions
from flowrl.backbones.flux.probe import EntropyProbeProcessor, attention_modules, entropy_probe
from flowrl.core.convert import structure


def test_pinned_diffusers_internals() -> None:
    """The probe mirrors FluxAttnProcessor of diffusers 0.42 and imports two private helpers."""
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor, _get_qkv_projections

    assert diffusers.__version__.startswith("0.42.")
    assert list(inspect.signature(_get_qkv_projections).parameters) == [
        "attn",
        "hidden_states",
        "encoder_hidden_states",
    ]
    assert "sequence_dim" in inspect.signature(apply_rotary_emb).parameters
    call = list(inspect.signature(FluxAttnProcessor.__call__).parameters)
    assert call == list(inspect.signature(EntropyProbeProcessor.__call__).parameters)


def test_hand_computed_entropy() -> None:
    # One query, two keys, D = 1: logits [0, ln 3] give p = [1/4, 3/4].
    q = torch.tensor([math.log(3.0)]).reshape(1, 1, 1, 1)
    k = torch.tensor([0.0, 1.0]).reshape(1, 2, 1, 1)
    expected = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    assert softmax_entropy(q, k, chunk_size=1, normalise=False).item() == pytest.approx(expected, abs=1e-6)
    assert softmax_entropy(q, k, chunk_size=1, normalise=True).item() == pytest.approx(expected / math.log(2), abs=1e-6)
    # Uniform attention (all logits equal) has entropy log K.
    flat = softmax_entropy(torch.zeros(2, 3, 2, 4), torch.randn(2, 5, 2, 4) * 0 + 1.0, 2, False)
    assert torch.allclose(flat, torch.full((2,), math.log(5)), atol=1e-6)


def test_chunking_and_heads_match_a_direct_softmax() -> None:
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 7, 3, 8, generator=g), torch.randn(2, 5, 3, 8, generator=g)
    p = torch.softmax(torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(8), dim=-1)
    direct = -(p * p.log()).sum(-1).mean((1, 2))
    for chunk in (1, 3, 100):
        assert torch.allclose(softmax_entropy(q, k, chunk, False), direct, atol=1e-5)


def test_processor_takes_image_queries_and_text_keys() -> None:
    """Sequence [text; image] of length 2, D = 1: the image query (ln 3) over keys [0 (text), 1 (image)]."""
    query = torch.tensor([5.0, math.log(3.0)]).reshape(1, 2, 1, 1)  # the text query row must be ignored
    key = torch.tensor([0.0, 1.0]).reshape(1, 2, 1, 1)
    both = -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))
    for options, expected in [
        (AttentionEntropyOptions(), both),
        (AttentionEntropyOptions(normalise=True), both / math.log(2)),
        (AttentionEntropyOptions(keys="text"), 0.0),  # one text key: the renormalised softmax is certain
        (AttentionEntropyOptions(keys="text", normalise=True), 0.0),
    ]:
        recorder = EntropyRecorder()
        EntropyProbeProcessor(recorder, 0, text_len=1, options=options)._record(query, key, None)
        assert recorder.entropy().item() == pytest.approx(expected, abs=1e-6)


@pytest.fixture(scope="module")
def tiny() -> tuple:
    torch.manual_seed(0)
    backbone = flowrl.build("backbone", {"type": "tiny_flux", "resolution": 16})
    cond = backbone.encode(["a red circle", "two blue squares"])
    x = torch.randn(2, *backbone.latent_shape, generator=torch.Generator().manual_seed(1))
    return backbone, cond, x, torch.tensor([0.8, 0.3])


def test_output_unchanged_and_processors_restored(tiny: tuple) -> None:
    backbone, cond, x, s = tiny
    modules = attention_modules(backbone.transformer)
    before = [m.processor for m in modules]
    with torch.no_grad():
        plain = backbone.velocity(x, s, cond)
    nfe = backbone.nfe
    v, h = backbone.velocity_and_entropy(x, s, cond, AttentionEntropyOptions(chunk_size=5))
    assert backbone.nfe == nfe + 2  # a probe pass is a transformer evaluation per row
    assert torch.allclose(v, plain, atol=1e-5)
    assert h.shape == (2,) and bool(torch.isfinite(h).all()) and not h.requires_grad
    assert all(m.processor is p for m, p in zip(modules, before, strict=True))
    with pytest.raises(RuntimeError, match="boom"), entropy_probe(backbone.transformer, AttentionEntropyOptions(), 16):
        assert isinstance(modules[0].processor, EntropyProbeProcessor)
        raise RuntimeError("boom")
    assert all(m.processor is p for m, p in zip(modules, before, strict=True))


def test_options_change_the_value_as_expected(tiny: tuple) -> None:
    backbone, cond, x, s = tiny
    n_img, n_txt = backbone.latent_shape[0], cond.tensors["embeds"].shape[1]

    def h(**kw: object) -> torch.Tensor:
        return backbone.attention_entropy(x, s, cond, AttentionEntropyOptions(**kw))

    raw, norm = h(), h(normalise=True)
    assert torch.allclose(norm, raw / math.log(n_img + n_txt), atol=1e-5)
    assert bool(((norm >= 0) & (norm <= 1)).all())
    text, text_norm = h(keys="text"), h(keys="text", normalise=True)
    assert bool((text <= math.log(n_txt) + 1e-5).all()) and not torch.allclose(text, raw)
    assert torch.allclose(text_norm, text / math.log(n_txt), atol=1e-5)
    layers = len(attention_modules(backbone.transformer))
    per_layer = torch.stack([h(layers=(i,)) for i in range(layers)])
    assert torch.allclose(per_layer.mean(0), raw, atol=1e-5)
    assert torch.allclose(h(query_stride=1, chunk_size=3), raw, atol=1e-5)
    assert bool(torch.isfinite(h(query_stride=3)).all())
    with pytest.raises(ValueError, match="out of range"):
        h(layers=(layers,))


def test_options_as_a_recipe_table() -> None:
    options = structure(AttentionEntropyOptions, {"keys": "text", "layers": [0, 2], "query_stride": 2})
    assert options.layers == (0, 2) and options.keys == "text"
    with pytest.raises(ValueError, match="keys"):
        structure(AttentionEntropyOptions, {"keys": "image"})
