"""FLUX.1 (dev, schnell; any FluxPipeline): ``adapter.py`` drives the diffusers pipeline (the ``flux`` backbone);
``kontext.py`` the FLUX.1-Kontext edit base on top of it (``flux_kontext``: FluxKontextPipeline, one source image);
``probe.py`` AEGPO's attention-entropy probe (imports diffusers; only the adapter calls it, lazily);
``tiny.py`` the tiny random twins (``tiny_flux``, ``tiny_flux_kontext``) and their builders. Importing the package
registers all of them."""

from flowrl.backbones.flux import adapter, kontext, tiny  # noqa: F401
