"""Thin entry: `python -m trainer.main --config NAME [--set a.b=c ...] [--print-config]` -> config.load -> train.run.

Exit codes (docs/contracts.md): 0 done, 1 failed, 2 bad config or override (one `config:` line on stderr),
143 stopped by SIGTERM.
"""

from __future__ import annotations

import argparse
import json
import sys


def main(argv: list[str] | None = None) -> int:
    from trainer import config

    ap = argparse.ArgumentParser(prog="python -m trainer.main", description=__doc__)
    ap.add_argument(
        "--config", default="arith", help=f"preset ({', '.join(config.presets())}) or a YAML path"
    )
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="override, e.g. train.steps=20"
    )
    ap.add_argument("--print-config", action="store_true", help="print the resolved config as JSON and exit")
    args = ap.parse_args(argv)
    try:
        cfg = config.load(args.config, args.set)
        cfg.check_batch()
    except config.ConfigError as e:
        print(f"config: {e}", file=sys.stderr)
        return 2
    if args.print_config:
        print(json.dumps({**config.to_dict(cfg), "batch": cfg.batch_line()}, indent=1, default=list))
        return 0
    from trainer import checkpoint

    try:
        if str(cfg.checkpoint.dir).startswith("gs://"):  # before minutes of loading: fail in seconds
            checkpoint.gcs_ready(str(cfg.checkpoint.dir))
    except checkpoint.CheckpointAccessError as e:
        print(f"checkpoint: {e}", file=sys.stderr)
        return 2
    from trainer import train

    # What only the machine can tell is checked in train.run: the mesh, the batch devices, the prompt buckets.
    try:
        train.run(cfg)
    except config.ConfigError as e:
        print(f"config: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
