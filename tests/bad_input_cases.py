"""The malformed inputs of tests/test_bad_input.py: how each is made, the command, and the message it must get
(one :class:`Case` per row of the table in ``docs/errors.md``)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import attrs
from conftest import tiny_recipe

from flowrl.config.tomlwrite import dumps

# -- inputs ----------------------------------------------------------------------------------------
Setup = Callable[[Path, Path], None]  # (case folder, a trained run folder) -> None


def recipe(name: str = "tiny.toml", edit: Callable[[dict], object] = lambda d: None) -> Setup:
    """Write ``tiny_recipe(max_steps=1)`` (after ``edit``) as TOML to ``name``."""

    def setup(folder: Path, run: Path) -> None:
        data = tiny_recipe(max_steps=1)
        edit(data)
        (folder / name).write_text(dumps(data))

    return setup


def write(name: str, content: bytes) -> Setup:
    def setup(folder: Path, run: Path) -> None:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)

    return setup


def write_summary(summary: dict) -> Setup:
    def setup(folder: Path, run: Path) -> None:
        (folder / "result").mkdir()
        (folder / "result" / "summary.json").write_text(json.dumps(summary))

    return setup


def both(*setups: Setup) -> Setup:
    def setup(folder: Path, run: Path) -> None:
        for s in setups:
            s(folder, run)

    return setup


def toml_syntax(folder: Path, run: Path) -> None:
    text = dumps(tiny_recipe(max_steps=1)).replace('name = "tiny"', "name = tiny", 1)
    (folder / "toml-syntax.toml").write_text(text)


def prompt_file(data: dict) -> None:
    data["prompts"] = {"type": "text_file", "path": "prompts.txt"}


def jsonl_prompts(data: dict) -> None:
    data["prompts"] = {"type": "jsonl", "path": "prompts.jsonl"}


def edit_record(image: str = "sources/0.png") -> Setup:
    """``prompts.jsonl`` with one edit record whose source image is ``image`` (relative to the file)."""
    return write("prompts.jsonl", f'{{"prompt": "make the red circle green", "image": "{image}"}}\n'.encode())


def image_file(name: str, mode: str) -> Setup:
    """An 8 x 8 image of ``mode`` saved as ``name`` (its format from the suffix)."""

    def setup(folder: Path, run: Path) -> None:
        from PIL import Image

        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        Image.new(mode, (8, 8)).save(folder / name)

    return setup


def reward(spec: dict) -> Callable[[dict], None]:
    return lambda data: data.update(reward=[spec])


def copy_run(edit: Callable[[Path], object] = lambda run: None) -> Setup:
    """The trained run copied to ``run/`` (then ``edit``-ed), and the recipe it was trained with."""

    def setup(folder: Path, run: Path) -> None:
        shutil.copytree(run, folder / "run")
        shutil.copy(run / "recipe.toml", folder / "tiny.toml")
        edit(folder / "run")

    return setup


CKPT = "run/checkpoints/step_000001"


def no_checkpoints(run: Path) -> None:
    shutil.rmtree(run / "checkpoints")


def truncate_weights(run: Path) -> None:
    weights = run / "checkpoints" / "step_000001" / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def wider_model_recipe(run: Path) -> None:
    """The checkpoint's recipe describes a 4-head model; its weights are from the 2-head one."""
    path = run / "checkpoints" / "step_000001" / "recipe.toml"
    text = path.read_text()
    assert "num_attention_heads = 2" in text
    path.write_text(text.replace("num_attention_heads = 2", "num_attention_heads = 4"))


# -- the table ---------------------------------------------------------------------------------------
@attrs.frozen
class Case:
    """One malformed input: how it is made, the command, and the message it must get.

    ``message`` is the exact start of the report (lines joined by newlines); a trailing ``…`` marks
    text that follows but varies (library versions). ``names`` must appear too: the file or component
    and the key. ``keep`` lists files that must be byte-identical afterwards; ``absent`` paths that
    must not be created.
    """

    id: str
    input: str
    command: tuple[str, ...]
    setup: Setup
    message: str
    names: tuple[str, ...]
    keep: tuple[str, ...] = ()
    absent: tuple[str, ...] = ()
    pythonpath: bool = False

    @property
    def expected(self) -> str:
        return self.message.removesuffix("…")


