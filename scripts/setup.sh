#!/usr/bin/env bash
# Set up flowrl in ./.venv on a fresh machine (Python 3.11+). Idempotent: a second run only checks, quietly.
# torch goes in first and pinned: the CPU wheel 2.13.0; anything asking for plain `torch` first would
# pull a multi-GB CUDA build.
# After a successful install .venv/.flowrl-setup holds a checksum of what the install was made from (pyproject.toml,
# scripts/constraints.txt, this script); while it matches and .venv still has this checkout's flowrl and
# torch 2.13.0, the pip install is skipped. Change any of those files (or delete the stamp) to install again.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
STAMP=.venv/.flowrl-setup
WANT=$(cat pyproject.toml scripts/constraints.txt scripts/setup.sh | cksum)

installed() {  # -I: the check must not see ./flowrl through the current directory, only what .venv installed
  [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && .venv/bin/python -I -c '
import importlib.metadata as md, importlib.util, pathlib, sys
here = pathlib.Path(sys.argv[1]).resolve()
specs = [importlib.util.find_spec(name) for name in ("flowrl", "flowrl_zoo")]
ours = all(s is not None and s.origin and pathlib.Path(s.origin).resolve().is_relative_to(here) for s in specs)
sys.exit(0 if ours and md.version("torch").split("+")[0] == "2.13.0" else 1)
' "$PWD" 2>/dev/null
}

if installed; then
  exit 0
fi
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
  .venv/bin/python -m pip install -q --upgrade pip
fi
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  .venv/bin/python -m pip install -q "torch==2.13.0"
fi
# The distribution was called `flowrl` before it became `flowrl-grpo` (that name on the package index is another
# project's): an editable install under the old name, and its metadata folder here, would stay beside the new one
# (their entry points read twice), so they go first. -I: pip must not take ./flowrl.egg-info for an install.
if .venv/bin/python -I -m pip show -q flowrl >/dev/null 2>&1; then
  .venv/bin/python -I -m pip uninstall -q -y flowrl
fi
rm -rf flowrl.egg-info
.venv/bin/python -m pip install -q -c scripts/constraints.txt -e ".[test,dev]"
echo "$WANT" > "$STAMP"
