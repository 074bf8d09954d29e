"""FLUX.1 (dev, schnell; any FluxPipeline): ``adapter.py`` drives the diffusers pipeline (the ``flux`` backbone);
``probe.py`` AEGPO's attention-entropy probe (imports diffusers; only the adapter calls it, lazily);
``tiny.py`` the tiny random twin (``tiny_flux``) and its builder. Importing the package registers both parts."""

from flowrl.backbones.flux import adapter, tiny  # noqa: F401
