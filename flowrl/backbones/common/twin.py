"""What every registered tiny twin shares: its spec built from its settings, those settings checked by building
the spec, its transformer built on the meta device for the LoRA target check, and its pipeline built from the
spec and the weight seed.

A twin is ``class TinyX(TwinBackbone, XAdapter)`` (this mixin first, so that its ``load_pipeline`` is the one
used) with an attrs ``Config`` holding ``seed``, and declares only what differs:

- ``spec_type``: its builder's spec, an attrs class that refuses sizes diffusers would refuse later (a
  ``ValueError``); each of its fields the ``Config`` also has is taken from the settings, under the recipe's name
  (:data:`~flowrl.backbones.common.checks.SPEC_RENAMES`: ``resolution`` for ``image_size``,
  ``max_sequence_length`` for ``max_length``); the rest keep the spec's defaults;
- ``build_transformer``: ``staticmethod(f)`` of ``f(spec)``, the bare transformer;
- ``build_pipeline``: ``staticmethod(f)`` of ``f(spec, seed=...)``, the whole random-weight pipeline;
- where a spec field is worked out from the settings rather than copied, ``spec_fields(config)``, a static
  method returning those fields.

A twin whose settings have further rules overrides ``check_config`` and adds them to ``super().check_config``.
Model-free: the builders import their model libraries themselves, and the LoRA module is imported when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import attrs

from flowrl.backbones.common.checks import SPEC_RENAMES, spec_problems


class TwinBackbone:
    """A registered tiny twin's spec, checks, meta-device transformer and pipeline, from what it declares (see the
    module)."""

    config: Any
    spec_type: ClassVar[type]  # the builder's spec (attrs)
    build_transformer: ClassVar[Callable[..., Any]]  # spec -> the transformer
    build_pipeline: ClassVar[Callable[..., Any]]  # (spec, seed=...) -> the pipeline

    @staticmethod
    def spec_fields(config: Any) -> dict[str, Any]:
        """The spec's fields worked out from ``config`` rather than copied from it (none by default)."""
        return {}

    @classmethod
    def spec(cls, config: Any) -> Any:
        """The builder's spec for these settings: the fields ``config`` shares with it, then :meth:`spec_fields`."""
        settings = attrs.fields_dict(type(config))
        shared = {
            name: getattr(config, SPEC_RENAMES.get(name, name))
            for name in attrs.fields_dict(cls.spec_type)
            if SPEC_RENAMES.get(name, name) in settings
        }
        return cls.spec_type(**{**shared, **cls.spec_fields(config)})

    @classmethod
    def check_config(cls, config: Any) -> list[tuple[str, str]]:
        """The spec's refusal of these settings, as ``(recipe key, message)`` (:func:`spec_problems`)."""
        return spec_problems(cls.spec, config)

    @classmethod
    def transformer_on_meta(cls, config: Any) -> Any:
        """The transformer without weights (flowrl.backbones.lora.targets)."""
        from flowrl.backbones.lora.targets import on_meta

        return on_meta(lambda: cls.build_transformer(cls.spec(config)))

    def load_pipeline(self) -> Any:
        return self.build_pipeline(self.spec(self.config), seed=self.config.seed)
