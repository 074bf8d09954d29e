"""Wan 2.1 / 2.2: ``adapter.py`` drives the text-to-video pipeline (the ``wan`` backbone); ``i2v.py`` the
image-to-video one on top of it (``wan_i2v``: WanImageToVideoPipeline, one first frame; Wan 2.1 I2V, 2.2 I2V-A14B,
2.2 TI2V-5B); ``probe.py`` AEGPO's attention-entropy probe (imports diffusers; only the adapters call it, lazily);
``tiny.py`` and ``tiny_i2v.py`` the tiny random twins (``tiny_wan``, ``tiny_wan_i2v``) and their builders.
Importing the package registers all four."""

from flowrl.backbones.wan import adapter, i2v, tiny, tiny_i2v  # noqa: F401
