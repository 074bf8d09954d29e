"""What the bases share: the pipeline adapter's plumbing (``pipeline.py``), the probe machinery (``probe.py``,
``probe_options.py``), the tiny-twin builder (``tiny.py``), the word tokenizer and vocabulary check, the prompt
encoding cache and the spec checks. Imports no base."""
