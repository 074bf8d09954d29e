"""The option kinds of the command line, as :mod:`flowrl.cli` names them.

They are declared in :mod:`flowrl.option_kinds`, below every command, so that ``flowrl bench`` and
``flowrl pretrain`` (which ``flowrl`` itself loads) can declare their options without importing this package;
this module names the same objects for the commands here.
"""

from __future__ import annotations

from flowrl.option_kinds import (
    SEED_LIMIT,
    Checkpoint,
    Choice,
    Column,
    ExistingPath,
    KeyValue,
    Kind,
    KindOrPart,
    OneLineParser,
    OutputFile,
    OutputFolder,
    Seeds,
    Shard,
    Text,
    Whole,
    declared,
    subparsers,
    undeclared,
)

__all__ = [
    "SEED_LIMIT", "Checkpoint", "Choice", "Column", "ExistingPath", "Kind", "KeyValue", "KindOrPart", "OneLineParser",
    "OutputFile", "OutputFolder", "Seeds", "Shard", "Text", "Whole", "declared", "subparsers", "undeclared",
]
