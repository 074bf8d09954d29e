"""Qwen-Image: ``adapter.py`` drives the diffusers pipeline (the ``qwen_image`` backbone);
``edit.py`` the Qwen-Image-Edit base on top of it (``qwen_image_edit``: QwenImageEditPipeline, one source image, or
QwenImageEditPlusPipeline, several); ``probe.py`` AEGPO's attention-entropy probe (imports diffusers; only the
adapter calls it, lazily); ``tiny.py`` the tiny random twins (``tiny_qwen_image``, ``tiny_qwen_image_edit``) and
their builders. Importing the package registers the four parts."""

from flowrl.backbones.qwen_image import adapter, edit, tiny  # noqa: F401
