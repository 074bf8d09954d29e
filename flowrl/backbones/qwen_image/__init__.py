"""Qwen-Image: ``adapter.py`` drives the diffusers pipeline (the ``qwen_image`` backbone);
``probe.py`` AEGPO's attention-entropy probe (imports diffusers; only the adapter calls it, lazily);
``tiny.py`` the tiny random twin (``tiny_qwen_image``) and its builder. Importing the package registers both parts."""

from flowrl.backbones.qwen_image import adapter, tiny  # noqa: F401
