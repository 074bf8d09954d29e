"""``flowrl pretrain`` arguments (placeholder until pre-training lands)."""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("recipe")
    parser.set_defaults(func=lambda args: 1)
