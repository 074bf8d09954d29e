"""FLUX.2 (dev, klein, klein-base): ``adapter.py`` drives the diffusers pipeline (the ``flux2`` backbone);
``probe.py`` AEGPO's attention-entropy probe (imports diffusers; only the adapter calls it, lazily);
``tiny.py`` the tiny random twin (``tiny_flux2``) and its builder. Importing the package registers both parts."""

from flowrl.backbones.flux2 import adapter, tiny  # noqa: F401
