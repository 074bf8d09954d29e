"""The embedded world: a procedural text-to-image task with a verifiable reward (a miniature GenEval).

:mod:`~flowrl.world.grammar` defines prompts and splits, :mod:`~flowrl.world.render` draws ground-truth
images and :mod:`~flowrl.world.verify` scores any image against a prompt.
"""

from flowrl.world.grammar import (
    COLOUR_NAMES,
    COLOURS,
    HELDOUT_PAIRS,
    KINDS,
    PRETRAIN_SPLITS,
    RELATIONS,
    SHAPES,
    SPLITS,
    TRAIN_PAIRS,
    ObjectGroup,
    Relation,
    Scene,
    balanced_scenes,
    enumerate_scenes,
    max_prompt_words,
    parse,
    sample_scenes,
    scene_split,
    vocabulary,
)
from flowrl.world.render import render, render_batch
from flowrl.world.verify import Detection, Verdict, detect, score_batch, verify, verify_batch

__all__ = [
    "COLOURS",
    "COLOUR_NAMES",
    "HELDOUT_PAIRS",
    "KINDS",
    "PRETRAIN_SPLITS",
    "RELATIONS",
    "SHAPES",
    "SPLITS",
    "TRAIN_PAIRS",
    "Detection",
    "ObjectGroup",
    "Relation",
    "Scene",
    "Verdict",
    "balanced_scenes",
    "detect",
    "enumerate_scenes",
    "max_prompt_words",
    "parse",
    "render",
    "render_batch",
    "sample_scenes",
    "scene_split",
    "score_batch",
    "verify",
    "verify_batch",
    "vocabulary",
]
