"""No warning the user cannot act on: transformers' torchvision fallback notice is dropped, others pass."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from conftest import ROOT


def test_importing_the_trainer_and_the_pipelines_prints_no_torchvision_notice() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRANSFORMERS_VERBOSITY"}  # a plain Python user
    code = "import flowrl.pretrain.trainer, flowrl.trainer.loop"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "torchvision" not in out.stderr, out.stderr


def test_only_that_notice_is_dropped(caplog) -> None:  # type: ignore[no-untyped-def]
    import flowrl  # noqa: F401  (installs the filter)
    from flowrl.utils.quiet import SOURCE

    logger = logging.getLogger(SOURCE)
    with caplog.at_level(logging.WARNING, logger=SOURCE):
        logger.warning("`CLIPImageProcessor` requires torchvision (not installed); falling back to `X`")
        logger.warning("something a user should read")
    assert [r.getMessage() for r in caplog.records] == ["something a user should read"]
