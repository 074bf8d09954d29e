"""Where a run's scalars, image grids and resolved recipe go besides ``metrics.jsonl``: ``trainer.loggers``.

``tensorboard`` (the default, a core dependency) writes ``tb/``; ``wandb`` (Weights & Biases) and ``swanlab``
are optional extras, imported only when a recipe names them. Each gets the same things: every numeric metric
of an iteration at its step, the image grids, and the resolved recipe as the run's config. The run id of a
hosted tracker is kept in the run folder (``trackers.json``), so ``--resume`` continues the same run there.
``WANDB_MODE=offline`` / ``SWANLAB_MODE=offline`` (or ``disabled``) work as those tools document; the project
is ``WANDB_PROJECT`` / ``SWANLAB_PROJECT``, default ``flowrl``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import uuid
from pathlib import Path
from typing import Any

from torch import Tensor

from flowrl.core.errors import UserError

TRACKERS = ("tensorboard", "wandb", "swanlab")
EXTRAS = {"wandb": "wandb", "swanlab": "swanlab"}  # tracker -> (module, pyproject extra of the same name)
IDS_FILE = "trackers.json"


class TrackerError(UserError):
    """A tracker named in ``trainer.loggers`` cannot start (its extra is missing)."""


def missing_extra(name: str) -> str | None:
    """The one-line problem of a tracker whose package is not installed, else None."""
    module = EXTRAS.get(name)
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return (f"logger '{name}' needs the {module} package, which is not installed: pip install {module} (or, in a flowrl"
            f" checkout, pip install -e '.[{name}]')")


def tracker_problems(names: tuple[str, ...]) -> list[tuple[str, str]]:
    """``(key, why)`` for each tracker of ``trainer.loggers`` that cannot start; run by ``flowrl validate`` and
    by the trainer before any model loads."""
    return [("trainer.loggers", why) for name in names if (why := missing_extra(name)) is not None]


def run_id(run_dir: Path, name: str) -> str:
    """The hosted run id of ``name`` for this run folder: made once, kept in ``trackers.json``."""
    path = run_dir / IDS_FILE
    ids = json.loads(path.read_text()) if path.exists() else {}
    if name not in ids:
        ids[name] = f"{run_dir.name[:40]}-{uuid.uuid4().hex[:8]}".lower().replace(".", "-")
        path.write_text(json.dumps(ids, indent=2) + "\n")
    return str(ids[name])


class TensorBoard:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tb"))
        if config:
            self.writer.add_text("recipe", "```\n" + json.dumps(config, indent=2) + "\n```", 0)

    def scalars(self, values: dict[str, float], step: int) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)

    def image(self, tag: str, grid: Tensor, step: int) -> None:
        self.writer.add_image(tag, grid, step)

    def histogram(self, tag: str, values: Tensor, step: int) -> None:
        self.writer.add_histogram(tag, values, step)

    def close(self) -> None:
        self.writer.flush()
        self.writer.close()


def _pixels(grid: Tensor) -> Any:
    """A ``(3, H, W)`` grid in [0, 1] as ``(H, W, 3)`` uint8 pixels."""
    return (grid.clamp(0, 1) * 255).round().byte().permute(1, 2, 0).numpy()


class Wandb:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=os.environ.get("WANDB_PROJECT", "flowrl"), name=run_dir.name, id=run_id(run_dir, "wandb"),
            resume="allow", dir=str(run_dir), config=config,
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(values, step=step)

    def image(self, tag: str, grid: Tensor, step: int) -> None:
        self.run.log({tag: self.wandb.Image(_pixels(grid))}, step=step)

    def histogram(self, tag: str, values: Tensor, step: int) -> None:
        self.run.log({tag: self.wandb.Histogram(values.numpy())}, step=step)

    def close(self) -> None:
        self.run.finish()


class SwanLab:
    def __init__(self, run_dir: Path, config: dict[str, Any]) -> None:
        import swanlab

        self.swanlab = swanlab
        self.run = swanlab.init(
            project=os.environ.get("SWANLAB_PROJECT", "flowrl"), experiment_name=run_dir.name,
            id=run_id(run_dir, "swanlab"), resume="allow", logdir=str(run_dir / "swanlog"), config=config,
        )

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.swanlab.log(values, step=step)

    def image(self, tag: str, grid: Tensor, step: int) -> None:
        self.swanlab.log({tag: self.swanlab.Image(_pixels(grid))}, step=step)

    def histogram(self, tag: str, values: Tensor, step: int) -> None:
        pass  # SwanLab has no histogram panel; TensorBoard keeps them

    def close(self) -> None:
        self.swanlab.finish()


def check_trackers(names: tuple[str, ...]) -> None:
    """:class:`TrackerError` naming the first tracker of ``trainer.loggers`` whose package is missing."""
    problems = tracker_problems(names)
    if problems:
        raise TrackerError(f"{problems[0][0]}: {problems[0][1]}")


def open_trackers(names: tuple[str, ...], run_dir: Path, config: dict[str, Any]) -> list[Any]:
    """Start each tracker of ``trainer.loggers``; :class:`TrackerError` naming the extra when one is missing
    (checked for all before any starts)."""
    check_trackers(names)
    kinds = {"tensorboard": TensorBoard, "wandb": Wandb, "swanlab": SwanLab}
    return [kinds[name](Path(run_dir), config) for name in names]
