"""``flowrl bench`` arguments (placeholder until the harness lands)."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipes", nargs="+")
    parser.set_defaults(func=lambda args: 1)
