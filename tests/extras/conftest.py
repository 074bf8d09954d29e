"""tests/extras run only in the extras environment (``nox -s extras`` sets FLOWRL_EXTRAS=1): they need
torchvision next to torch 2.14.1, hpsv2 and rapidocr, which the main environment does not have."""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("FLOWRL_EXTRAS") == "1" else ["test_*.py"]
