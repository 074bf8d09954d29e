"""LoRA on any base: which modules an adapter may target (``targets.py``), reading a LoRA file to start from
(``load.py``) and writing a run's adapter for diffusers and kohya-style tools (``export.py``)."""
