"""Every file of a run folder and its checkpoints, deleted, truncated and corrupted in turn, under every
command that reads it: exit status 2, one line naming the file, and nothing in the folder changed (the
lock file aside: a train command writes its pid there). The matrix is declared once below (READS, and
BENCH_READS for `flowrl bench --resume` over a bench folder)."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import pytest
from conftest import tiny_recipe

from flowrl.cli.main import main
from flowrl.config.recipe import recipe_from_dict
from flowrl.trainer import train

ALL = ("delete", "truncate", "corrupt")
STEP, BEST = "checkpoints/step_000002", "checkpoints/best"
# file -> {damage: the commands that read it and must refuse it}. Tolerated by design (tested below): a cut
# metrics.jsonl in `report` (its torn last line is dropped), the run's recipe.toml in `report` (shown as text),
# a step checkpoint without trainer_state.json (incomplete: skipped with a note).
READS: dict[str, dict[str, tuple[str, ...]]] = {
    "metrics.jsonl": {"delete": ("report", "resume"), "truncate": ("resume",), "corrupt": ("report", "resume")},
    "recipe.toml": dict.fromkeys(ALL, ("resume",)),
    f"{STEP}/weights.safetensors": dict.fromkeys(ALL, ("eval", "sample", "resume")),
    f"{STEP}/recipe.toml": dict.fromkeys(ALL, ("eval", "sample", "resume")),
    f"{STEP}/trainer_state.json": dict.fromkeys(("truncate", "corrupt"), ("eval", "sample", "resume")),
    f"{STEP}/extra.pt": {"delete": ("resume",), **dict.fromkeys(("truncate", "corrupt"), ("eval", "sample", "resume"))},
    f"{BEST}/weights.safetensors": dict.fromkeys(ALL, ("eval_best",)),
    f"{BEST}/recipe.toml": dict.fromkeys(ALL, ("eval_best",)),
    f"{BEST}/trainer_state.json": dict.fromkeys(ALL, ("eval_best",)),
    f"{BEST}/extra.pt": dict.fromkeys(("truncate", "corrupt"), ("eval_best",)),
}
CASES = [(f, d, c) for f, damages in READS.items() for d, commands in damages.items() for c in commands]


def command(name: str, run: Path, out: Path) -> list[str]:
    return {
        "eval": ["eval", str(run), "--prompts", "1"],
        "eval_best": ["eval", str(run), "--prompts", "1", "--checkpoint", "best"],
        "sample": ["sample", str(run), "--prompt", "a cat", "--per-prompt", "1", "--out", str(out / "s.png")],
        "report": ["report", str(run), "--out", str(out / "r.html")],
        "resume": ["train", str(run / "recipe.toml"), "--output-dir", str(run), "--resume", str(run), "--quiet"],
    }[name]


def damage(path: Path, how: str) -> None:
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[: max(1, path.stat().st_size // 2)])
    else:  # the first bytes overwritten: no format survives it (JSON, TOML, safetensors' header, a pickle)
        data = bytearray(path.read_bytes())
        data[:64] = (b"\x00garbage\xff" * 7)[:64]
        path.write_bytes(bytes(data))


def digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.name != ".lock"}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished 2-step run with step checkpoints 1 and 2 and a best checkpoint."""
    run = tmp_path_factory.mktemp("damaged") / "run"
    train(recipe_from_dict(tiny_recipe(max_steps=2, checkpoint_every=1, eval_every=1, eval_prompts=1)), run, quiet=True)
    return run


def test_the_matrix_covers_every_file_of_the_run(pristine: Path) -> None:
    files = set(digest(pristine)) - {p for p in digest(pristine) if p.startswith(("tb/", "checkpoints/step_000001"))}
    assert files == set(READS), files ^ set(READS)
    assert len(CASES) == 50


@pytest.mark.parametrize(("name", "how", "reader"), CASES, ids=[" ".join(c) for c in CASES])
def test_a_damaged_file_is_named_and_nothing_changes(  # type: ignore[no-untyped-def]
    pristine: Path, tmp_path: Path, capsys, name: str, how: str, reader: str
) -> None:
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    damage(run / name, how)
    before = digest(run)
    code = main(command(reader, run, tmp_path))
    err = capsys.readouterr().err
    assert code == 2, err
    assert Path(name).name in err and "Traceback" not in err, err
    assert digest(run) == before


def test_an_incomplete_last_checkpoint_is_skipped_with_a_note(pristine: Path, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """trainer_state.json is written last (a checkpoint appears whole or not at all): without it the folder
    is an unfinished checkpoint, and the commands use the one before, saying so."""
    run = tmp_path / "run"
    shutil.copytree(pristine, run)
    (run / STEP / "trainer_state.json").unlink()
    assert main(command("eval", run, tmp_path)) == 0
    err = capsys.readouterr().err
    assert f"{STEP.split('/')[1]} is incomplete (no trainer_state.json); using step_000001" in err


# `flowrl bench --resume` reads a run's own files to decide whether to reuse, continue or extend it (a reused run's
# checkpoints are not read). Tolerated by design: a run without final_eval.json is an interrupted one (continued).
BENCH_READS = {"metrics.jsonl": ALL, "recipe.toml": ALL, "final_eval.json": ("truncate", "corrupt")}
BENCH_CASES = [(f, d) for f, damages in BENCH_READS.items() for d in damages]
BENCH = ["--seeds", "0", "--nfe-budget", "64", "--eval-every", "1", "--quiet"]


@pytest.fixture(scope="module")
def bench_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished one-run bench (the tiny recipe, 2 iterations) and its recipe file."""
    root = tmp_path_factory.mktemp("bench")
    data = tiny_recipe(eval_prompts=1)
    recipe = root / "tiny.toml"
    recipe.write_text(recipe_from_dict(data).to_toml())
    assert main(["bench", str(recipe), *BENCH, "--output-dir", str(root / "b")]) == 0
    return recipe, root / "b"


@pytest.mark.parametrize(("name", "how"), BENCH_CASES, ids=[" ".join(c) for c in BENCH_CASES])
def test_bench_resume_names_a_damaged_run_file_and_keeps_the_run(  # type: ignore[no-untyped-def]
    bench_folder: tuple[Path, Path], tmp_path: Path, capsys, name: str, how: str
) -> None:
    recipe, pristine_bench = bench_folder
    folder = tmp_path / "b"
    shutil.copytree(pristine_bench, folder)
    damage(folder / "runs" / "tiny" / "seed0" / name, how)
    before = digest(folder / "runs")
    code = main(["bench", str(recipe), *BENCH, "--output-dir", str(folder), "--resume"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert name in err and "Traceback" not in err, err
    assert digest(folder / "runs") == before
