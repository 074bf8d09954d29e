"""The recipe's non-component tables: ``[schedule]``, ``[optim]``, ``[trainer]``, ``[lora]``."""

from __future__ import annotations

from typing import Any, Literal

import attrs
from attrs.validators import ge, gt, le, lt

from flowrl.config.update_modes import UpdateMode
from flowrl.core.choices import one_of
from flowrl.utils.lr_schedule import LrDecay
from flowrl.utils.sizes import parse_size

MixedPrecision = Literal["no", "bf16", "fp16"]
CompileMode = Literal["off", "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
Sharding = Literal["none", "fsdp", "hybrid"]
AttentionKernels = Literal["auto", "no-cudnn", "math", "efficient", "flash"]

positive: Any = gt(0)


@attrs.frozen
class ScheduleConfig:
    """The denoising grid rollouts walk and training replays (``[schedule]``): ``num_steps`` steps of the
    backbone's shifted flow-matching schedule. Held-out evaluation uses ``trainer.eval_steps`` steps with the
    same ``shift``.

    ``final_sde = false`` (the default) takes the last step, to noise level 0, by the ODE unless the selector
    trains it: an untrained unit ending there is dropped from every plan, so the image the reward scores is
    the clean estimate ``x - s v`` of the last step's input and no untrained noise reaches the reward.
    ``true`` keeps the selector's plan as it is (a stochastic untrained last step, as earlier flowrl releases ran)."""

    num_steps: int = attrs.field(default=16, validator=ge(1))  # denoising steps (N)
    shift: float = attrs.field(default=3.0, validator=positive)  # schedule shift k
    final_sde: bool = False  # keep an untrained SDE unit ending at noise level 0 (default: that step is ODE)


@attrs.frozen
class OptimConfig:
    """AdamW with gradient clipping (``[optim]``)."""

    lr: float = attrs.field(default=1e-5, validator=positive)
    weight_decay: float = attrs.field(default=1e-4, validator=ge(0))
    beta1: float = attrs.field(default=0.9, validator=[ge(0), le(1)])
    beta2: float = attrs.field(default=0.999, validator=[ge(0), le(1)])
    eps: float = attrs.field(default=1e-8, validator=positive)
    max_grad_norm: float = attrs.field(default=1.0, validator=positive)  # clip the global grad norm to this
    warmup_steps: int = attrs.field(default=0, validator=ge(0))  # linear LR warm-up
    # after the warm-up: "constant", or decay to lr x final_lr_ratio at trainer.max_steps ("linear", "cosine")
    lr_decay: LrDecay = attrs.field(default="constant", validator=one_of(LrDecay))
    final_lr_ratio: float = attrs.field(default=0.1, validator=[ge(0), le(1)])


def _trackers(_: Any, attribute: Any, value: tuple[str, ...]) -> None:
    known = ("tensorboard", "wandb", "swanlab")  # flowrl.trainer.trackers.TRACKERS
    for name in value:
        if name not in known:
            raise ValueError(f"unknown logger {name!r}; expected some of {', '.join(known)}")
    if len(set(value)) != len(value):
        raise ValueError(f"a logger appears twice in {list(value)}")


def _memory_size(_: Any, attribute: Any, value: str | float) -> None:
    """a size, a share of the device's memory, or empty"""
    if value != "":
        parse_size(str(value))  # its ValueError names the value


def _evaluation_figure(_: Any, attribute: Any, value: str) -> None:
    """an eval/... key, "auto" or empty"""
    if value not in ("", "auto") and not value.startswith("eval/"):
        raise ValueError(f"{attribute.name} must be an evaluation figure (eval/...), 'auto' or '', got {value!r}")


@attrs.frozen
class TrainerConfig:
    """The shared loop's settings (``[trainer]``)."""

    max_steps: int = attrs.field(default=100, validator=positive)  # iterations (one optimizer step each)
    max_nfe: int = attrs.field(default=0, validator=ge(0))  # stop once rollouts used this many evaluations; 0: no limit
    # stop after the iteration that ends this many minutes after `run` started (evaluations included); 0: no limit
    max_minutes: float = attrs.field(default=0.0, validator=ge(0))
    prompts_per_step: int = attrs.field(default=4, validator=positive)  # prompts per iteration per process
    train_batch_size: int = attrs.field(default=64, validator=positive)  # transformer inputs per micro-batch
    inner_epochs: int = attrs.field(default=1, validator=positive)  # passes over each rollout batch
    # how the update gets its velocities: "retain" backpropagates through the rollout's own forwards (no
    # second forward; exact with one inner epoch), "recompute" runs the transformer again, "auto" retain
    # where exact (flowrl.config.update_modes, docs/performance.md)
    update: UpdateMode = attrs.field(default="auto", validator=one_of(UpdateMode))
    # split each iteration's prompts into this many chunks, rolled out one after another, each scored in a
    # background thread while the next is rolled out (a slow or served reward; independent samplers only;
    # flowrl.trainer.overlap, docs/performance.md); 0 or 1: off
    overlap_chunks: int = attrs.field(default=0, validator=ge(0))
    mixed_precision: MixedPrecision = attrs.field(default="no", validator=one_of(MixedPrecision))
    ema_decay: float = attrs.field(default=0.0, validator=[ge(0), le(1)])  # 0 disables EMA
    log_every: int = attrs.field(default=1, validator=positive)
    image_every: int = attrs.field(default=10, validator=ge(0))  # TensorBoard image grids; 0 disables
    # where scalars, image grids and the resolved recipe go besides metrics.jsonl: "tensorboard", "wandb",
    # "swanlab" (the last two optional extras; flowrl.trainer.trackers)
    loggers: tuple[str, ...] = attrs.field(default=("tensorboard",), validator=_trackers)
    checkpoint_every: int = attrs.field(default=50, validator=ge(0))  # 0: only the final checkpoint
    keep_checkpoints: int = attrs.field(default=2, validator=positive)
    # checkpoints/best holds the weights with the highest value of this evaluation figure (an `eval/...` key of
    # metrics.jsonl); "auto": eval/strict where the evaluation reports it (the embedded world), else eval/score;
    # "": no best checkpoint. Needs eval_every or eval_every_nfe > 0.
    keep_best: str = attrs.field(default="auto", validator=_evaluation_figure)
    # warn (and flag alert/diversity) when health/diversity (mean of the last 5 iterations) falls below this share
    # of its mean over the first 5; 0: off
    alert_diversity: float = attrs.field(default=0.7, validator=[ge(0), le(1)])
    # warn (and flag alert/reward_vs_eval) when the training reward rose and the evaluation figure fell over
    # this many evaluations in a row; 0: off
    alert_eval_falls: int = attrs.field(default=3, validator=ge(0))
    # health/kl_initial and health/velocity_drift (how far the policy moved from the initial one, on the
    # rollout's transitions) every k iterations and after the last; 0: off. With full fine-tuning this keeps a
    # frozen copy of the initial transformer (its size again in memory); with LoRA it costs nothing to keep.
    kl_every: int = attrs.field(default=10, validator=ge(0))
    eval_every: int = attrs.field(default=0, validator=ge(0))  # held-out evaluation every k iterations; 0 disables
    # held-out evaluation after the iteration whose rollouts cross a multiple of this many NFE (methods with
    # different NFE per iteration are then evaluated at the same budgets); 0 disables; either trigger evaluates
    eval_every_nfe: int = attrs.field(default=0, validator=ge(0))
    eval_prompts: int = attrs.field(default=64, validator=positive)  # how many held-out prompts to score
    eval_seed: int = attrs.field(default=0, validator=[ge(0), lt(2**63)])  # initial noise of the evaluation samples
    eval_steps: int = attrs.field(default=16, validator=positive)  # ODE steps of evaluation samples (any method)
    max_bad_steps: int = attrs.field(default=5, validator=positive)  # consecutive non-finite steps before stopping
    gradient_checkpointing: bool = False
    # the memory the run may use, as a size ("6GiB", "600MB") or a share of the device's memory ("0.8"); "": 90% of
    # what is free when each rollout starts. With trainer.update = retain the rollout keeps whole graphs while they
    # fit under it and checkpointed ones (each block's input only) past it (docs/performance.md)
    memory_budget: str | float = attrs.field(default="", validator=_memory_size)
    # torch.compile the transformer's forward (in place: parameter names, checkpoints and LoRA exports unchanged)
    # with this mode; "off": eager. The first iterations pay the compilation (docs/performance.md gives the
    # measured ratios; on the CPU it can lose)
    compile: CompileMode = attrs.field(default="off", validator=one_of(CompileMode))
    # "fsdp": shard the transformer's parameters, gradients and optimizer state over the processes (torch FSDP2,
    # one unit per transformer block; docs/distributed.md); "hybrid": shard within a node, replicate across
    # nodes (the node's size from the launch: LOCAL_WORLD_SIZE); "none": every process holds the whole model (DDP)
    sharding: Sharding = attrs.field(default="none", validator=one_of(Sharding))
    torch_threads: int = attrs.field(default=0, validator=ge(0))  # CPU threads for torch; 0 keeps torch's default
    # CUDA attention kernels (torch SDPA backends). "no-cudnn" (default): cuDNN's fused attention is off, because
    # its backward failed on FLUX joint attention with torch 2.11 + CUDA 13 on an H200 (illegal memory access,
    # NaN); flash / memory-efficient are used instead (docs/performance.md). "auto": torch's own choice.
    attention_kernels: AttentionKernels = attrs.field(default="no-cudnn", validator=one_of(AttentionKernels))


@attrs.frozen
class LoraConfig:
    """LoRA adapters on the transformer (``[lora]``; omit the table for full fine-tuning)."""

    rank: int = attrs.field(default=32, validator=positive)
    alpha: float = attrs.field(default=64.0, validator=positive)
    dropout: float = attrs.field(default=0.0, validator=[ge(0), le(1)])
    # module names (or name suffixes) that get adapters; omitted: the backbone's own list (``lora_targets``, the
    # projections that base's published LoRA recipes adapt), filled in when the recipe loads
    target_modules: tuple[str, ...] | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.min_len(1))
    )
    # an existing LoRA to start from: a diffusers or peft folder, or a .safetensors file in diffusers, peft or
    # kohya / ComfyUI key naming (flowrl.backbones.lora.load); its rank, alpha and layers are the adapter's, and
    # rank, alpha and target_modules above do not apply. "": start from the base (new adapters)
    init: str = ""
