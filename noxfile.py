"""The test matrix. Sessions run in the environment nox itself runs in (set up by scripts/setup.sh):
torch must be installed first and pinned, which per-session virtualenvs would redo every time.

    nox                  lint, typecheck, tests, slow, docs, extras, gpu (skipped without CUDA)
    nox -s tests         fast unit, property, recipe, equivalence and CLI tests
    nox -s slow          long tests (multi-process, benchmark harness, pre-training)
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

nox.options.sessions = ["lint", "typecheck", "tests", "slow", "docs", "extras", "gpu"]
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


EXTRAS_TORCH = ("torch==2.14.1", "torchvision==0.29.1")  # the one torch + torchvision pair that works together here
HPS_RUNTIME = ("ftfy", "regex", "clint", "requests")  # what hpsv2 imports at run time (its own pins are wrong)


@nox.session(venv_backend="venv", reuse_venv=True)
def extras(session: nox.Session) -> None:
    """Rewards that need the extras (torchvision, hpsv2, rapidocr) in their own venv, .nox/extras: tests/extras.

    torch and torchvision go in first and pinned; flowrl then installs against them (the core's pins less
    torch); hpsv2 goes in with --no-deps (its metadata would replace torch and pin pytest and protobuf) plus
    what it really imports, and open-clip-torch (--no-deps) only for the tokenizer vocabulary hpsv2's wheel lacks.
    """
    session.install(*EXTRAS_TORCH)
    pins = Path("scripts/constraints.txt").read_text().splitlines()
    constraints = Path(session.create_tmp()) / "constraints-extras.txt"
    constraints.write_text("\n".join(p for p in pins if not p.startswith(("torch==", "nox=="))) + "\n")
    session.install("-c", str(constraints), *EXTRAS_TORCH, "-e", ".[test,ocr,wandb]")
    session.install("--no-deps", "hpsv2==1.2.0", "open-clip-torch==3.3.0")
    session.install("-c", str(constraints), *EXTRAS_TORCH, *HPS_RUNTIME)
    session.run("python", "-m", "pytest", "-q", "tests/extras", *session.posargs, env={**ENV, "FLOWRL_EXTRAS": "1"})


@nox.session
def gpu(session: nox.Session) -> None:
    """GPU smoke check (scripts/gpu_check.py): tiny and ~1B-parameter FLUX-class models trained a few
    iterations in bf16 on CUDA, printing NFE/s, iteration time and peak memory. Skipped without CUDA."""
    import subprocess

    probe = subprocess.run([PY, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"])
    if probe.returncode != 0:
        session.skip("CUDA is not available; `python scripts/gpu_check.py --device cpu --tiny-only` checks the script")
    session.run(PY, "scripts/gpu_check.py", *session.posargs, env=ENV)
