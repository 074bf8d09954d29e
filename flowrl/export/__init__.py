"""A checkpoint as a folder to hand on (``flowrl export``): its weights in the forms others load (the diffusers
LoRA folder and the kohya file, or the trained transformer), the resolved recipe, a sample grid and a model card
whose front matter the model hubs read; optionally uploaded to a hub repository.

:mod:`~flowrl.export.card` writes the card from the run's own figures, :mod:`~flowrl.export.folder` the folder,
:mod:`~flowrl.export.hub` the upload.
"""
