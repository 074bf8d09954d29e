"""The settings every base declares alike, each written once as the allowed values (:mod:`flowrl.core.choices`)."""

from __future__ import annotations

from typing import Literal

DType = Literal["float32", "bfloat16", "float16"]  # a base's `dtype` setting (common.pipeline.DTYPES maps it)
SigmaGrid = Literal["uniform", "diffusers"]  # a base's `grid` setting: flowrl's shifted grid, or its pipeline's own
