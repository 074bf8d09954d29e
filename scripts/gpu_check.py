"""GPU smoke check: a few training iterations of random-weight FLUX-class (and SD3) models in bf16.

    python scripts/gpu_check.py                           # CUDA: tiny models, ~1B FLUX, the 2026 bases (minutes)
    python scripts/gpu_check.py --device cpu --tiny-only  # the same code path on a CPU (seconds)

Every model is built locally from a config (no download, random weights) and trained through the shared
trainer (``Trainer.iteration``) with bf16 weights, bf16 autocast (``trainer.mixed_precision = "bf16"``),
fp32 trainable weights and gradient checkpointing. Per model it prints the parameter count, the rollout
throughput (transformer rows per second of rollout time; a CFG step is 2 rows), the mean iteration time
(the first, warm-up iteration left out) and the peak memory (CUDA allocator peak, or the process's peak
RSS on a CPU). For FLUX-class models it also times the same model's plain diffusers inference
(``FluxPipeline.__call__``, same batch, steps and precision) and prints the ratio of the rollout throughput to
it. Every model runs under both update modes (``trainer.update = "recompute"`` and ``"retain"``, as
``name:mode`` cases): the ratio of their iteration times is the recompute-free update's speed-up, and
``retained`` the size of the graphs ``retain`` keeps (docs/performance.md). Without ``--tiny-only`` each
larger model also runs with ``trainer.compile = "default"`` (``name:retain:compile``; its first, warm-up
iteration holds the compilation and is left out like the others). Each case runs in its own
process, so a CUDA fault in one leaves the others measurable; the
script exits 1 if any case crashed or saw a non-finite reward, advantage, loss or gradient norm.
``--attention`` sets ``trainer.attention_kernels`` (default ``no-cudnn``; ``auto`` lets torch pick cuDNN).
The ``:suites`` cases run a few prompts of two evaluation suites (``flowrl suite``) on the tiny and ~1B models.
``--flow-grpo PATH`` (a local clone of the official Flow-GRPO code) then times its trainer beside flowrl's on a
~1B-parameter SD3 (scripts/peer_speed.py, setting ``sd3_1b_cuda``).
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("DIFFUSERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def mid_flux_class() -> type:
    """A FLUX-class backbone of any size built from a :class:`TinyFluxSpec` (with guidance embeddings, as dev),
    used by dotted path (``__main__:MidFlux``) so that nothing is registered."""
    import attrs

    from flowrl.backbones.flux.adapter import FluxAdapter

    class MidFlux(FluxAdapter):
        """A random-weight FLUX-class transformer of configurable size (gpu_check only)."""

        @attrs.frozen
        class Config:
            resolution: int = 128  # latent space, tiny VAE (2x): (resolution / 4)^2 image tokens
            hidden_heads: int = 12  # width = 128 * heads
            num_layers: int = 6  # double-stream blocks
            num_single_layers: int = 12
            text_width: int = 256
            max_sequence_length: int = 64
            guidance: float = 3.5
            dtype: str = "bfloat16"
            build_device: str = "cpu"  # where the random weights are initialised

        def load_pipeline(self) -> Any:
            import torch

            from flowrl.backbones.flux.tiny import TinyFluxSpec, tiny_flux_pipeline

            c = self.config
            spec = TinyFluxSpec(
                image_size=c.resolution,
                pixel_space=False,
                num_layers=c.num_layers,
                num_single_layers=c.num_single_layers,
                attention_head_dim=128,
                num_attention_heads=c.hidden_heads,
                axes_dims_rope=(16, 56, 56),
                joint_attention_dim=c.text_width,
                pooled_projection_dim=c.text_width,
                text_hidden=c.text_width,
                text_heads=4,
                max_length=c.max_sequence_length,
                guidance_embeds=True,
            )
            with torch.device(c.build_device):  # initialise on the GPU: seconds instead of a minute on CPU
                return tiny_flux_pipeline(spec, seed=0)

    MidFlux.__module__ = "__main__"
    MidFlux.__qualname__ = "MidFlux"
    sys.modules["__main__"].MidFlux = MidFlux  # type: ignore[attr-defined]
    return MidFlux


def paper_scale_cases(attention: str) -> list[tuple[str, dict[str, Any]]]:
    """The 2026 bases at their published recipes' token counts, random weights, LoRA as the recipes train them.

    The tiny twins' VAEs downsample less than the real ones, so each resolution here gives the transformer the
    token count of the real model at the recipe's resolution: Qwen-Image 512 px (VAE 8 x patch 2: 32 x 32 = 1,024
    tokens; the twin's 8 px a token: 256 px), FLUX.2 at 1024 px (64 x 64 = 4,096 tokens; the twin's 4 px a token:
    256 px), Wan 2.1 at 240 x 416 with 33 frames (9 latent frames of 15 x 26 tokens = 3,510; the twin's 8 px a
    token and WanPipeline's multiple of 16: 128 x 208, 16 x 26 tokens a frame, 3,744 in all). Widths of 1,536
    (12 heads of 128) and 8 to 12 blocks: 0.5-1.5B parameters, enough for the GPU's kernels to dominate as they
    do at full size; steps, group and guidance are the recipes'. Qwen-Image-Edit is Qwen-Image's transformer at
    512 px with the source's 1,024 tokens appended (2,048 image tokens a forward) and the 12 steps of
    recipes/qwen_image/flow_grpo_edit_pickscore.toml, on the world's edit prompts.
    """
    wide = {"attention_head_dim": 128, "num_attention_heads": 12, "dtype": "bfloat16", "max_sequence_length": 64}
    qwen = {"type": "tiny_qwen_image", "resolution": 256, "num_layers": 8, "axes_dims_rope": [16, 56, 56],
            "true_cfg_scale": 4.0, **wide}
    flux2 = {"type": "tiny_flux2", "resolution": 256, "num_layers": 4, "num_single_layers": 8, **wide}
    wan = {"type": "tiny_wan", "resolution": 128, "height": 128, "width": 208, "num_frames": 33, "num_layers": 8,
           "guidance_scale": 4.5, **wide}
    return [
        ("qwen_image_512", recipe(qwen, lora=True, steps=10, group=4, attention=attention)),
        ("flux2_1024", recipe(flux2, lora=True, steps=8, group=4, attention=attention)),
        ("wan_33x240x416", recipe(wan, lora=True, steps=20, group=2, attention=attention)),
        ("qwen_image_edit_512", edit_prompts(recipe({**qwen, "type": "tiny_qwen_image_edit"}, lora=True, steps=12,
                                                    group=4, attention=attention))),
    ]


def edit_prompts(data: dict[str, Any]) -> dict[str, Any]:
    """A case's recipe on the embedded world's edit prompts (each with its 32 px source image), for an edit base."""
    return {**data, "prompts": {"type": "world_edit"}}


def recipe(backbone: dict[str, Any], lora: bool, steps: int, group: int, attention: str = "no-cudnn") -> dict[str, Any]:
    data: dict[str, Any] = {
        "name": "gpu_check",
        "seed": 0,
        "backbone": backbone,
        "prompts": {"type": "list", "prompts": ["a red circle", "two blue squares", "a cat", "a dog on a beach"]},
        "selector": {"type": "explicit", "units": [[0, 1], [1, 1], [2, 2]]},
        "schedule": {"num_steps": steps, "shift": 3.0},
        "sampler": {"type": "independent", "group_size": group},
        "kernel": {"type": "flow_grpo_sde", "noise_level": 0.7},
        "advantage": {"type": "group_norm"},
        "reward": [{"type": "jpeg_compressibility", "scale_kb": 1.0}],
        "loss": {"type": "ppo_clip", "clip_range": 1e-4},
        "optim": {"lr": 1e-5},
        "trainer": {
            "max_steps": 100,
            "prompts_per_step": 2,
            "train_batch_size": 8,
            "mixed_precision": "bf16",
            "gradient_checkpointing": True,
            "checkpoint_every": 0,
            "image_every": 0,
            "log_every": 1,
            "attention_kernels": attention,
        },
    }
    if lora:
        data["lora"] = {"rank": 8, "alpha": 8.0}
    return data


def pipeline_call(backbone: Any) -> tuple[dict[str, Any], int] | None:
    """The diffusers pipeline's own call settings for this backbone's config (guidance as the adapter applies
    it) and the transformer rows one latent costs a step (2 with classifier-free guidance); None for pipelines
    the baseline does not time."""
    name, config = type(backbone.pipe).__name__, backbone.config
    height = getattr(config, "height", 0) or config.resolution
    width = getattr(config, "width", 0) or config.resolution
    size = {"height": height, "width": width, "max_sequence_length": config.max_sequence_length}
    if name == "FluxPipeline":
        return {**size, "num_images_per_prompt": None, "guidance_scale": getattr(config, "guidance", 3.5)}, 1
    if name == "QwenImagePipeline":
        cfg = float(config.true_cfg_scale)
        extra = {"true_cfg_scale": cfg, "negative_prompt": config.negative_prompt if cfg > 1 else None}
        return {**size, "num_images_per_prompt": None, **extra}, 2 if cfg > 1 else 1
    if name in ("Flux2Pipeline", "Flux2KleinPipeline"):
        guided = name == "Flux2KleinPipeline" and not backbone.pipe.config.is_distilled and config.guidance_scale > 1
        return {**size, "num_images_per_prompt": None, "guidance_scale": config.guidance_scale}, 2 if guided else 1
    if name == "WanPipeline":
        cfg = float(config.guidance_scale)
        extra = {"num_frames": config.num_frames, "guidance_scale": cfg, "negative_prompt": config.negative_prompt}
        return {**size, "num_videos_per_prompt": None, **extra}, 2 if cfg > 1 else 1
    return None


def diffusers_rows_per_s(trainer: Any, data: dict[str, Any], repeats: int = 2) -> float | None:
    """Transformer rows per second of the model's own diffusers pipeline (``__call__``: FLUX.1, Qwen-Image,
    FLUX.2, Wan) with the rollout's batch (prompts x group), steps, resolution, guidance and precision (bf16
    autocast, decoded images as flowrl's rollouts decode them); None for other pipelines. The first call warms
    up and is not timed."""
    import torch

    pipe = getattr(trainer.backbone, "pipe", None)
    call = pipeline_call(trainer.backbone) if pipe is not None else None
    if call is None:
        return None
    settings, rows_per_step = call
    sampler, steps = data["sampler"], data["schedule"]["num_steps"]
    prompts = data["prompts"]["prompts"][: data["trainer"]["prompts_per_step"]]
    per_prompt = next(key for key, value in settings.items() if value is None and key.startswith("num_"))
    kwargs: dict[str, Any] = {
        **settings,
        "prompt": prompts,
        per_prompt: sampler["group_size"],
        "num_inference_steps": steps,
        "output_type": "pt",
    }
    if isinstance(kwargs.get("negative_prompt"), str):  # one per prompt (a lone string covers one prompt's rows)
        kwargs["negative_prompt"] = [kwargs["negative_prompt"]] * len(prompts)
    pipe.set_progress_bar_config(disable=True)
    device = trainer.backbone.device
    seconds = []
    for _ in range(repeats + 1):
        start = time.perf_counter()
        with torch.no_grad(), torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            pipe(**kwargs, generator=torch.Generator(device).manual_seed(0))
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    rows = len(prompts) * sampler["group_size"] * steps * rows_per_step
    return rows / (sum(seconds[1:]) / repeats)


def run_case(name: str, data: dict[str, Any], iterations: int) -> bool:
    import torch

    from flowrl.config.recipe import recipe_from_dict
    from flowrl.trainer.loop import Trainer

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(recipe_from_dict(data), Path(tmp), quiet=True)
        build_s = time.perf_counter() - start
        params = sum(p.numel() for p in trainer.backbone.transformer.parameters())
        rows = []
        for _ in range(iterations):
            nfe = trainer.nfe
            metrics = trainer.iteration()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
            rows.append((trainer.nfe - nfe, metrics))
        retained = max((m.get("update/retained_mb", 0.0) for _, m in rows), default=0.0)
        baseline = diffusers_rows_per_s(trainer, data) if name.endswith(":retain") else None
        trainer.logger.close()
    timed = rows[1:] or rows
    iter_s = sum(m["time/iteration_s"] for _, m in timed) / len(timed)
    nfe_per_s = sum(n for n, _ in timed) / sum(m["time/rollout_s"] for _, m in timed)
    peak_gb = max(m["mem/peak_mb"] for _, m in rows) / 1024
    watched = ("reward/total", "advantage/abs_mean", "loss", "grad_norm")
    bad = sorted({key for _, m in rows for key in watched if not math.isfinite(m[key])})
    finite = not bad and not any(m["skipped_steps"] for _, m in rows)
    print(
        f"{name:<20} {params / 1e6:9.1f}M  build {build_s:6.1f} s  rollout {nfe_per_s:8.1f} NFE/s  "
        f"iteration {iter_s:7.3f} s  peak {peak_gb:6.2f} GB  retained {retained / 1024:5.2f} GB  "
        f"loss {rows[-1][1]['loss']:+.3e}  "
        f"{'ok' if finite else 'NON-FINITE: ' + ', '.join(bad or ['skipped steps'])}",
        flush=True,
    )
    if baseline is not None:  # the goal: flowrl's rollouts at least 0.83x plain diffusers inference
        pipeline = type(trainer.backbone.pipe).__name__
        print(f"{'':<20} diffusers {pipeline} {baseline:8.1f} NFE/s  flowrl / diffusers {nfe_per_s / baseline:.2f}")
    del trainer
    return finite


SUITE_PROMPTS = ("a blue square", "two green squares", "a yellow triangle above a blue square", "three cyan circles")


def run_suite_case(name: str, data: dict[str, Any]) -> bool:
    """Evaluation suites on a case's model: a few prompts of ``drawbench`` (a local prompt file, JPEG
    compressibility as the scorer: no weights) and of ``geneval`` (the embedded world's detector), generated and
    scored by ``flowrl suite run``; prints images per second of each stage (the first prompt batch included)."""
    import contextlib
    import io
    import json

    import torch

    from flowrl.cli.main import main as flowrl_main
    from flowrl.config.tomlwrite import dumps
    from flowrl.suites.geneval import world_metadata

    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        recipe = folder / f"{name.split(':')[0]}.toml"
        recipe.write_text(dumps(data))
        (folder / "db.txt").write_text("".join(p + "\n" for p in SUITE_PROMPTS))
        (folder / "ge.jsonl").write_text("".join(json.dumps({"prompt": p, **world_metadata(p)}) + "\n"
                                                 for p in SUITE_PROMPTS))
        resolution = data["backbone"].get("resolution", 32)
        protocol = ["--protocol", f"resolution={resolution}", "--protocol", "steps=8"]
        for suite, settings in (("drawbench", [f"prompts='{folder / 'db.txt'}'",
                                               'scorers=[{type="jpeg_compressibility"}]']),
                                ("geneval", [f"prompts='{folder / 'ge.jsonl'}'", "detector='world'"])):
            sets = [x for s in settings for x in ("--set", s)]
            times = []
            for stage in ("generate", "score"):
                if torch.cuda.is_available():
                    torch.cuda.synchronize()
                start = time.perf_counter()
                with contextlib.redirect_stdout(io.StringIO()):  # the table: only this row is printed
                    code = flowrl_main(["suite", "run", suite, str(recipe), "--out", str(folder / "out"), "--quiet",
                                        "--stage", stage, "--batch", "8", *protocol, *sets])
                times.append(time.perf_counter() - start)
                ok = ok and code == 0
            summary = folder / "out" / f"{recipe.stem}-initial" / suite / "summary.json"
            images = json.loads(summary.read_text())["images"] if summary.exists() else 0
            print(f"{name + ' ' + suite:<28} {images:3d} images  generate {images / times[0]:7.2f} img/s "
                  f"(model load included)  score {images / times[1]:7.2f} img/s  {'ok' if code == 0 else 'FAILED'}",
                  flush=True)
    return ok


NON_FINITE = 3  # a case's exit status when it ran but saw a non-finite value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--tiny-only", action="store_true", help="skip the ~1B-parameter model")
    parser.add_argument("--iterations", type=int, default=3, help="training iterations per model (>= 2)")
    parser.add_argument("--case", default=None, help="run this case only, in this process")
    parser.add_argument(
        "--attention",
        choices=("auto", "no-cudnn", "math", "efficient", "flash"),
        default="no-cudnn",
        help="trainer.attention_kernels: the CUDA attention kernels allowed (auto: torch's choice, cuDNN included)",
    )
    parser.add_argument("--flow-grpo", type=Path, default=None, help="a local clone of yifan123/flow_grpo: after the"
                        " cases, its trainer beside flowrl's on a ~1B SD3 (scripts/peer_speed.py -s sd3_1b_cuda)")
    args = parser.parse_args(argv)
    if args.device == "cpu":
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # the trainer places everything on CUDA when it sees one
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: CUDA is not available (run with --device cpu --tiny-only to check the script)")
        return 2
    if args.device == "cpu":
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "0")) or torch.get_num_threads()))
    sys.path.insert(0, str(ROOT))
    import flowrl  # noqa: F401  (registers the built-in parts)

    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    if args.case is None:
        print(
            f"gpu_check on {where}: torch {torch.__version__}, bf16 autocast, gradient checkpointing, "
            f"attention kernels {args.attention}"
        )
    tiny = {"resolution": 32, "dtype": "bfloat16"}
    att = args.attention
    cases = [
        (
            "tiny_flux",
            recipe({"type": "tiny_flux", "pixel_space": False, **tiny}, lora=True, steps=8, group=4, attention=att),
        ),
        (
            "tiny_sd3",
            recipe({"type": "tiny_sd3", "guidance_scale": 4.5, **tiny}, lora=False, steps=8, group=4, attention=att),
        ),
    ]
    # the 2026 bases, tiny: the same code paths (true CFG, FLUX.2's packing, video latents) in seconds
    small = {"dtype": "bfloat16", "max_sequence_length": 16}
    cases += [
        ("tiny_qwen_image", recipe({"type": "tiny_qwen_image", "resolution": 32, **small}, lora=True, steps=4,
                                   group=4, attention=att)),
        ("tiny_flux2", recipe({"type": "tiny_flux2", "resolution": 32, **small}, lora=True, steps=4, group=4,
                              attention=att)),
        ("tiny_wan", recipe({"type": "tiny_wan", "resolution": 16, "num_frames": 5, **small}, lora=True, steps=4,
                            group=4, attention=att)),
        ("tiny_qwen_image_edit", edit_prompts(recipe({"type": "tiny_qwen_image_edit", "resolution": 32, **small},
                                                     lora=True, steps=4, group=4, attention=att))),
    ]
    if not args.tiny_only:
        mid_flux_class()  # defined here; the recipe names it by dotted path
        mid = {"type": "__main__:MidFlux", "build_device": args.device}
        cases.append(("mid_flux", recipe(mid, lora=False, steps=8, group=4, attention=att)))
        cases += paper_scale_cases(att)
    # each model under both update modes (docs/performance.md): the rows' iteration times give the ratio
    cases = [(f"{name}:{mode}", {**data, "trainer": {**data["trainer"], "update": mode}})
             for name, data in cases for mode in ("recompute", "retain")]
    # trainer.compile on the GPU: the ~1B FLUX and the paper-scale models compiled, beside their eager rows
    cases += [(f"{name}:compile", {**data, "trainer": {**data["trainer"], "compile": "default"}})
              for name, data in cases if name.endswith(":retain") and not name.startswith("tiny_")]
    # evaluation suites (flowrl suite) on the tiny and the ~1B FLUX-class models: a few prompts of two suites
    cases += [(f"{name.split(':')[0]}:suites", data) for name, data in cases
              if name in ("tiny_flux:retain", "mid_flux:retain")]
    if args.case is not None:
        data = dict(cases)[args.case]
        if args.case.endswith(":suites"):
            return 0 if run_suite_case(args.case, data) else 1
        return 0 if run_case(args.case, data, max(2, args.iterations)) else NON_FINITE
    ok = True
    for name, _ in cases:  # each case in its own process: a CUDA fault in one leaves the others measurable
        command = [sys.executable, __file__, "--case", name, *(argv if argv is not None else sys.argv[1:])]
        returncode = subprocess.run(command).returncode
        if returncode not in (0, NON_FINITE):  # the row was not printed: the case crashed (traceback above)
            print(f"{name:<20} FAILED (exit status {returncode})", flush=True)
        ok = returncode == 0 and ok
    print("gpu_check:", "all finite" if ok else "FAILED: a case crashed or saw non-finite values")
    if args.flow_grpo is not None and args.device == "cuda":
        peers = [sys.executable, str(ROOT / "scripts" / "peer_speed.py"), "--flow-grpo", str(args.flow_grpo), "-s",
                 "sd3_1b_cuda", "--rounds", "2", "--iterations", "3", "--markdown"]
        ok = subprocess.run(peers).returncode == 0 and ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
