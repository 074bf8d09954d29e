"""The interfaces of flowrl's parts. Subclass one, give it an attrs ``Config``, and register it.

Every component is constructed as ``Component(config)`` and keeps its config in ``self.config``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Literal, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from flowrl.core.conditions import TEXT_ONLY, ConditionSpec
from flowrl.core.contracts import refuses
from flowrl.core.errors import PartError
from flowrl.core.levels import accepting_floats, as_levels
from flowrl.core.rng import RolloutRNG
from flowrl.core.types import (
    Advantages,
    Conditioning,
    ForwardProcessInputs,
    LossInputs,
    Plan,
    RewardBatch,
    Rollout,
    Schedule,
    StepOutput,
)

HALF_LOG_2PI_E = 0.5 * math.log(2 * math.pi * math.e)


class Component:
    """Base of every part: holds the validated config."""

    Config: Any
    registered_name: str = ""  # the name it was registered under (set by the registry)
    needs_reference: bool = False  # the part reads the initial policy (a KL term, a probe): the trainer keeps one
    # optional backbone capabilities the part calls (protocols such as AttentionEntropyProbe): a recipe whose
    # backbone lacks one is refused when it loads, naming the part, the capability and the backbones offering it
    needs_backbone: tuple[type, ...] = ()

    def __init__(self, config: Any) -> None:
        self.config = config

    @staticmethod
    def check_config(config: Any) -> Iterable[tuple[str, str]]:
        """Problems with these settings that would otherwise surface only when the part is built (a model
        shape the library refuses): ``(key within the part's table, message)`` pairs. Run by every recipe
        load, so ``flowrl validate`` reports them without building anything. None by default."""
        return ()

    @staticmethod
    def check_steps(config: Any, num_steps: int) -> Iterable[tuple[str, str]]:
        """Problems with these settings given the recipe's ``schedule.num_steps`` (a step index beyond it, a
        window that does not fit): ``(key, message)`` pairs, reported by every recipe load. None by default."""
        return ()

    def state_dict(self) -> dict[str, Any]:
        """State that must survive a checkpoint (a window position, a cache); empty by default."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""

    # What the part hands on to the recipe (tokens such as "tree") and what it requires of the other parts
    # (flowrl.core.contracts.Need: a token some part must provide, or one none may): validate refuses a recipe whose
    # parts do not meet, in one line naming both parts. Either a class attribute or a staticmethod of the config;
    # a subclass adds to its bases' declarations (docs/composition.md).
    provides: Any = frozenset()
    requires: Any = ()


class TransitionKernel(Component, ABC):
    """A denoising transition ``x_s -> x_{s_next}``: a Gaussian with a mean and a std (std 0: ODE)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "mean_std" in cls.__dict__:  # every kernel's mean_std also takes its noise levels as plain numbers
            cls.mean_std = accepting_floats(cls.__dict__["mean_std"])  # type: ignore[method-assign]

    @abstractmethod
    def mean_std(self, x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, s_at_one: float) -> tuple[Tensor, Tensor]:
        """Mean (shaped like ``x``) and std (shape ``(B,)``) of the next latent, in fp32.

        ``x`` and ``v`` (the predicted velocity) are latents ``(B, ...)``; ``s`` and ``s_next`` float tensors of
        shape ``(B,)`` (a number, e.g. ``schedule.sigmas[i]``, is taken for every row); ``s_at_one`` is the
        grid's second noise level (``schedule.s_at_one``; Flow-GRPO uses it where ``1 - s`` is 0).
        """

    def step(self, x: Tensor, v: Tensor, s: Tensor, s_next: Tensor, s_at_one: float, noise: Tensor) -> StepOutput:
        """Take the transition with the given standard-normal ``noise``; returns next latent and log-density."""
        mean, std = self.mean_std(x.float(), v.float(), s.float(), s_next.float(), s_at_one)
        nxt = mean + _expand(std, mean) * noise.float()
        return StepOutput(next=nxt, mean=mean, std=std, log_prob=self.log_prob(nxt, mean, std))

    def log_prob(self, x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
        """The per-row log-density the losses' ratios use: the Gaussian's, averaged over dimensions."""
        return gaussian_log_prob(x, mean, std)

    def std_only(self, s: Tensor, s_next: Tensor, s_at_one: float) -> Tensor:
        """The std alone ``(B,)`` (it never depends on the latent); used for entropy analysis. ``s`` and ``s_next``:
        float tensors ``(B,)``, or numbers (one row)."""
        batch = next((int(t.shape[0]) for t in (s, s_next) if isinstance(t, Tensor)), 1)
        s = as_levels(s, batch, "cpu", f"{type(self).__name__}.std_only: s")
        s_next = as_levels(s_next, batch, "cpu", f"{type(self).__name__}.std_only: s_next")
        zeros = torch.zeros((s.shape[0], 1))
        return self.mean_std(zeros, zeros, s.float(), s_next.float(), s_at_one)[1]


def _expand(std: Tensor, like: Tensor) -> Tensor:
    return std.reshape(std.shape + (1,) * (like.dim() - std.dim()))


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Diagonal-Gaussian log-density in fp32, averaged over all non-batch dimensions.

    A row with std 0 (an ODE step, or the last step to ``s = 0``) is a point mass: its value is ``+inf``
    (meaningless, never trained), computed without NaN in the forward or the backward pass.
    """
    x, mean, std = x.float(), mean.float(), _expand(std.float(), mean)
    positive = std > 0
    safe = torch.where(positive, std, torch.ones_like(std))
    per_dim = -((x - mean) ** 2) / (2 * safe**2) - torch.log(safe) - 0.5 * math.log(2 * math.pi)
    per_dim = torch.where(positive, per_dim, torch.full_like(per_dim, math.inf))
    return per_dim.flatten(1).mean(1)


