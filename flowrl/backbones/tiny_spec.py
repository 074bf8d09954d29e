"""The sizes of the tiny pixel- or latent-space FLUX (:class:`TinyFluxSpec`): a settings type with no model
code, so recipe checks and the pre-training recipe can use it without importing diffusers
(:mod:`flowrl.backbones.tiny` builds the models)."""

from __future__ import annotations

import attrs


def _positive(_instance: object, attribute: attrs.Attribute, value: int) -> None:
    if value <= 0:
        raise ValueError(f"{attribute.name} must be positive, got {value}")


@attrs.frozen
class TinyFluxSpec:
    """Sizes of a tiny FLUX pipeline.

    Pixel space (``pixel_space=True``, no VAE): the model sees a 3 x H x W image packed into
    ``(H/patch) * (W/patch)`` tokens of ``3 * patch**2`` channels (the packing is the adapter's job).
    Latent space: a tiny ``AutoencoderKL`` with ``len(vae_block_out_channels) - 1`` halvings and
    ``latent_channels`` channels; FluxPipeline packs 2x2 latent patches, so the transformer has
    ``4 * latent_channels`` input channels and ``(image_size / (2 * vae_scale_factor))**2`` tokens.

    ``joint_attention_dim`` is the T5 encoder's width (``d_model``), ``pooled_projection_dim`` the CLIP
    text encoder's width (FLUX uses CLIP's pooled output unprojected); ``text_hidden`` is the
    feed-forward width of both text encoders, ``text_layers`` their depth.
    """

    image_size: int = attrs.field(default=32, validator=_positive)
    pixel_space: bool = True
    patch: int = attrs.field(default=4, validator=_positive)
    num_layers: int = 2
    num_single_layers: int = 2
    attention_head_dim: int = attrs.field(default=16, validator=_positive)
    num_attention_heads: int = attrs.field(default=2, validator=_positive)
    joint_attention_dim: int = attrs.field(default=32, validator=_positive)
    pooled_projection_dim: int = attrs.field(default=32, validator=_positive)
    text_hidden: int = attrs.field(default=32, validator=_positive)
    text_layers: int = attrs.field(default=2, validator=_positive)
    text_heads: int = attrs.field(default=2, validator=_positive)
    max_length: int = attrs.field(default=16, validator=_positive)
    shift: float = 3.0
    axes_dims_rope: tuple[int, int, int] = attrs.field(default=(4, 6, 6), converter=tuple)
    guidance_embeds: bool = False
    latent_channels: int = attrs.field(default=4, validator=_positive)
    vae_block_out_channels: tuple[int, ...] = attrs.field(default=(8, 16), converter=tuple)

    def __attrs_post_init__(self) -> None:
        if len(self.axes_dims_rope) != 3 or any(d % 2 for d in self.axes_dims_rope):
            raise ValueError(f"axes_dims_rope must be three even numbers, got {self.axes_dims_rope}")
        if sum(self.axes_dims_rope) != self.attention_head_dim:
            raise ValueError(
                f"axes_dims_rope {self.axes_dims_rope} must sum to attention_head_dim {self.attention_head_dim}"
            )
        for name in ("joint_attention_dim", "pooled_projection_dim"):
            if getattr(self, name) % self.text_heads:
                raise ValueError(f"{name} must be divisible by text_heads={self.text_heads}")
        if self.image_size % self.token_grid_factor:
            raise ValueError(f"image_size {self.image_size} must be divisible by {self.token_grid_factor}")

    @property
    def vae_scale_factor(self) -> int:
        """Pixels per latent cell (latent space only)."""
        return 2 ** (len(self.vae_block_out_channels) - 1)

    @property
    def token_grid_factor(self) -> int:
        """Pixels per transformer token along one side."""
        return self.patch if self.pixel_space else 2 * self.vae_scale_factor

    @property
    def in_channels(self) -> int:
        """Channels per transformer token."""
        return 3 * self.patch**2 if self.pixel_space else 4 * self.latent_channels

    @property
    def num_tokens(self) -> int:
        """Image tokens the transformer sees for an ``image_size`` square image."""
        return (self.image_size // self.token_grid_factor) ** 2
