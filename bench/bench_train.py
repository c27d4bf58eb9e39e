"""Step-time breakdown of a tiny GRPO run on CPU: rollout (generate) vs update, medians over the timed steps."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Mapping
from typing import Any

from trainer import config, metrics, train


class _Keep(metrics.Emitter):
    def __init__(self) -> None:
        super().__init__(0)
        self.rows: list[dict[str, Any]] = []

    def step(self, step: int, values: Mapping[str, Any]) -> None:
        super().step(step, values)
        self.rows.append(dict(values))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--config", default="toy")
    ap.add_argument("--set", action="append", default=[])
    args = ap.parse_args(argv)
    cfg = config.load(args.config, ["log.wandb=disabled", *args.set])
    keep = _Keep()
    train.run(cfg, emit=keep)
    timed = keep.rows[1:] or keep.rows  # step 0 includes the compiles
    print(
        f"{'phase':<18}{'median s':>10}{'share':>8}   (steps 1..{len(keep.rows) - 1}; step 0 has the compiles)"
    )
    total = statistics.median(r["dt"] for r in timed)
    for key in ("rollout_generate", "reward_score", "update", "dt"):
        med = statistics.median(r[key] for r in timed)
        print(f"{key:<18}{med:>10.3f}{med / total:>8.2f}")
    print(f"{'step 0 (compile)':<18}{keep.rows[0]['dt']:>10.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
