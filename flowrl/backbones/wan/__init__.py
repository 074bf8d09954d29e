"""Wan 2.1 / 2.2 text-to-video: ``adapter.py`` drives the diffusers pipeline (the ``wan`` backbone);
``probe.py`` AEGPO's attention-entropy probe (imports diffusers; only the adapter calls it, lazily);
``tiny.py`` the tiny random twin (``tiny_wan``) and its builder. Importing the package registers both parts."""

from flowrl.backbones.wan import adapter, tiny  # noqa: F401
