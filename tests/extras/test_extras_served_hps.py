"""HPSv2 served from the extras environment (`flowrl serve hpsv2`, its torch and hpsv2) to a `remote` reward in the
main environment (./.venv, which lacks hpsv2): the scores the main venv gets are the extras venv's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("FLOWRL_EXTRAS") != "1":  # set by `nox -s extras`; the main environment lacks these packages
    pytest.skip("needs the extras environment (nox -s extras)", allow_module_level=True)

import numpy as np
import torch
from conftest import SCORE_TOL
from PIL import Image
from safetensors.torch import save_file

from flowrl.core.registry import build

ROOT = Path(__file__).resolve().parents[2]
MAIN = ROOT / ".venv" / "bin" / "python"
DATA = ROOT / "tests" / "data" / "rewards"
SPEC = {"checkpoint": str(DATA / "hps" / "tiny_hps.pt"), "model": "tiny-hps",
        "model_config": str(DATA / "hps" / "tiny-hps.json"), "device": "cpu"}
CLIENT = """
import json, sys
from safetensors.torch import load_file
from flowrl.rewards.remote import RemoteReward
reward = RemoteReward(RemoteReward.Config(url=sys.argv[1], encoding="float32", expect="hpsv2", retries=0))
reward.check()
print(json.dumps(reward.score(load_file(sys.argv[2])["images"], json.loads(sys.argv[3])).tolist()))
"""


@pytest.mark.skipif(not MAIN.exists(), reason="no main environment at ./.venv (bash scripts/setup.sh)")
def test_hpsv2_served_from_the_extras_venv_scores_in_the_main_venv(tmp_path: Path) -> None:
    image = np.asarray(Image.open(DATA / "image.png").convert("RGB"), dtype=np.float32) / 255
    images = torch.from_numpy(image).permute(2, 0, 1).unsqueeze(0).repeat(2, 1, 1, 1).contiguous()
    images[1] = images[1].flip(-1)  # two different images
    prompts = ["a photo of a cat", "a red circle"]
    save_file({"images": images}, str(tmp_path / "images.safetensors"))
    expected = build("reward", {"type": "hpsv2", **SPEC}).score(images, prompts)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop("FLOWRL_SERVE_TOKEN", None)
    args = [sys.executable, "-m", "flowrl.cli.main", "serve", "hpsv2", "--port", "0", "--quiet"]
    for key, value in SPEC.items():
        args += ["--set", f"{key}={value}"]
    server = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
    try:
        line = server.stdout.readline() if server.stdout else ""
        assert " at http://127.0.0.1:" in line, (line, server.stderr.read() if server.stderr else "")
        url = line.strip().rsplit(" at ", 1)[1]
        client = subprocess.run([str(MAIN), "-c", CLIENT, url, str(tmp_path / "images.safetensors"),
                                 json.dumps(prompts)], capture_output=True, text=True, cwd=tmp_path, env=env,
                                timeout=300)
    finally:
        server.terminate()
        server.wait(30)
    assert client.returncode == 0, client.stderr[-2000:]
    got = torch.tensor(json.loads(client.stdout.strip().splitlines()[-1]))
    # the server scores the very tensors (float32 encoding) with the same code: equal up to the float32 noise of
    # another process and batch (SCORE_TOL, tests/conftest.py)
    torch.testing.assert_close(got, expected.float(), **SCORE_TOL)
    assert not torch.equal(got[0], got[1])  # two images, two scores: not a constant