def entropy_per_dim(std: Tensor) -> Tensor:
    """Per-dimension entropy (nats) of an isotropic Gaussian with this std: ``0.5 log(2 pi e) + log std``."""
    return HALF_LOG_2PI_E + torch.log(std.double()).float()


class TimestepSelector(Component, ABC):
    """Decides which steps are stochastic and trained, and how steps merge, at each iteration."""

    @abstractmethod
    def plan(self, schedule: Schedule, iteration: int, generator: torch.Generator) -> Plan:
        """The plan for this iteration."""

    def observe(self, backbone: Backbone, prompts: list[str], schedule: Schedule) -> None:
        """Called by the loop before :meth:`plan` with this iteration's prompts; selectors that look at the
        model (AEGPO's attention entropy) probe it here. No-op by default."""


class Backbone(Component, ABC):
    """A flow-matching text-to-image model behind one small interface (velocity in, images out).

    ``nfe`` counts transformer evaluations (one per row the transformer runs: one per latent per call of
    :meth:`velocity`, two for a guided model); ``module`` is the callable transformer. The trainer changes
    them only through methods: :meth:`use_module` (its distributed wrapper), :meth:`module_swapped` (a
    frozen reference copy), :meth:`set_reference` and :meth:`uncounted` (evaluation is not part of the
    training budget).
    """

    nfe: int = 0
    # the transformer's layers a recipe's ``[lora]`` adapts when it omits ``target_modules`` (suffixes of module
    # names): a base overrides it with the projections its published LoRA recipes adapt
    lora_targets: tuple[str, ...] = ("to_q", "to_k", "to_v", "to_out.0")
    device: torch.device = torch.device("cpu")

    @classmethod
    def accepts(cls, config: Any) -> ConditionSpec:
        """The condition images this base takes with a prompt's text (flowrl.core.conditions): none by default, a
        text-to-image (or text-to-video) base. An edit base says how many, of which modes, and documents how it
        prepares them; its ``encode`` reads them with :func:`~flowrl.core.conditions.conditions_of`. Asked of the class
        and its config, before the model loads."""
        return TEXT_ONLY

    @classmethod
    def default_lora_targets(cls, config: Any) -> tuple[str, ...]:
        """The targets a ``[lora]`` without ``target_modules`` gets for this config: :attr:`lora_targets` unless
        a base's list depends on the model (FLUX.2's per-block names, which differ between dev and klein)."""
        return tuple(cls.lora_targets)
    forward_s: float = 0.0  # seconds spent in transformer forwards (for the time-outside-the-model share)
    module: nn.Module  # what velocity() calls: the transformer, or the trainer's distributed wrapper of it
    _reference: Callable[[], AbstractContextManager[None]] | None = None

    def to(self, device: torch.device) -> Backbone:
        """Move the model to ``device`` (adapters move their whole pipeline)."""
        self.transformer.to(device)
        self.device = device
        return self

    @property
    @abstractmethod
    def transformer(self) -> nn.Module:
        """The module that training updates (LoRA is applied to it)."""

    @abstractmethod
    def encode(self, prompts: list[str]) -> Conditioning:
        """Prompt conditioning, one row per prompt (cached per prompt where possible)."""

    @property
    @abstractmethod
    def latent_shape(self) -> tuple[int, ...]:
        """The shape of one latent (without the batch dimension)."""

    def noise(self, n: int, generator: torch.Generator) -> Tensor:
        """``n`` initial latents ``x_1 ~ N(0, I)`` from one generator."""
        return torch.randn((n, *self.latent_shape), generator=generator).to(self.device)

    @abstractmethod
    def velocity(self, x: Tensor, s: Tensor, cond: Conditioning) -> Tensor:
        """The predicted velocity ``v ~ eps - x0`` at noise levels ``s`` (shape ``(B,)``)."""

    @abstractmethod
    def decode(self, x: Tensor) -> Tensor:
        """Images ``(B, 3, H, W)`` in [0, 1] from final latents; a video backbone gives clips ``(B, F, 3, H, W)``
        (frames-major: ``clip[:, f]`` is a batch of images; :mod:`flowrl.utils.video`)."""

    def reference_policy(self) -> AbstractContextManager[None]:
        """Inside this context the backbone evaluates the base (initial) policy; the trainer installs it."""
        if self._reference is None:
            raise NotImplementedError("no reference policy is installed (the trainer provides one)")
        return self._reference()

    def set_reference(self, factory: Callable[[], AbstractContextManager[None]]) -> None:
        """Install the reference policy: ``factory()`` is a context inside which :meth:`velocity` evaluates the
        base policy (LoRA switched off, or a frozen copy swapped in). An untrained model may pass
        ``contextlib.nullcontext``: it is its own reference."""
        self._reference = factory

    def use_module(self, module: nn.Module) -> None:
        """From now on :meth:`velocity` calls ``module`` (a distributed wrapper of :attr:`transformer`)."""
        self.module = module

    @contextmanager
    def module_swapped(self, module: nn.Module) -> Iterator[None]:
        """Inside this context :meth:`velocity` calls ``module`` instead (a frozen copy of the base policy)."""
        saved = self.module
        self.module = module
        try:
            yield
        finally:
            self.module = saved

    @contextmanager
    def uncounted(self) -> Iterator[None]:
        """Transformer evaluations inside this context are not added to :attr:`nfe` (evaluation, previews)."""
        saved = self.nfe
        try:
            yield
        finally:
            self.nfe = saved

    def schedule_sigmas(self, num_steps: int, shift: float) -> tuple[float, ...]:
        """The sampling grid; the shifted flow-matching schedule unless a backbone needs another."""
        from flowrl.core.schedule import shifted_sigmas

        return tuple(float(s) for s in shifted_sigmas(num_steps, shift))


