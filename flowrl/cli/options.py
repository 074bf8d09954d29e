"""What every command-line option accepts, declared once: each option's argparse ``type`` is one of these
kinds, which parses a value or refuses it with one line, and names the bad values it refuses (the tests
generate their cases from them: tests/test_cli_options.py).

Every subcommand is defined in this package (``flowrl`` itself in :mod:`flowrl.cli.main`, ``flowrl bench``,
``pretrain``, ``serve``, ``suite`` and ``data`` beside it) and declares its options with these kinds; the packages
that do the work (:mod:`flowrl.bench`, :mod:`flowrl.pretrain`, ...) never import the command line.

A refused value ends the command before anything loads: ``error: argument --opt: why (see flowrl CMD --help)``
and exit status 2 (:class:`OneLineParser`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any, NoReturn

from flowrl.core.rng import SEED_LIMIT


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (no usage block), as every flowrl error is:
    ``error: message (see prog --help)``, exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


class Kind:
    """An option's type: ``kind(text)`` parses or raises ``argparse.ArgumentTypeError``; :meth:`bad` lists
    (what is wrong, a value) pairs the kind refuses, for the generated tests; :meth:`good` one it accepts."""

    def __call__(self, text: str) -> Any:
        raise NotImplementedError

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return []

    def good(self, tmp: Path) -> str:
        raise NotImplementedError

    def __repr__(self) -> str:  # argparse names the type in some messages
        return type(self).__name__.lower()


def _refuse(message: str) -> NoReturn:
    raise argparse.ArgumentTypeError(message)


class Whole(Kind):
    """A whole number in ``[minimum, maximum)``."""

    def __init__(self, minimum: int = 0, maximum: int | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum

    def __call__(self, text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            _refuse(f"expected a whole number, got {text!r}")
        if value < self.minimum:
            _refuse(f"expected a number of at least {self.minimum}, got {value}")
        if self.maximum is not None and value >= self.maximum:
            _refuse(f"expected a number below {self.maximum}, got {value}")
        return value

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        out = [("below the range", str(self.minimum - 1)), ("not a number", "x"), ("a fraction", "1.5"),
               ("empty", "")]
        if self.maximum is not None:
            out.append(("above the range", str(self.maximum)))
        return out

    def good(self, tmp: Path) -> str:
        return str(max(self.minimum, 1))


class Seeds(Kind):
    """Comma-separated seeds (each a whole number in ``[0, 2**63)``), at least one, no repeats; the text is
    kept as given."""

    def __call__(self, text: str) -> str:
        parts = [p.strip() for p in text.split(",")]
        if not text.strip() or any(not p for p in parts):
            _refuse(f"expected comma-separated seeds such as 0,1,2, got {text!r}")
        seeds = [Whole(0, SEED_LIMIT)(p) for p in parts]
        if len(set(seeds)) != len(seeds):
            _refuse(f"a seed appears twice in {text!r}")
        return text

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [("not a number", "a,b"), ("below the range", "-1"), ("empty", ""), ("a repeat", "1,1"),
                ("an empty item", "0,,1")]

    def good(self, tmp: Path) -> str:
        return "0"


class Choice(Kind):
    """One of fixed words."""

    def __init__(self, *choices: str) -> None:
        self.choices = choices

    def __call__(self, text: str) -> str:
        if text not in self.choices:
            _refuse(f"expected one of {', '.join(self.choices)}, got {text!r}")
        return text

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [("not a choice", "nope"), ("empty", "")]

    def good(self, tmp: Path) -> str:
        return self.choices[0]


class Checkpoint(Kind):
    """Which checkpoint of a run folder: ``last``, ``best`` or a step number."""

    def __call__(self, text: str) -> str:
        if text in ("last", "best") or text.isdigit():
            return text
        _refuse(f"expected last, best or a step number, got {text!r}")

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [("not a checkpoint", "nope"), ("a negative step", "-1"), ("empty", "")]

    def good(self, tmp: Path) -> str:
        return "last"


class KindOrPart(Kind):
    """A kind of part (``selector``) or a registered part's name (``egrpo_entropy``)."""

    def __call__(self, text: str) -> str:
        from flowrl.core.registry import KINDS, available

        if text in KINDS or any(text in available(kind) for kind in KINDS):
            return text
        _refuse(f"expected a kind ({', '.join(KINDS)}) or a part's name (flowrl ls lists them), got {text!r}")

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [("neither", "nope"), ("empty", "")]

    def good(self, tmp: Path) -> str:
        return "selector"


