"""What every registered tiny twin shares: its settings checked by building its spec, its transformer built on
the meta device for the LoRA target check, and its pipeline built from the spec and the weight seed.

A twin is ``class TinyX(TwinBackbone, XAdapter)`` (this mixin first, so that its ``load_pipeline`` is the one
used) with an attrs ``Config`` holding ``seed``, and declares only what differs:

- ``spec(config)``, a static method: the recipe's settings turned into the builder's spec (which refuses sizes
  diffusers would refuse later, with a ``ValueError``);
- ``build_transformer``: ``staticmethod(f)`` of ``f(spec)``, the bare transformer;
- ``build_pipeline``: ``staticmethod(f)`` of ``f(spec, seed=...)``, the whole random-weight pipeline.

A twin whose settings have further rules overrides ``check_config`` and adds them to ``super().check_config``.
Model-free: the builders import their model libraries themselves, and the LoRA module is imported when asked.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from flowrl.backbones.common.checks import spec_problems


class TwinBackbone:
    """The four methods of a registered tiny twin, from the three things it declares (see the module)."""

    config: Any
    spec: ClassVar[Callable[..., Any]]  # Config -> the builder's spec (a static method)
    build_transformer: ClassVar[Callable[..., Any]]  # spec -> the transformer
    build_pipeline: ClassVar[Callable[..., Any]]  # (spec, seed=...) -> the pipeline

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