@runtime_checkable
class AttentionEntropyProbe(Protocol):
    """An optional backbone capability: the softmax entropy of its image-query attention rows (AEGPO's probe).

    A backbone has it by defining :meth:`velocity_and_entropy`; parts that need it ask
    ``isinstance(backbone, AttentionEntropyProbe)`` and say which backbones to use when it is missing.
    """

    def velocity_and_entropy(self, x: Tensor, s: Tensor, cond: Conditioning, options: Any) -> tuple[Tensor, Tensor]:
        """The velocity and the mean attention entropy per latent ``(B,)`` from one probed forward (no grad),
        counted in ``nfe`` like :meth:`Backbone.velocity`; ``options`` says what is measured (None: defaults)."""
        ...


class RolloutSampler(Component, ABC):
    """Generates the group of rollouts for each prompt from a plan.

    What ``trainer.overlap_chunks`` (:mod:`flowrl.trainer.overlap`) may do with a sampler is declared here,
    never inferred from its class: :attr:`chunkable` and :meth:`precomputed_scores`.
    """

    # The prompts can be rolled out in separate calls (no prompt's rollouts depend on another prompt's):
    # trainer.overlap_chunks then splits an iteration's prompts into chunks and scores each chunk while the
    # next is rolled out. False runs the sampler exactly as without overlap. A subclass inherits its base's.
    chunkable: bool = False

    @abstractmethod
    def rollout(
        self, backbone: Backbone, prompts: list[str], plan: Plan, schedule: Schedule, rng: RolloutRNG
    ) -> Rollout:
        """Sample images and record the trained transitions; every random draw goes through ``rng``."""

    def rollout_count(self, plan: Plan, num_prompts: int) -> int:
        """How many rollouts :meth:`rollout` returns for ``num_prompts`` prompts under ``plan`` (the memory
        pre-check sizes the iteration with it; the conformance checks hold it to what :meth:`rollout` does).
        This default is one group per prompt: ``plan.group_sizes``, else ``config.group_size`` (1 without one).
        A sampler that shapes its groups otherwise (a tree, a group per trained unit) declares its own."""
        return sum(plan.sizes(num_prompts, int(getattr(self.config, "group_size", 1))))

    def precomputed_scores(self, reward: str, images: Tensor) -> Tensor | None:
        """The scores of reward ``reward`` for ``images`` that this sampler computed while rolling them out,
        which the loop's reward phase takes instead of scoring again; None (the default): score them there.
        The overlap wrapper answers for exactly its last joined images."""
        return None


