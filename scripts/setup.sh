#!/usr/bin/env bash
# Set up flowrl in ./.venv on a fresh machine (Python 3.11+). Idempotent: a second run only checks.
# torch goes in first and pinned: the CPU wheel 2.13.0; anything asking for plain `torch` first would
# pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
.venv/bin/python -m pip install -q -c scripts/constraints.txt -e ".[test,dev]"
