"""Every option of every command, with every bad value its declared kind names (flowrl.cli.options): exit
status 2 and one line naming the option, before anything loads. The cases are generated from the
declarations, not listed by hand."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import pytest

from flowrl.cli.main import main, parser
from flowrl.cli.options import Kind, declared, subparsers, undeclared

PLACEHOLDER = Path(tempfile.mkdtemp(prefix="flowrl-options-"))  # only the labels of bad values are kept


def name_of(action: argparse.Action) -> str:
    return action.option_strings[-1] if action.option_strings else str(action.metavar or action.dest)


def cases() -> list[tuple[str, str, str]]:
    out = []
    for command, sub in subparsers(parser()).items():
        for action in declared(sub):
            if isinstance(action.type, Kind):
                out += [(command, name_of(action), label) for label, _ in action.type.bad(PLACEHOLDER)]
    return out


CASES = cases()


def test_every_option_declares_its_kind() -> None:
    missing = {command: undeclared(sub) for command, sub in subparsers(parser()).items()}
    assert not {c: m for c, m in missing.items() if m}, missing
    assert len(CASES) > 100  # 11 commands, every option with 2-5 bad values


def command_line(command: str, target: str, value: str, tmp: Path) -> list[str]:
    """The command with every required argument valid and ``target`` given ``value``."""
    sub = subparsers(parser())[command]
    argv = command.split()  # a nested command: "suite run"
    for action in declared(sub):
        name = name_of(action)
        if not action.option_strings:
            if name == target:
                argv.append(value)
            elif action.nargs != "*":
                argv.append(action.type.good(tmp))  # type: ignore[union-attr]
        elif name == target:
            argv.append(f"{name}={value}")
        elif action.required:
            argv.append(f"{name}={action.type.good(tmp)}")  # type: ignore[union-attr]
    return argv


@pytest.mark.parametrize(("command", "option", "label"), CASES, ids=[" ".join(c) for c in CASES])
def test_a_bad_value_is_one_line_and_exit_2(command: str, option: str, label: str, tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    sub = subparsers(parser())[command]
    action = next(a for a in declared(sub) if name_of(a) == option)
    value = dict(action.type.bad(tmp_path))[label]  # type: ignore[union-attr]
    code = main(command_line(command, option, value, tmp_path))
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and f"argument {option}" in lines[0] and "Traceback" not in err, err


def test_split_on_prompts_without_splits_is_refused(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    """--split applies only where the prompts have splits (the embedded world): elsewhere it is refused with
    one line naming it, not reported as an unknown recipe key."""
    from conftest import tiny_recipe

    from flowrl.config.recipe import recipe_from_dict

    recipe = tmp_path / "tiny.toml"
    recipe.write_text(recipe_from_dict(tiny_recipe()).to_toml())
    assert main(["eval", str(recipe), "--split", "novel"]) == 2
    err = capsys.readouterr().err
    assert "--split applies to the embedded world's prompts" in err and "unknown key" not in err
