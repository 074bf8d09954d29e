"""Imports every built-in component so that it registers itself (the zoo comes in through entry points)."""

from flowrl import (  # noqa: F401
    advantages,
    kernels,
    losses,
    prompts,
    selectors,
)
from flowrl.backbones import (  # noqa: F401  (each base package registers its adapter and tiny twin)
    flux,
    flux2,
    qwen_image,
    sd3,
    wan,
)
from flowrl.parts.samplers import anchor_branch, independent  # noqa: F401
from flowrl.rewards import (  # noqa: F401
    clip_rewards,
    edit_judge,
    feature_preservation,
    hps,
    imagereward,
    jpeg,  # noqa: F401
    ocr,
    preservation,
    remote,
)
from flowrl.suites import builtin as builtin_suites  # noqa: F401
from flowrl.suites import dpgbench as dpgbench_suite  # noqa: F401
from flowrl.suites import geneval as geneval_suite  # noqa: F401
from flowrl.suites import geneval2 as geneval2_suite  # noqa: F401
from flowrl.suites import t2icompbench as t2icompbench_suite  # noqa: F401
from flowrl.suites import unigenbench as unigenbench_suite  # noqa: F401
from flowrl.suites import world_edit as world_edit_suite  # noqa: F401
from flowrl.world import components as world_components  # noqa: F401
from flowrl.world import edit_base, edit_components  # noqa: F401
