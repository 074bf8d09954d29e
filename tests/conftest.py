"""Test-wide settings: no hub access, quiet libraries, small shared fixtures."""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import pytest  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

# Reward scores from a float32 model (the tiny CLIP and HPS weights) move with the batch shape, the thread count
# and the processor (BLAS blocking, SIMD width): by ~1e-7 of the score's full scale (a cosine of unit vectors,
# times PickScore's logit scale of 14.3). PickScore, batch vs one image at a time: 1.0e-6 and 1.6e-6 (about
# 1e-6 relative) on two machines of the same kind. rtol 1e-5 (+1e-6 for small scores) leaves a 6x margin and
# still fails on a real change: the torch resize in place of PIL's moves the tiny scores by 8e-6 to 1.4e-3.
SCORE_TOL = {"rtol": 1e-5, "atol": 1e-6}


@pytest.fixture
def root() -> Path:
    return ROOT


def tiny_recipe(**trainer: object) -> dict:
    """A small, fast recipe dict on the tiny random FLUX model (16 px, 4 steps, G = 4)."""
    return {
        "name": "tiny",
        "seed": 0,
        "backbone": {"type": "tiny_flux", "resolution": 16, "num_layers": 1, "num_single_layers": 1},
        "prompts": {"type": "list", "prompts": ["a red circle", "two blue squares", "a cat"], "heldout": ["a dog"]},
        "selector": {"type": "explicit", "units": [[0, 1], [1, 1], [2, 1]]},
        "schedule": {"num_steps": 4, "shift": 3.0},
        "sampler": {"type": "independent", "group_size": 4},
        "kernel": {"type": "flow_grpo_sde", "noise_level": 0.7},
        "advantage": {"type": "group_norm"},
        "reward": [{"type": "jpeg_compressibility", "scale_kb": 1.0}],
        "loss": {"type": "ppo_clip", "clip_range": 1e-4},
        "optim": {"lr": 1e-4},
        "trainer": {"max_steps": 2, "prompts_per_step": 2, "checkpoint_every": 0, "image_every": 0, **trainer},
    }


TINY_WORLD = {
    "backbone": {"type": "tiny_flux", "resolution": 16, "num_layers": 1, "num_single_layers": 1},
    "prompts": {"type": "list", "prompts": ["a red circle", "two blue squares", "a cat"], "heldout": ["a dog"]},
    "reward": [{"type": "jpeg_compressibility", "scale_kb": 1.0}],
}
TINY_TRAINER = {"max_steps": 2, "prompts_per_step": 2, "checkpoint_every": 0, "image_every": 0, "eval_every": 0}


def shipped_tiny(name: str, overrides: list[str] | tuple[str, ...] = ()) -> Any:
    """A shipped recipe (``recipes/<name>.toml``) with its model, prompts and reward swapped for the tiny
    random FLUX, a prompt list and JPEG compressibility, and a 2-iteration trainer: the method's own parts
    (selector, sampler, kernel, advantage, loss) are exercised unchanged, in seconds."""
    import tomllib

    from flowrl.config.recipe import recipe_from_dict

    data = tomllib.loads((ROOT / "recipes" / f"{name}.toml").read_text())
    data.update({key: value for key, value in TINY_WORLD.items()})
    data["trainer"] = {**data.get("trainer", {}), **TINY_TRAINER}
    data["trainer"].pop("torch_threads", None)
    return recipe_from_dict(data, list(overrides), source=f"recipes/{name}.toml (tiny)")
