"""scripts/world_probe.py runs on the shipped base and prints finite figures for each noise level asked."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_world_probe_prints_one_row_per_level() -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "scripts/world_probe.py", "--levels", "0.5,0.9"]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = [line.split() for line in done.stdout.splitlines() if line.strip()[:1].isdigit()]
    assert [row[0] for row in rows] == ["0.50", "0.90"]
    for row in rows:
        mse, variance, own, ring1, ring2, far = (float(v) for v in row[1:3] + row[4:])
        assert all(math.isfinite(v) and v >= 0 for v in (mse, own, ring1, ring2, far))
        assert mse < variance  # the base model knows more than nothing about the clean image
        assert own > ring1  # a token's own noise moves its prediction most
