"""Stable Diffusion 3 / 3.5: ``adapter.py`` drives the diffusers pipeline (the ``sd3`` backbone);
``tiny.py`` the tiny random twin (``tiny_sd3``) and its builder. Importing the package registers both parts."""

from flowrl.backbones.sd3 import adapter, tiny  # noqa: F401