class RewardError(PartError, RuntimeError):
    """A reward model raised or returned the wrong shape; the message names the component."""


class RewardModel(Component, ABC):
    """Scores images against prompts, batched. Higher is better.

    Video: a reward with ``video = True`` receives whole clips ``(B, F, 3, H, W)``; any other reward scores a
    clip as the mean over the frames its ``frames`` chooses (set from the recipe's ``[[reward]] frames``; None:
    8 evenly spaced; :mod:`flowrl.rewards.frames`).
    """

    video: bool = False  # scores whole clips (B, F, 3, H, W) rather than images
    frames: Any = None  # which frames of a clip an image reward scores (flowrl.utils.video.frame_indices)

    def check(self) -> None:
        """Fail early (before any model loads) when weights or extras are missing."""

    @classmethod
    def needs_conditions(cls, config: Any) -> bool:
        """Whether this reward reads each prompt's condition images (flowrl.core.conditions) and cannot score without
        them: an edit reward compares the result with its source. False by default: a text-only reward scores the
        result alone, on any task, an edit task included. Asked of the class and its config, before anything is
        built; ``flowrl validate`` and ``flowrl train`` refuse a reward that needs them on prompts without any."""
        return False

    @abstractmethod
    def score(self, images: Tensor, prompts: list[str]) -> Tensor:
        """Scores ``(B,)`` for images ``(B, 3, H, W)`` in [0, 1]."""

    def eval_metrics(self, images: Tensor, prompts: list[str]) -> dict[str, float]:
        """Evaluation figures for a batch; by default the mean score as ``score``."""
        return {"score": float(self.score(images, prompts).mean())}


class AdvantageEstimator(Component, ABC):
    """Turns rewards and the rollout structure into one advantage per rollout."""

    # False: the advantages come with the rollouts (a sampler's labels in Rollout.extras, such as offline
    # preference pairs), not from the rewards, which are only logged; the conformance rules then hold the
    # advantages to not depending on the rewards instead of to the rules of reward-driven estimators.
    reads_rewards: bool = True

    @abstractmethod
    def __call__(self, rewards: RewardBatch, rollout: Rollout) -> Advantages:
        """Advantages for every rollout."""


class Loss(Component, ABC):
    """The training objective: a :class:`PolicyLoss` (on recorded transitions) or a
    :class:`ForwardProcessLoss` (on re-noised final latents); the trainer picks the update by which it is."""


class PolicyLoss(Loss):
    """The objective on recorded transitions (PPO-style likelihood ratios of the sampler's SDE steps).

    Two optional contracts for trust-region objectives:

    - ``needs_old_mean``: the loss reads ``LossInputs.old_mean``, each transition's mean under the rollout-time
      policy (the trainer keeps the means of the first inner epoch, computed before any optimizer step of the
      iteration, for the later ones).
    - :meth:`gradient_scale`: at the trust-region centre the gradient with respect to each log-density is
      ``-k A w gradient_scale(std, dt)``, one ``k > 0`` for all transitions; a loss that weights transitions
      by their noise level says how here (the conformance rules check it).
    """

    needs_old_mean: bool = False
    provides = frozenset({"policy_loss"})  # flowrl.core.contracts: a subclass keeps this token and adds its own
    requires = (
        refuses(
            "no_trained_units",
            "a policy loss trains the transitions of the plan's trained units, so it would train nothing; use a"
            " forward-process loss, or a selector that trains units",
        ),
    )

    @abstractmethod
    def __call__(self, batch: LossInputs) -> tuple[Tensor, dict[str, float]]:
        """The scalar loss and statistics to log (``clip_frac`` at least)."""

    def gradient_scale(self, std: Tensor, dt: Tensor) -> Tensor:
        """Per-transition factor of the policy gradient at the centre, from the noise level; 1 by default."""
        return torch.ones_like(std.float())


