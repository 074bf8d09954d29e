"""The bases flowrl drives, one package each (``flux``, ``flux2``, ``sd3``, ``qwen_image``, ``wan``: an adapter, its
attention probe where it has one, and its tiny twin), with ``common`` (what the adapters, probes and twins share)
and ``lora`` (LoRA targets, import and export). flowrl/register_builtins.py imports each base package, which
registers its parts: a new base is a new folder and one line there."""