class Text(Kind):
    """Non-blank text; ``prefix``, when given, is required at its start."""

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix

    def __call__(self, text: str) -> str:
        if not text.strip():
            _refuse("expected some text, got nothing")
        if self.prefix and not text.startswith(self.prefix):
            _refuse(f"expected a name starting with {self.prefix!r}, got {text!r}")
        return text

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        out = [("empty", ""), ("blank", "   ")]
        if self.prefix:
            out.append(("without the prefix", "strict"))
        return out

    def good(self, tmp: Path) -> str:
        return f"{self.prefix}x"


class KeyValue(Kind):
    """A recipe override ``KEY=VALUE`` (the key dotted: ``trainer.max_steps=10``)."""

    def __call__(self, text: str) -> str:
        key, sep, _ = text.partition("=")
        if not sep or not key.strip():
            _refuse(f"expected KEY=VALUE such as trainer.max_steps=10, got {text!r}")
        return text

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [("no '='", "trainer.max_steps"), ("no key", "=3"), ("empty", "")]

    def good(self, tmp: Path) -> str:
        return "seed=1"


class ExistingPath(Kind):
    """A path that exists: a ``file``, a ``folder`` or ``any`` of the two; ``what`` names it in messages."""

    def __init__(self, kind: str = "any", what: str = "") -> None:
        self.kind = kind
        self.what = what or {"file": "file", "folder": "folder"}.get(kind, "file or folder")

    def __call__(self, text: str) -> str:
        if not text.strip():
            _refuse("expected a path, got nothing")
        path = Path(text)
        if not path.exists():
            _refuse(f"{text}: no such {self.what}; check the path")
        if self.kind == "file" and not path.is_file():
            _refuse(f"{text}: expected a file, got a folder")
        if self.kind == "folder" and not path.is_dir():
            _refuse(f"{text}: expected a folder, got a file")
        return text

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        out = [("missing", str(tmp / "missing")), ("empty", "")]
        if self.kind == "file":
            out.append(("a folder", str(_folder(tmp))))
        if self.kind == "folder":
            out.append(("a file", str(_file(tmp))))
        return out

    def good(self, tmp: Path) -> str:
        return str(_folder(tmp) if self.kind == "folder" else _file(tmp))


class ConditionImage(Kind):
    """A condition image file (``flowrl sample --image``): read and checked now, as the JSONL prompt source checks
    its images (:meth:`flowrl.core.conditions.Condition.from_file`: missing, unreadable, a mode flowrl does not take);
    the value is the :class:`~flowrl.core.conditions.Condition`. Whether the base takes it is the command's check."""

    def __call__(self, text: str) -> Any:
        from flowrl.core.conditions import Condition, ConditionError

        if not text.strip():
            _refuse("expected an image file, got nothing")
        try:
            return Condition.from_file(Path(text), text, "the working directory")
        except ConditionError as error:
            _refuse(str(error))

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        text = tmp / "not_an_image.png"
        text.write_text("not an image")
        return [("missing", str(tmp / "missing.png")), ("not an image", str(text)), ("a folder", str(_folder(tmp))),
                ("empty", "")]

    def good(self, tmp: Path) -> str:
        from PIL import Image

        path = tmp / "source.png"
        Image.new("RGB", (8, 8)).save(path)
        return str(path)