def recipe_case(id: str, input: str, edit: Callable[[dict], object], line: str, key: str) -> Case:
    return Case(
        id,
        input,
        ("validate", f"{id}.toml"),
        recipe(f"{id}.toml", edit),
        f"recipe error: 1 problem in {id}.toml\n  {line}",
        (f"{id}.toml", key),
    )


KEEP_RUN = ("run/metrics.jsonl", "run/recipe.toml", f"{CKPT}/weights.safetensors", f"{CKPT}/trainer_state.json")
KEEP_RUN_DATA = ("run/metrics.jsonl", f"{CKPT}/weights.safetensors", f"{CKPT}/trainer_state.json")

CASES = [
    # recipes
    Case(
        "toml-syntax",
        "recipe with a TOML syntax error (`name = tiny`, an unquoted string)",
        ("validate", "toml-syntax.toml"),
        toml_syntax,
        "recipe error: 1 problem in toml-syntax.toml\n  [toml] syntax error: Invalid value (at line 1, column 8)",
        ("toml-syntax.toml", "line 1"),
    ),
    recipe_case(
        "unknown-type",
        '`[selector] type = "explicitt"` (misspelt)',
        lambda d: d["selector"].update(type="explicitt"),
        "[selector] unknown selector type 'explicitt'; did you mean 'explicit'? (flowrl ls selector)",
        "[selector]",
    ),
    recipe_case(
        "unknown-key",
        "`[sampler] group_sise = 4` (misspelt key)",
        lambda d: d["sampler"].update(group_sise=d["sampler"].pop("group_size")),
        "[sampler.group_sise] unknown key; did you mean 'group_size'?",
        "[sampler.group_sise]",
    ),
    recipe_case(
        "wrong-type",
        '`[trainer] max_steps = "ten"`',
        lambda d: d["trainer"].update(max_steps="ten"),
        "[trainer.max_steps] expected an integer, got 'ten'",
        "[trainer.max_steps]",
    ),
    recipe_case(
        "out-of-range",
        "`[optim] lr = -1.0`",
        lambda d: d["optim"].update(lr=-1.0),
        "[optim.lr] must be > 0 (got -1.0)",
        "[optim.lr]",
    ),
    recipe_case(
        "not-finite",
        "`[optim] lr = inf` (TOML reads `inf` and `nan` as numbers)",
        lambda d: d["optim"].update(lr=float("inf")),
        "[optim.lr] expected a finite number, got inf",
        "[optim.lr]",
    ),
    recipe_case(
        "reward-weight-nan",
        "`[[reward]] weight = nan`",
        lambda d: d["reward"][0].update(weight=float("nan")),
        "[reward.weight] expected a finite number, got nan",
        "[reward.weight]",
    ),
    recipe_case(
        "model-shape",
        "`[backbone] resolution = 15` for a model with 4-pixel tokens (the library refuses it only when building)",
        lambda d: d["backbone"].update(resolution=15),
        "[backbone.resolution] resolution 15 must be divisible by 4",
        "[backbone.resolution]",
    ),
    Case(
        "rollout-too-large",
        "`[sampler] group_size = 1000000000`: a batch that cannot fit in memory (refused before the first rollout)",
        ("train", "tiny.toml", "--output-dir", "run"),
        recipe(edit=lambda d: d["sampler"].update(group_size=1_000_000_000)),
        "recipe error: 1 problem in tiny.toml\n  [trainer.prompts_per_step] 2 prompts x 1000000000 rollouts"
        " (sampler.group_size) need at least …",
        ("tiny.toml", "trainer.prompts_per_step"),
        absent=("run/metrics.jsonl",),
    ),
    recipe_case(
        "missing-table",
        "no `[kernel]` table",
        lambda d: d.pop("kernel"),
        "[kernel] missing table [kernel] (see flowrl ls kernel)",
        "[kernel]",
    ),
    recipe_case(
        "missing-reward",
        "no `[[reward]]` table",
        lambda d: d.pop("reward"),
        "[reward] missing [[reward]]: at least one reward is needed (flowrl ls reward)",
        "[reward]",
    ),
    recipe_case(
        "group-size-1",
        "`[sampler] group_size = 1`",
        lambda d: d["sampler"].update(group_size=1),
        "[sampler.group_size] group-relative advantages need at least 2 rollouts per prompt, got 1",
        "[sampler.group_size]",
    ),
    recipe_case(
        "steps-beyond-schedule",
        '`[selector] type = "explicit"`, `units = [[0, 1], [3, 2]]` with `[schedule] num_steps = 4`',
        lambda d: d["selector"].update(units=[[0, 1], [3, 2]]),
        "[selector.units] unit ends at step 5, beyond the schedule's 4 steps",
        "[selector.units]",
    ),
    recipe_case(
        "duplicate-reward-name",
        'two `[[reward]]` tables of `type = "jpeg_compressibility"`, neither with a `name`',
        lambda d: d["reward"].append({"type": "jpeg_compressibility", "weight": 0.5}),
        "[reward] two rewards are named 'jpeg_compressibility'; give each [[reward]] a distinct name",
        "[reward]",
    ),
    recipe_case(
        "unknown-table",
        "a `[trainr]` table (misspelt)",
        lambda d: d.update(trainr={"max_steps": 1}),
        "[trainr] unknown table or key; did you mean 'trainer'?",
        "[trainr]",
    ),
    recipe_case(
        "reward-not-importable",
        '`[[reward]] type = "my_rewards:Aesthetic"`, a dotted path to a module that is not importable',
        reward({"type": "my_rewards:Aesthetic"}),
        "[reward] cannot import 'my_rewards' for 'my_rewards:Aesthetic': No module named 'my_rewards'",
        "[reward]",
    ),
    Case(
        "set-without-equals",
        "a `--set` override without `=`",
        ("show", "tiny.toml", "--set", "sampler.group_size"),
        recipe(),
        "error: argument --set: expected KEY=VALUE such as trainer.max_steps=10, got 'sampler.group_size'"
        " (see flowrl show --help)",
        ("--set",),
    ),
    Case(
        "set-below-a-value",
        "a `--set` key below a plain value (`sampler.group_size.x=1`)",
        ("show", "tiny.toml", "--set", "sampler.group_size.x=1"),
        recipe(),
        "recipe error: 1 problem in tiny.toml\n  [--set] sampler.group_size is a value (4), not a table, so "
        "sampler.group_size.x cannot be set",
        ("tiny.toml", "--set"),
    ),
    Case(
        "set-wrong-type",
        "a `--set` override whose value has the wrong type",
        ("show", "tiny.toml", "--set", "sampler.group_size=many"),
        recipe(),
        "recipe error: 1 problem in tiny.toml\n  [sampler.group_size] expected an integer, got 'many'",
        ("tiny.toml", "[sampler.group_size]"),
    ),
    Case(
        "output-dir-is-a-file",
        "`--output-dir afile/run` where `afile` is an existing file",
        ("train", "tiny.toml", "--output-dir", "afile/run"),
        lambda folder, run: (recipe()(folder, run), (folder / "afile").write_text("notes\n")),
        "error: --output-dir afile/run: afile is a file, not a folder; choose another --output-dir",
        ("afile", "--output-dir"),
        keep=("afile",),
    ),
    Case(
        "recipe-missing",
        "a recipe file that does not exist",
        ("train", "missing.toml"),
        lambda folder, run: None,
        "error: argument recipe: missing.toml: no such recipe file; check the path (see flowrl train --help)",
        ("missing.toml", "recipe"),
    ),
    Case(
        "recipe-not-utf8",
        'a recipe saved as Latin-1 (`name = "café"`)',
        ("validate", "recipe-not-utf8.toml"),
        write("recipe-not-utf8.toml", 'name = "café"\n'.encode("latin-1")),
        "recipe error: 1 problem in recipe-not-utf8.toml\n"
        "  [file] cannot read: 'utf-8' codec can't decode byte 0xe9 in position 11…",
        ("recipe-not-utf8.toml", "[file]"),
    ),
    # prompt files
    Case(
        "prompt-file-missing",
        '`[prompts] type = "text_file"`, `path = "prompts.txt"`; no such file',
        ("train", "tiny.toml"),
        recipe(edit=prompt_file),
        "error: [prompts.path] prompt file prompts.txt: no such file (a relative path starts at the working directory)",
        ("prompts.txt", "[prompts.path]"),
    ),
    Case(
        "prompt-file-empty",
        "as above; `prompts.txt` holds only blank lines",
        ("train", "tiny.toml"),
        both(recipe(edit=prompt_file), write("prompts.txt", b"\n  \n")),
        "error: [prompts.path] prompt file prompts.txt: no prompts (the file is empty); write one prompt per line",
        ("prompts.txt", "[prompts.path]"),
        keep=("prompts.txt",),
    ),
    Case(
        "prompt-file-not-utf8",
        "as above; `prompts.txt` saved as Latin-1 (`a café`)",
        ("train", "tiny.toml"),
        both(recipe(edit=prompt_file), write("prompts.txt", "a red circle\na café\n".encode("latin-1"))),
        "error: [prompts.path] prompt file prompts.txt: not UTF-8 text (byte 18); save it as UTF-8",
        ("prompts.txt", "[prompts.path]"),
        keep=("prompts.txt",),
    ),
    # prompt files with condition images (JSONL)
    Case(
        "jsonl-not-json",
        '`[prompts] type = "jsonl"`, `path = "prompts.jsonl"`; a record is not JSON (a missing closing brace)',
        ("train", "tiny.toml"),
        both(recipe(edit=jsonl_prompts), write("prompts.jsonl", b'{"prompt": "make the red circle green"\n')),
        "error: [prompts.path] prompt file prompts.jsonl, record 1 (line 1): not JSON (Expecting ',' delimiter,"
        " column 39); write one JSON object a line",
        ("prompts.jsonl", "[prompts.path]", "record 1"),
        keep=("prompts.jsonl",),
    ),
    Case(
        "jsonl-image-missing",
        'as above; the record\'s `"image": "sources/0.png"` does not exist',
        ("train", "tiny.toml"),
        both(recipe(edit=jsonl_prompts), edit_record()),
        "error: [prompts.path] prompt file prompts.jsonl, record 1 (line 1): image sources/0.png: no such file"
        " (image paths are relative to the prompt file)",
        ("prompts.jsonl", "[prompts.path]", "record 1", "sources/0.png"),
        keep=("prompts.jsonl",),
    ),
    Case(
        "jsonl-image-unreadable",
        "as above; `sources/0.png` holds text, not an image",
        ("train", "tiny.toml"),
        both(recipe(edit=jsonl_prompts), edit_record(), write("sources/0.png", b"not an image")),
        "error: [prompts.path] prompt file prompts.jsonl, record 1 (line 1): image sources/0.png: not an image PIL"
        " can read (PNG, JPEG, WebP, ...)",
        ("prompts.jsonl", "[prompts.path]", "record 1", "sources/0.png"),
        keep=("prompts.jsonl", "sources/0.png"),
    ),
    Case(
        "jsonl-image-mode",
        "as above; the image is a CMYK JPEG",
        ("train", "tiny.toml"),
        both(recipe(edit=jsonl_prompts), edit_record("sources/0.jpg"), image_file("sources/0.jpg", "CMYK")),
        "error: [prompts.path] prompt file prompts.jsonl, record 1 (line 1): image sources/0.jpg: mode CMYK, which"
        " flowrl does not take; save it as RGB",
        ("prompts.jsonl", "[prompts.path]", "record 1", "sources/0.jpg"),
        keep=("prompts.jsonl", "sources/0.jpg"),
    ),
    Case(
        "jsonl-image-count-for-the-base",
        "as above; a readable RGB source image, but the recipe's backbone is a text-to-image base",
        ("train", "tiny.toml", "--output-dir", "run"),
        both(recipe(edit=jsonl_prompts), edit_record(), image_file("sources/0.png", "RGB")),
        "error: [prompts.path] prompt file prompts.jsonl, record 1 (line 1): has 1 image; the backbone 'tiny_flux'"
        " takes none (a text-to-image base)",
        ("prompts.jsonl", "[prompts.path]", "record 1", "tiny_flux"),
        keep=("prompts.jsonl", "sources/0.png"),
        absent=("run/metrics.jsonl",),
    ),
    recipe_case(
        "edit-reward-on-text-prompts",
        '`[[reward]] type = "world_edit_verifier"` (reads each prompt\'s source image) with text-only prompts',
        lambda d: d.update(reward=[{"type": "world_edit_verifier"}]),
        "[reward] 'world_edit_verifier' needs each prompt's condition images (it scores the result against them),"
        " but [prompts] type = 'list' gives prompts without any (a text-to-image task); use prompts with condition"
        " images (an edit task) or a reward that scores the result alone",
        "[reward]",
    ),
    # checkpoints: flowrl eval
    Case(
        "eval-missing",
        "`flowrl eval` of a folder that does not exist",
        ("eval", "no_such_run"),
        lambda folder, run: None,
        "error: argument path: no_such_run: no such run folder, checkpoint folder or recipe; check the path"
        " (see flowrl eval --help)",
        ("no_such_run",),
        absent=("no_such_run",),
    ),
    Case(
        "eval-no-checkpoint",
        "`flowrl eval` of a run folder without `checkpoints/step_*/`",
        ("eval", "run"),
        copy_run(no_checkpoints),
        "error: run: no checkpoint found (expected run/checkpoints/step_*/)",
        ("run", "checkpoints/step_*"),
        keep=("run/metrics.jsonl", "run/recipe.toml"),
    ),
    Case(
        "eval-truncated",
        "`flowrl eval` of a run whose `weights.safetensors` was cut to half its size",
        ("eval", "run"),
        copy_run(truncate_weights),
        f"error: checkpoint {CKPT}: weights.safetensors is truncated or corrupt (SafetensorError: …",
        (CKPT, "weights.safetensors"),
        keep=KEEP_RUN,
    ),
    Case(
        "eval-other-model",
        "`flowrl eval` of a checkpoint whose weights are from a model of another size "
        "(its `recipe.toml` says `num_attention_heads = 4`, the weights have 2 heads)",
        ("eval", CKPT),
        copy_run(wider_model_recipe),
        f"error: checkpoint {CKPT}: weights are from another model ('context_embedder.bias' has shape (32,),"
        f" this model's (64,)); use the recipe the checkpoint was written with ({CKPT}/recipe.toml)",
        (CKPT, "context_embedder.bias"),
        keep=KEEP_RUN,
    ),
    # checkpoints: flowrl train --resume
    Case(
        "resume-missing",
        "`--resume` of a folder that does not exist",
        ("train", "tiny.toml", "--resume", "no_such_run"),
        recipe(),
        "error: argument --resume: no_such_run: no such run or checkpoint folder; check the path"
        " (see flowrl train --help)",
        ("no_such_run", "--resume"),
        absent=("no_such_run",),
    ),
    Case(
        "resume-no-checkpoint",
        "`--resume` of a run folder without `checkpoints/step_*/` (its `metrics.jsonl` stays)",
        ("train", "tiny.toml", "--resume", "run"),
        copy_run(no_checkpoints),
        "error: --resume run: no checkpoint found (expected run/checkpoints/step_*/)",
        ("--resume run", "checkpoints/step_*"),
        keep=("run/metrics.jsonl", "run/recipe.toml"),
    ),
    Case(
        "resume-truncated",
        "`--resume` of a run whose `weights.safetensors` was cut to half its size",
        ("train", "tiny.toml", "--resume", "run"),
        copy_run(truncate_weights),
        f"error: checkpoint {CKPT}: weights.safetensors is truncated or corrupt (SafetensorError: …",
        (CKPT, "weights.safetensors"),
        keep=KEEP_RUN,
    ),
    Case(
        "resume-wider-model",
        "`--resume` with a recipe for a wider model than the checkpoint's (refused before the model loads: a"
        " resume may change only `[trainer]` and `[optim]`)",
        ("train", "tiny.toml", "--resume", "run", "--set", "backbone.num_attention_heads=4"),
        copy_run(),
        "recipe error: 1 problem in tiny.toml\n  [backbone.num_attention_heads] is 4 but the run being resumed used 2"
        f" ({CKPT}/recipe.toml); a resumed run keeps its method, model, rewards and seed: resume with the run's"
        " recipe.toml, or start a new run",
        ("tiny.toml", "backbone.num_attention_heads"),
        keep=(*KEEP_RUN_DATA, "run/recipe.toml"),
    ),
    Case(
        "resume-checkpoint-without-recipe",
        "`--resume` from a checkpoint whose `recipe.toml` is gone (the resumed recipe cannot be checked against"
        " it)",
        ("train", "tiny.toml", "--resume", "run", "--set", "backbone.num_layers=2"),
        copy_run(lambda run: (run / "checkpoints" / "step_000001" / "recipe.toml").unlink()),
        f"error: checkpoint {CKPT}: recipe.toml is missing (a resumed run is checked against it); use another"
        " checkpoint (an earlier step_* folder)",
        (CKPT, "recipe.toml"),
        keep=KEEP_RUN_DATA,
    ),
    # rewards
    # a reward that raises is not bad input but a bug in its code: tests/test_user_parts.py (its traceback shown)
    Case(
        "reward-always-nan",
        '`[[reward]] type = "test_reliability:NaNOnSecondCall"`, `always = true`: NaN in every iteration of a '
        "run shorter than `max_bad_steps`",
        ("train", "tiny.toml"),
        recipe(edit=reward({"type": "test_reliability:NaNOnSecondCall", "always": True})),
        "error: the run trained nothing: 1 iteration, 1 skipped for NaN or inf, the others without a transition "
        "to train (check the rewards and the selector's trained units)",
        ("trained nothing",),
        pythonpath=True,
    ),
    Case(
        "reward-returns-list",
        '`[[reward]] type = "test_bad_input:ReturnsList"`, `name = "colour"`: a list of floats, not a tensor',
        ("train", "tiny.toml"),
        recipe(edit=reward({"type": "test_bad_input:ReturnsList", "name": "colour"})),
        "error: reward 'colour' returned a list; score() must return a tensor of shape (8,)",
        ("'colour'", "score()"),
        pythonpath=True,
    ),
    Case(
        "reward-wrong-shape",
        '`[[reward]] type = "test_bad_input:WrongShape"`, `name = "colour"`: scores of shape (B, 3)',
        ("train", "tiny.toml"),
        recipe(edit=reward({"type": "test_bad_input:WrongShape", "name": "colour"})),
        "error: reward 'colour' returned shape (8, 3), expected (8,)",
        ("'colour'", "shape"),
        pythonpath=True,
    ),
    # suites
    Case(
        "suite-empty-prompts",
        "`flowrl suite run drawbench` with `--set prompts='empty.txt'`, a prompt file with no prompt",
        ("suite", "run", "drawbench", "tiny.toml", "--out", "results", "--set", "prompts='empty.txt'"),
        both(recipe(), write("empty.txt", b"\n\n")),
        "error: empty.txt: no prompts in the file",
        ("empty.txt", "no prompts"),
        absent=("results",),
    ),
    Case(
        "suite-summary-edited",
        "`flowrl suite compare` of a result folder whose `summary.json` lost its `per_prompt` list (edited by hand)",
        ("suite", "compare", "result"),
        write_summary({"suite": "world", "tag": "t", "protocol": {}, "figures": {}, "prompts": [], "categories": []}),
        "error: result/summary.json: 'per_prompt' is missing or not a list; score result again (--stage score)",
        ("result/summary.json", "'per_prompt'"),
        keep=("result/summary.json",),
    ),
]