class ForwardProcessLoss(Loss):
    """An objective on the forward (noising) process of the rollouts' final latents: no log-densities, so any
    sampler works (DiffusionNFT). The trainer re-noises each row's ``x0`` (:meth:`rows`: by default each rollout)
    at ``sample_times`` and calls :meth:`forward_process`."""

    # flowrl.core.contracts: a subclass keeps this token and adds its own
    provides = frozenset({"forward_process_loss"})

    def sample_times(self, n: int, generator: torch.Generator) -> Tensor:
        """Noise levels ``t`` in (0, 1) at which rollouts are re-noised; uniform by default."""
        return torch.rand(n, generator=generator).clamp(1e-3, 1 - 1e-3)

    def levels(self) -> int:
        """Noise levels per rollout and update (1 by default): the trainer repeats each rollout's row this many
        times, consecutively, before ``sample_times`` (so rows ``k i .. k i + k - 1`` are rollout ``i``), and
        each copy is re-noised with its own time and noise."""
        return 1

    def rows(self, advantages: Tensor, prompt: Tensor) -> tuple[Tensor, Tensor]:
        """The loss rows of an update and how they are re-noised, from each rollout's advantage and prompt row (this
        process's rollouts): ``(rollout, draw)``, one entry per row. ``rollout[j]`` is the rollout row ``j`` trains;
        rows with the same ``draw[j]`` are re-noised with one time and one noise (a pair compared at the same point).
        ``draw`` counts up from 0 and never decreases, and rows that share a draw share a prompt, so a micro-batch
        never splits them (the trainer checks both). Default: each rollout :meth:`levels` times, consecutively, each
        copy its own draw. A loss that trains some rollouts only (none at all in an iteration is allowed) or compares
        rows at shared noise says so here, and reads ``ForwardProcessInputs.draw``."""
        rollout = torch.arange(int(advantages.shape[0])).repeat_interleave(int(self.levels()))
        return rollout, torch.arange(int(rollout.shape[0]))

    def lagged_decay(self, updates: int) -> float | None:
        """What ``ForwardProcessInputs.v_old`` is. None (the default): the rollout-time policy's velocity. A
        decay ``d`` in [0, 1]: the trainer keeps a lagged copy of the trained weights, ``old <- d old + (1 - d)
        theta`` after each optimizer step (``updates``: the steps taken, that one included), and ``v_old`` is
        the copy's velocity. Asked once with ``updates = 0`` to decide; it must then answer a number for every
        count."""
        return None

    def samples_from_lagged(self) -> bool:
        """True: the rollouts are sampled by the lagged copy of :meth:`lagged_decay` (which must then be a number),
        so the old policy both samples and gives ``v_old``; False (the default): by the trained weights."""
        return False

    @abstractmethod
    def forward_process(self, batch: ForwardProcessInputs) -> tuple[Tensor, dict[str, float]]:
        """The scalar loss and statistics for a micro-batch of re-noised rollouts."""


class PromptSource(Component, ABC):
    """Where prompts come from: a text file, a list, the embedded world."""

    @abstractmethod
    def sample(self, n: int, generator: torch.Generator) -> list[str]:
        """``n`` training prompts."""

    def heldout(self) -> list[str]:
        """Evaluation prompts (defaults to none)."""
        return []

    @classmethod
    def gives_conditions(cls, config: Any) -> Literal["all", "none", "some"] | None:
        """Whether the prompts this source gives carry condition images: ``"all"`` (an edit task), ``"none"`` (a
        text-to-image task), ``"some"``, or None when only the built source can tell (the default: its
        :meth:`condition_records` are looked at). Asked of the class and its config, before anything is built."""
        return None

    def condition_records(self) -> Iterable[tuple[str, str]]:
        """The prompts whose condition images (flowrl.core.conditions) are held to what the backbone takes before it
        loads, each with where it came from for the message (``"[prompts.path] prompt file F, record N:"``). By
        default the held-out prompts; a source that reads a file gives every record of it."""
        return ((f"[prompts] held-out prompt {i + 1} ({str(p)[:40]!r}):", p) for i, p in enumerate(self.heldout()))
