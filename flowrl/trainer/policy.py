"""The trained policy: the transformer the loop updates, with its optimizer, LR schedule, EMA, reference policy
and, for losses that ask for one, a lagged copy of its weights.

Built once per run from the recipe: LoRA adapters (``[lora]``) or full fine-tuning, gradient checkpointing,
AdamW with a linear warm-up; then either accelerate's preparation (DDP when there are several processes) or
FSDP2 sharding (``trainer.sharding = "fsdp"``, :mod:`flowrl.trainer.sharding`). What a checkpoint needs comes
from here: full tensors for the weights and the LoRA export (gathered from every process when sharded, so
those methods are collectives), and this process's slices of the optimizer and EMA state when sharded.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from flowrl.backbones.lora.export import lora_state_dict
from flowrl.config.recipe import Recipe, RecipeError
from flowrl.core.interfaces import Backbone
from flowrl.trainer.ema import EMA
from flowrl.trainer.lagged import LaggedPolicy
from flowrl.trainer.lora import add_lora
from flowrl.trainer.reference import install_reference
from flowrl.trainer.sharding import (
    full,
    gathered,
    load_local_optimizer_state,
    shard,
    shard_group,
    slice_full_optimizer_state,
    to_local_tree,
    whole,
)
from flowrl.trainer.state_io import apply_optim_settings, load_weights_into
from flowrl.utils.lr_schedule import lr_factor


class TrainedPolicy:
    """The transformer under training and everything that updates it."""

    def __init__(self, backbone: Backbone, recipe: Recipe, accelerator: Any, reference_needed: bool,
                 lagged: bool = False) -> None:
        cfg, o = recipe.trainer, recipe.optim
        self.backbone, self.accelerator = backbone, accelerator
        self.sharded = cfg.sharding != "none"
        # the processes one copy of the weights is sharded over (hybrid: a node's; checkpoints record it)
        self.shard_group = shard_group(cfg.sharding == "hybrid", accelerator.num_processes) if self.sharded else 0
        self.lora = recipe.lora is not None
        transformer = backbone.transformer
        if recipe.lora is not None:
            try:
                add_lora(transformer, recipe.lora, type(backbone).default_lora_targets(backbone.config))
            except ValueError as error:  # peft: e.g. no module matches target_modules
                raise RecipeError(recipe.source, [("lora", f"cannot attach the adapters: {error}")]) from error
        else:
            transformer.requires_grad_(True)
        if cfg.gradient_checkpointing:
            transformer.enable_gradient_checkpointing()  # type: ignore[operator]
        if cfg.compile != "off":  # in place (nn.Module.compile): the module, its parameters and their names stay
            transformer.compile(mode=cfg.compile)
        for p in transformer.parameters():  # trained parameters (LoRA too) stay fp32 whatever the backbone's dtype
            if p.requires_grad:
                p.data = p.data.float()
        needed = reference_needed or cfg.kl_every > 0
        self.frozen: nn.Module | None = None  # a sharded run's frozen reference copy (full fine-tuning)
        if self.sharded:  # the frozen reference is copied from the whole transformer, then sharded like it

            def sharded(module: nn.Module) -> nn.Module:
                return shard(module, accelerator.device, cfg.mixed_precision, self.shard_group)

            def sharded_reference(module: nn.Module) -> nn.Module:
                self.frozen = sharded(module)
                return self.frozen

            self.reference = install_reference(backbone, self.lora, needed, prepare=sharded_reference)
            sharded(transformer)
        self.named_params = [(n, p) for n, p in transformer.named_parameters() if p.requires_grad]
        params = [p for _, p in self.named_params]
        # the fused kernel (one pass over all parameters: 8.6 ms a step against 23-25 ms for the 2.73M-parameter
        # world model on one CPU thread) where torch has it; sharded parameters (DTensors) keep the default
        fused = not self.sharded and all(p.device.type in ("cpu", "cuda") for p in params)
        optimizer = torch.optim.AdamW(
            params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps, weight_decay=o.weight_decay, fused=fused or None
        )
        steps = cfg.max_steps * cfg.inner_epochs  # optimizer steps of the whole run (the decay's horizon)

        def factor(k: int) -> float:
            return lr_factor(k, o.warmup_steps, o.lr_decay, steps, o.final_lr_ratio)

        self.lr_schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
        if self.sharded:
            module: nn.Module = transformer
            self.optimizer: Any = optimizer
        else:
            module, self.optimizer = accelerator.prepare(transformer, optimizer)
        backbone.use_module(module)
        self.ema = EMA(self.named_params, cfg.ema_decay) if cfg.ema_decay > 0 else None
        if not self.sharded:
            self.reference = install_reference(backbone, self.lora, needed)
        self.lagged: LaggedPolicy | None = None  # the lagged copy, for a loss that asks for one (wants_lagged)
        if lagged:
            if self.sharded:  # load_recipe refuses the combination (recipe.cross_checks)
                raise ValueError("a lagged copy of the weights needs unsharded weights")
            self.lagged = LaggedPolicy(self.named_params)

    @property
    def module(self) -> nn.Module:
        return self.backbone.module

    def inference(self, reference: bool = False) -> AbstractContextManager[None]:
        """The context of a no-gradient phase (probes, rollouts, evaluation): when sharded, every process holds
        the full weights inside it (and the frozen reference's with ``reference``), so each can call the model
        as often as its own data needs (flowrl.trainer.sharding.whole); otherwise nothing."""
        if not self.sharded:
            return nullcontext()
        return whole([self.backbone.transformer, *([self.frozen] if reference and self.frozen is not None else [])])

    def sampling(self, from_lagged: bool) -> AbstractContextManager[None]:
        """The context of the rollout's sampling (no gradients): the lagged copy's weights where the loss samples
        with them (``from_lagged``, :func:`flowrl.trainer.lagged.samples_from_lagged`), else the trained ones."""
        return self.lagged.weights() if from_lagged and self.lagged is not None else nullcontext()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def clip_grad_norm(self, max_norm: float) -> float:
        """Clip the gradients to ``max_norm`` (global norm over every process); the norm before clipping."""
        params = [p for _, p in self.named_params]
        if self.sharded:
            norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        else:
            norm = self.accelerator.clip_grad_norm_(params, max_norm)
        return float(full(norm))

    def step(self) -> None:
        """One optimizer step, the LR schedule and the EMA after it."""
        self.optimizer.step()
        self.lr_schedule.step()
        if self.ema is not None:
            self.ema.update()

    @property
    def lr(self) -> float:
        return float(self.lr_schedule.get_last_lr()[0])

    # -- checkpoints -------------------------------------------------------------------------------
    def weights(self) -> dict[str, Tensor]:
        """Full CPU copies of the trained parameters (a collective when sharded)."""
        return gathered(self.named_params)

    def lora_layers(self) -> dict[str, Tensor] | None:
        """The LoRA adapter's tensors under diffusers keys, full (a collective when sharded); None without LoRA."""
        return lora_state_dict(self.backbone.transformer) if self.lora else None

    def state(self) -> dict[str, Any]:
        """Optimizer, LR schedule and EMA state: this process's slices when sharded (see :meth:`load`)."""
        local = to_local_tree if self.sharded else (lambda x: x)
        return {
            "optimizer": local(self.optimizer.state_dict()),
            "lr_schedule": self.lr_schedule.state_dict(),
            "ema": local(self.ema.state_dict()) if self.ema is not None else None,
            **({"lagged": self.lagged.state_dict()} if self.lagged is not None else {}),
        }

    def load(self, weights: dict[str, Tensor], state: dict[str, Any], source: Path, optim: Any, sliced: bool) -> None:
        """Restore weights (full tensors) and :meth:`state` (``sliced``: this process's slices, as a sharded run
        with as many processes wrote them; else full, from an unsharded run or merged from every slice), then put
        ``optim``'s (the recipe's) learning rate and Adam settings in force (a resumed run may change them)."""
        load_weights_into(self.backbone.transformer, weights, source)
        if self.sharded:
            optimizer_state = state["optimizer"]
            if not sliced:
                optimizer_state = slice_full_optimizer_state(self.optimizer, optimizer_state)
            load_local_optimizer_state(self.optimizer, optimizer_state)
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.lr_schedule.load_state_dict(state["lr_schedule"])
        if self.ema is not None and state.get("ema") is not None:
            self.ema.load_state_dict(state["ema"])
        if self.lagged is not None and state.get("lagged") is not None:
            self.lagged.load_state_dict(state["lagged"])
        betas = (optim.beta1, optim.beta2)
        apply_optim_settings(self.optimizer, self.lr_schedule, optim.lr, betas, optim.eps, optim.weight_decay)

    def non_finite(self, weights: dict[str, Tensor]) -> str | None:
        """The first parameter name with a NaN or inf in ``weights`` (full tensors), or None."""
        return next((n for n, w in weights.items() if not bool(torch.isfinite(w).all())), None)
