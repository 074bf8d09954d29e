"""Conformance checks: the rules every part of every kind must keep, whatever its method. The trainer relies
on them without checking each part's internals.

A plugin author runs them on a new part in an ordinary test::

    from flowrl.conformance import (
        check_advantage, check_backbone, check_kernel, check_loss, check_reward, check_sampler, check_selector,
    )
    check_selector(lambda: MySelector(MySelector.Config(k=2)), schedule)
    check_sampler(lambda: MySampler(MySampler.Config()), backbone, schedule, plan, prompts)
    check_kernel(MyKernel(MyKernel.Config()), schedule)
    check_advantage(MyEstimator(MyEstimator.Config()), rollout, {"hps": 1.0})  # a rollout of its sampler
    check_loss(MyLoss(MyLoss.Config()))  # a PolicyLoss or a ForwardProcessLoss
    check_reward(MyReward(MyReward.Config()), images, prompts, bounds=(0.0, 1.0))
    check_judge(MyJudge(MyJudge.Config()), first, second, prompts)
    check_backbone(lambda: MyBackbone(MyBackbone.Config()), prompts)

Each check raises :class:`ConformanceError` naming the part and the rule that was broken; flowrl's own test
suite runs them over every registered part with the settings of every shipped recipe
(tests/test_conformance*.py). Parts are passed as factories (a callable returning a fresh instance) where a
rule compares two instances.
"""

from flowrl.conformance.advantages import check_advantage
from flowrl.conformance.backbones import check_backbone
from flowrl.conformance.common import ConformanceError
from flowrl.conformance.losses import check_forward_process_loss, check_loss, check_policy_loss
from flowrl.conformance.plans import check_kernel, check_sampler, check_selector
from flowrl.conformance.rewards import check_judge, check_reward

__all__ = [
    "ConformanceError",
    "check_advantage",
    "check_backbone",
    "check_forward_process_loss",
    "check_judge",
    "check_kernel",
    "check_loss",
    "check_policy_loss",
    "check_reward",
    "check_sampler",
    "check_selector",
]