class OutputFile(Kind):
    """A file to write: one of ``suffixes``, not a folder (its parent folder is made when missing).
    ``optional``: the empty default means none."""

    def __init__(self, *suffixes: str, optional: bool = False) -> None:
        self.suffixes, self.optional = suffixes, optional

    def __call__(self, text: str) -> str:
        if not text and self.optional:
            return text
        if not text.strip():
            _refuse("expected a file name, got nothing")
        if Path(text).is_dir():
            _refuse(f"{text}: is a folder; expected a file name ending in {self.either}")
        if not text.lower().endswith(self.suffixes):
            _refuse(f"expected a file name ending in {self.either}, got {text!r}")
        probe_writable(Path(text).parent)
        return text

    @property
    def either(self) -> str:
        """The suffixes in words: ``.png, .pdf or .svg``."""
        *first, last = self.suffixes
        return f"{', '.join(first)} or {last}" if first else last

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        out = [("a folder", str(_folder(tmp))), ("another suffix", str(tmp / "x.bad")),
               ("unwritable", f"{UNWRITABLE}/x{self.suffixes[0]}")]
        if not self.optional:
            out.append(("empty", ""))
        return out

    def good(self, tmp: Path) -> str:
        return str(tmp / f"out{self.suffixes[0]}")


class OutputFolder(Kind):
    """A folder to write into: it may exist (as a folder) or not yet; either way it must be writable."""

    def __call__(self, text: str) -> str:
        if not text.strip():
            _refuse("expected a folder, got nothing")
        if Path(text).exists() and not Path(text).is_dir():
            _refuse(f"{text}: is a file; expected a folder")
        probe_writable(Path(text))
        return text

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [("a file", str(_file(tmp))), ("empty", ""), ("unwritable", UNWRITABLE)]

    def good(self, tmp: Path) -> str:
        return str(tmp / "out")


UNWRITABLE = "/sys/flowrl-test/out"  # refused even to root: sysfs takes no new files


def probe_writable(folder: Path) -> None:
    """Refuse a folder no file can be written into (read-only, unwritable, full), before any model loads: the
    probe goes into the folder, or into its nearest existing parent when the folder is still to be made."""
    from flowrl.trainer.writes import write_probe

    here = next((p for p in (folder, *folder.parents) if p.exists()), None)
    if here is None or not here.is_dir():
        return  # a file in the way: the caller's own check names it
    cause = write_probe(here)
    if cause is not None:
        _refuse(f"{folder}: cannot write there ({cause})")


def _file(tmp: Path) -> Path:
    path = tmp / "a_file.toml"
    path.touch()
    return path


class Column(ExistingPath):
    """A suite column: a path that exists, or ``RECIPE.toml@LORA`` whose two parts exist."""

    def __call__(self, text: str) -> str:
        recipe, at, lora = text.rpartition("@")
        if at and recipe.endswith(".toml"):
            ExistingPath("file", "recipe file")(recipe)
            ExistingPath("any", "LoRA folder or file")(lora)
            return text
        return super().__call__(text)

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [*super().bad(tmp), ("a missing LoRA", f"{_file(tmp)}@{tmp / 'missing'}")]


class Shard(Kind):
    """``I/N``: shard I of N, 0 <= I < N."""

    def __call__(self, text: str) -> tuple[int, int]:
        try:
            index, count = (int(v) for v in text.split("/"))
        except ValueError:
            _refuse(f"expected I/N such as 0/4, got {text!r}")
        if not 0 <= index < count:
            _refuse(f"expected I/N with 0 <= I < N, got {text!r}")
        return index, count

    def bad(self, tmp: Path) -> list[tuple[str, str]]:
        return [("not I/N", "3"), ("I past N", "4/4"), ("empty", "")]

    def good(self, tmp: Path) -> str:
        return "0/2"


def _folder(tmp: Path) -> Path:
    path = tmp / "a_folder"
    path.mkdir(exist_ok=True)
    return path


def declared(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The parser's actions that take a value (flags and help left out)."""
    return [a for a in parser._actions if a.nargs != 0 and not isinstance(a, argparse._SubParsersAction)]


def undeclared(parser: argparse.ArgumentParser) -> list[str]:
    """Options of ``parser`` that take a value without a declared :class:`Kind` (none should)."""
    return [a.dest for a in declared(parser) if not isinstance(a.type, Kind)]


def subparsers(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, argparse.ArgumentParser]:
    """Every command's parser by name, nested ones too (``"suite run"``)."""
    found: dict[str, argparse.ArgumentParser] = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found[prefix + name] = sub
                found.update(subparsers(sub, f"{prefix}{name} "))
    return found
