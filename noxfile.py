"""The test matrix. Sessions run in the environment nox itself runs in (set up by scripts/setup.sh):
torch must be installed first and pinned, which per-session virtualenvs would redo every time.

    nox                  lint, typecheck, tests, slow, docs
    nox -s tests         fast unit, property, recipe, equivalence and CLI tests
    nox -s slow          long tests (multi-process, benchmark harness, pre-training)
"""

from __future__ import annotations

import os
import sys

import nox

nox.options.sessions = ["lint", "typecheck", "tests", "slow", "docs"]
nox.options.default_venv_backend = "none"

PY = sys.executable
ENV = {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONHASHSEED": "0"}


@nox.session
def lint(session: nox.Session) -> None:
    """ruff: style and likely bugs."""
    session.run(PY, "-m", "ruff", "check", "flowrl", "zoo", "tests", "noxfile.py", "scripts")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over the core and the zoo."""
    session.run(PY, "-m", "mypy")


@nox.session
def tests(session: nox.Session) -> None:
    """Everything but the slow tests, on both cores."""
    workers = os.environ.get("FLOWRL_TEST_WORKERS", "2")
    session.run(PY, "-m", "pytest", "-n", workers, "-q", *session.posargs, env=ENV)


@nox.session
def slow(session: nox.Session) -> None:
    """The slow tests only (multi-process runs, benchmark harness, pre-training)."""
    session.run(PY, "-m", "pytest", "-m", "slow", "-q", *session.posargs, env=ENV, success_codes=[0, 5])


@nox.session
def docs(session: nox.Session) -> None:
    """Docs are complete and current: every component listed, every zoo method has a README, links resolve."""
    session.run(PY, "scripts/check_docs.py", env=ENV)
