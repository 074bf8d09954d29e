"""Generation speed of an evaluation suite against `flowrl sample`'s path, per image, in one process.

    python scripts/suite_speed.py [RECIPE] [--images N] [--repeats R]

Both make the same number of images with the recipe's initial policy and the suite protocol's steps: `flowrl
sample`'s path (`LoadedPolicy.images`: ODE samples in batches of 64, noise from one generator) and the `world`
suite's generate stage (the protocol's per-image noise, PNG or array files and manifest rows written), alternating,
and prints seconds per image and their ratio (suite / sample; the issue's target: no slower, <= 1 plus noise).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", default=str(ROOT / "recipes" / "egrpo.toml"))
    parser.add_argument("--images", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from flowrl.cli.suite import policy_for
    from flowrl.suites import stages
    from flowrl.suites.builtin import WorldSuite

    suite = WorldSuite(WorldSuite.Config())
    protocol = suite.protocol()
    policy, used = policy_for(Path(args.recipe), protocol)
    prompts = [item.prompt for item in suite.items()][: args.images]
    sample, generate = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        policy.images(prompts)
        sample.append((time.perf_counter() - start) / len(prompts))
        with tempfile.TemporaryDirectory() as tmp:
            facts = {"suite": "world", "config": {}, "protocol": used.to_dict(), "limit": args.images,
                     "weights_sha256": "speed"}
            start = time.perf_counter()
            stages.generate(policy, suite, protocol, Path(tmp), facts, limit=args.images, batch=args.batch, quiet=True)
            generate.append((time.perf_counter() - start) / len(prompts))
    s, g = statistics.median(sample), statistics.median(generate)
    print(f"{len(prompts)} images, {protocol.steps} steps, batch {args.batch}, 1 thread, median of {args.repeats}")
    print(f"flowrl sample path : {1e3 * s:.2f} ms/image")
    print(f"suite generate     : {1e3 * g:.2f} ms/image (images and manifest written)")
    print(f"ratio suite/sample : {g / s:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
