"""The command line as a user runs it: exit codes, one-line errors, no tracebacks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import ROOT

import flowrl


def flowrl_cli(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "flowrl.cli.main", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=600
    )


def test_ls_lists_every_kind_with_summaries() -> None:
    out = flowrl_cli("ls")
    assert out.returncode == 0, out.stderr
    for kind in flowrl.KINDS:
        assert f"{kind}:" in out.stdout
        for name in flowrl.available(kind):
            line = next(line for line in out.stdout.splitlines() if line.strip().startswith(name + " "))
            text = line.split(None, 1)[1]
            assert len(text) > 10 and text.endswith((".", ")", "!", "?")), line  # a whole sentence, not cut


def test_validate_shipped_recipes() -> None:
    # a served reward's recipe needs its server running: tests/test_serve.py validates it with one
    recipes = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "recipes").glob("*.toml") if "remote" not in p.stem)
    out = flowrl_cli("validate", *recipes)
    assert out.returncode == 0, out.stdout + out.stderr


def test_bad_recipe_exit_2_names_both_problems(tmp_path: Path) -> None:
    text = (ROOT / "recipes" / "flow_grpo.toml").read_text()
    text = text.replace('type = "flow_grpo_prefix"', 'type = "flow_grpo_prefx"')
    text = text.replace("group_size = 8", "group_sise = 8")
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    for command in (("validate", str(bad)), ("train", str(bad)), ("show", str(bad))):
        out = flowrl_cli(*command)
        assert out.returncode == 2, command
        text_out = out.stdout + out.stderr
        assert "Traceback" not in text_out
        assert f"recipe error: 2 problems in {bad}" in text_out
        assert "[selector] unknown selector type 'flow_grpo_prefx'; did you mean 'flow_grpo_prefix'?" in text_out
        assert "[sampler.group_sise] unknown key; did you mean 'group_size'?" in text_out


def test_show_prints_resolved_recipe() -> None:
    out = flowrl_cli("show", "recipes/flow_grpo.toml", "--set", "sampler.group_size=3")
    assert out.returncode == 0, out.stderr
    assert "group_size = 3" in out.stdout
    assert "max_grad_norm = 1.0" in out.stdout  # a default filled in


def test_missing_checkpoint_is_a_user_error(tmp_path: Path) -> None:
    out = flowrl_cli("eval", str(tmp_path))
    assert out.returncode == 2
    assert "no checkpoint found" in out.stderr and "Traceback" not in out.stderr


def test_entropy_writes_a_plot_only_when_asked(tmp_path: Path) -> None:
    recipe = str(ROOT / "recipes" / "egrpo.toml")
    out = flowrl_cli("entropy", recipe, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "units (start, merge)" in out.stdout and not any(tmp_path.iterdir())
    out = flowrl_cli("entropy", recipe, "--plot", "e.png", cwd=tmp_path)
    assert out.returncode == 0 and (tmp_path / "e.png").stat().st_size > 1000


def test_entropy_says_when_the_last_unit_became_an_ode_step(tmp_path: Path) -> None:
    """DanceGRPO's selector makes every step SDE; with schedule.final_sde = false the last one is an ODE step,
    and the listing of one unit fewer says so (it used to list 15 of 16 without a word)."""
    out = flowrl_cli("entropy", str(ROOT / "recipes" / "dance_grpo.toml"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    listed = next(line for line in lines if line.startswith("units (start, merge)"))
    n = lines[0].split("N = ")[1].split(",")[0]
    assert listed.split(": ", 1)[1].count("(") == int(n) - 1
    assert f"(the selector chose {n}; its last, ({int(n) - 1}, 1), ends at noise level 0 untrained" in out.stdout
    out = flowrl_cli("entropy", str(ROOT / "recipes" / "dance_grpo.toml"), "--set", "schedule.final_sde=true",
                     cwd=tmp_path)
    assert out.returncode == 0 and "the selector chose" not in out.stdout


def test_a_plot_needs_a_file_name_with_its_format(tmp_path: Path) -> None:
    # matplotlib would write "outdir.png" for "outdir" while the command said "wrote outdir"
    out = flowrl_cli("entropy", str(ROOT / "recipes" / "egrpo.toml"), "--plot", "outdir", cwd=tmp_path)
    assert out.returncode == 2 and "expected a file name ending in .png, .pdf or .svg, got 'outdir'" in out.stderr
    assert not any(tmp_path.iterdir()) and "Traceback" not in out.stderr


def test_checkpoint_choice_is_checked_before_any_work(tmp_path: Path) -> None:
    out = flowrl_cli("eval", str(tmp_path), "--checkpoint", "newest")
    assert out.returncode == 2 and "expected last, best or a step number, got 'newest'" in out.stderr
    out = flowrl_cli("eval", str(tmp_path), "--checkpoint", "best")
    assert out.returncode == 2 and "no best checkpoint" in out.stderr and "Traceback" not in out.stderr


def test_a_checkpoint_choice_inside_a_checkpoint_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "run" / "checkpoints" / "step_000002"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text("{}")
    for which in ("best", "1"):
        out = flowrl_cli("eval", str(folder), "--checkpoint", which)
        assert out.returncode == 2 and "Traceback" not in out.stderr
        assert f"{folder} is a checkpoint folder, so checkpoint '{which}' cannot be chosen in it" in out.stderr


def test_a_recipe_saved_with_a_byte_order_mark_validates(tmp_path: Path) -> None:
    recipe = tmp_path / "bom.toml"
    recipe.write_bytes(b"\xef\xbb\xbf" + (ROOT / "recipes" / "flow_grpo.toml").read_bytes())  # Windows editors
    out = flowrl_cli("validate", str(recipe))
    assert out.returncode == 0, out.stdout + out.stderr


def test_entropy_tabulates_the_backbones_own_grid(tmp_path: Path) -> None:
    """A backbone sampling on its pipeline's grid (FLUX.2's mu shift) is tabulated on that grid, as training
    samples it; a model not on this machine is tabulated on flowrl's grid, and the command says so."""
    out = flowrl_cli("entropy", str(ROOT / "recipes" / "smoke" / "flux2.toml"), cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    header = out.stdout.splitlines()[0]
    assert "grid: the backbone's (diffusers), as training samples it; schedule.shift is not used" in header
    assert "shift = " not in header
    backbone = flowrl.build("backbone", {"type": "tiny_flux2", "resolution": 32, "max_sequence_length": 16})
    step1 = next(line.split() for line in out.stdout.splitlines() if line.split()[:1] == ["1"])
    assert float(step1[1]) == round(backbone.schedule_sigmas(6, 3.0)[1], 3)
    out = flowrl_cli("entropy", str(ROOT / "recipes" / "flux2" / "egrpo_hps.toml"), cwd=tmp_path)
    assert out.returncode == 0 and "not the backbone's 'diffusers' one" in out.stdout.splitlines()[0]


def test_ls_a_part_prints_its_settings() -> None:
    """`flowrl ls egrpo_entropy` was refused; it prints the part's class, description and every setting."""
    out = flowrl_cli("ls", "egrpo_entropy", "world")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("selector egrpo_entropy (flowrl_zoo.egrpo.selector.")
    for setting in ("tau        float = 1.0", "budget     float = 0.5  (> 0, <= 1", "max_merge  int = 8"):
        assert setting in out.stdout, out.stdout
    assert "prompts world (" in out.stdout and "suite world (" in out.stdout  # a name used by two kinds: both
    refused = flowrl_cli("ls", "egrpo_entropi")
    assert refused.returncode == 2 and "expected a kind" in refused.stderr
