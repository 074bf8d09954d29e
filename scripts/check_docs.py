"""Check that the docs are complete and current (``nox -s docs``). Lists every problem, exit 1 if any.

1. docs/reference.md matches the registries (``scripts/gen_reference.py --check``), and docs/composition.md the
   parts' declarations (``scripts/gen_composition.py --check``).
2. Every method package under zoo/flowrl_zoo/ (a folder with ``__init__.py``) has a README.md.
3. Every relative link in README.md, docs/*.md and zoo/**/README.md points to an existing file.
4. Every recipe path (``recipes/....toml``) mentioned in those files exists.
5. Every page in docs/ is linked from docs/index.md (the map is complete).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import gen_composition  # noqa: E402
import gen_reference  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "zoo" / "flowrl_zoo"
DOCS = ROOT / "docs"

FENCE = re.compile(r"^[ \t]*(```|~~~).*?^[ \t]*\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
RECIPE = re.compile(r"(?<![\w./-])recipes/[\w./-]*?\.toml\b")
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)  # http:, https:, mailto:, ...


def rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(ZOO.glob("**/README.md"))]
    return [f for f in files if f.exists()]


def line_of(text: str, index: int) -> int:
    return text.count("\n", 0, index) + 1


def check_reference() -> list[str]:
    expected = gen_reference.render()
    page = gen_reference.REFERENCE
    fix = "run: python scripts/gen_reference.py"
    if not page.exists():
        return [f"{rel(page)}: missing; {fix}"]
    if page.read_text(encoding="utf-8") != expected:
        return [f"{rel(page)}: out of date with the registries (a component or config changed); {fix}"]
    return []


def check_composition() -> list[str]:
    page = gen_composition.PAGE
    fix = "run: python scripts/gen_composition.py"
    if not page.exists():
        return [f"{rel(page)}: missing; {fix}"]
    if page.read_text(encoding="utf-8") != gen_composition.render():
        return [f"{rel(page)}: out of date with the parts' declarations (a part or its contract changed); {fix}"]
    return []


def check_zoo_readmes() -> list[str]:
    problems = []
    for folder in sorted(p for p in ZOO.iterdir() if p.is_dir() and (p / "__init__.py").exists()):
        if not (folder / "README.md").exists():
            problems.append(
                f"{rel(folder)}: method package without README.md "
                "(paper, equations, parts, defaults, deviations, results)"
            )
    return problems


def blank_code(text: str) -> str:
    """``text`` with fenced blocks and inline code replaced by spaces (line numbers kept)."""

    def blank(match: re.Match[str]) -> str:
        return re.sub(r"[^\n]", " ", match.group(0))

    return INLINE_CODE.sub(blank, FENCE.sub(blank, text))


def check_links(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    prose = blank_code(text)
    problems = []
    targets = [(m.group(1), m.start()) for m in LINK.finditer(prose)]
    targets += [(m.group(1), m.start()) for m in REF_DEF.finditer(prose)]
    for target, index in sorted(targets, key=lambda t: t[1]):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        file_part = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (ROOT / file_part.lstrip("/")) if file_part.startswith("/") else (path.parent / file_part)
        if not resolved.exists():
            problems.append(f"{rel(path)}:{line_of(text, index)}: broken link '{target}' (no {file_part})")
    return problems


def check_recipe_paths(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    problems = []
    for match in RECIPE.finditer(text):
        if not (ROOT / match.group(0)).exists():
            problems.append(f"{rel(path)}:{line_of(text, match.start())}: recipe '{match.group(0)}' does not exist")
    return problems


def check_index() -> list[str]:
    index = DOCS / "index.md"
    if not index.exists():
        return [f"{rel(index)}: missing (the map of the docs)"]
    linked = {
        (index.parent / m.group(1).split("#", 1)[0]).resolve()
        for m in LINK.finditer(blank_code(index.read_text(encoding="utf-8")))
        if not EXTERNAL.match(m.group(1))
    }
    return [
        f"{rel(index)}: does not link to {rel(page)}"
        for page in sorted(DOCS.glob("*.md"))
        if page != index and page.resolve() not in linked
    ]


def main() -> int:
    problems = check_reference() + check_composition() + check_zoo_readmes() + check_index()
    if not (ROOT / "README.md").exists():
        problems.append("README.md: missing (pyproject.toml names it as the project's readme)")
    for path in markdown_files():
        found = check_links(path) + check_recipe_paths(path)
        problems += sorted(found, key=lambda p: int(p.split(":", 2)[1]))  # "file:line: ..." in line order
    if problems:
        print(f"docs check: {len(problems)} problem{'s' if len(problems) != 1 else ''}")
        print("\n".join(f"  {p}" for p in problems))
        return 1
    print(f"docs check: ok ({len(markdown_files())} markdown files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
