"""How a world model denoises: x0 error and how much a token listens to its neighbours, per noise level.

    python scripts/world_probe.py                                  # the shipped base model
    python scripts/world_probe.py flowrl/world/base_model_clean --grid 8

For 32 train-split images, rendered as the model was pre-trained (its saved ``pretrain.toml``: objects on
cells, background levels; ``--grid`` puts objects on other cells, as ``train.object_grid``), noised to
each level ``s``, it prints the mean squared error of the model's clean-image estimate ``x_s - s v`` (and
the images' variance, the error of knowing nothing), then adds unit Gaussian noise to one token (row 3,
column 3 of an 8 x 8 grid, the middle of any other; rings that do not exist print nan) and reports the mean
absolute change of the predicted velocity on that token, on its 8 neighbours, on the 16 tokens two steps
away and on tokens four or more steps away (or at the grid's edge, on a small grid). A denoiser that draws
coherent objects from several tokens must let a token's neighbours move its prediction; docs/world.md has
the figures.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from flowrl.pretrain import load_pretrain_recipe
from flowrl.world.components import BASE_MODEL, WorldTiny
from flowrl.world.grammar import sample_scenes
from flowrl.world.render import Lattice, render_batch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", nargs="?", default="", help="saved world pipeline (default: the shipped base)")
    parser.add_argument("--grid", type=float, default=0.0, help="render objects on this lattice (px at 32 px)")
    parser.add_argument("--levels", default="0.3,0.5,0.8,0.95", help="comma-separated noise levels")
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    backbone = WorldTiny(WorldTiny.Config(path=args.path))
    scenes = sample_scenes("train", 32, 5)
    saved = Path(backbone.config.path or BASE_MODEL) / "pretrain.toml"
    train = load_pretrain_recipe(saved).train if saved.exists() else None
    lattice = Lattice(args.grid) if args.grid else train.lattice() if train else None
    flat = train.background_levels if train else ()
    pixels = render_batch(scenes, 1, lattice=lattice, flat=flat)
    images = torch.from_numpy(pixels).permute(0, 3, 1, 2).float() / 255
    x0 = backbone.encode_images(images)
    cond = backbone.encode([s.text for s in scenes])
    side = backbone.latent_grid()
    rows, cols = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
    probed = side // 2 - 1
    steps = torch.maximum((rows - probed).abs(), (cols - probed).abs()).reshape(-1)
    k = probed * side + probed
    far_ring = min(4, int(steps.max()))  # tokens this many steps away or more (4, or the grid's edge)
    generator = torch.Generator().manual_seed(0)
    print("noise level, clean-image error and variance; velocity change on the nudged token and around it")
    print(f"(far: tokens at least {far_ring} steps from the nudged one, on a {side} x {side} token grid)")
    print(f"{'s':>5} {'x0 mse':>8} {'var x0':>7} | {'self':>6} {'ring 1':>7} {'ring 2':>7} {'far':>7}")
    with torch.no_grad():
        for s in (float(v) for v in args.levels.split(",")):
            eps = torch.randn(x0.shape, generator=generator)
            xs = (1 - s) * x0 + s * eps
            level = torch.full((len(scenes),), s)
            v = backbone.velocity(xs, level, cond)
            mse = float(((xs - s * v - x0) ** 2).mean())
            nudged = xs.clone()
            nudged[:, k] += torch.randn(nudged[:, k].shape, generator=generator)
            change = (backbone.velocity(nudged, level, cond) - v).abs().mean((0, 2))
            ring = [float(change[steps == d].mean()) for d in (1, 2)]
            far = float(change[steps >= far_ring].mean())
            figures = f"{change[k]:6.3f} {ring[0]:7.4f} {ring[1]:7.4f} {far:7.4f}"
            print(f"{s:5.2f} {mse:8.4f} {float(x0.var()):7.4f} | {figures}")


if __name__ == "__main__":
    main()
