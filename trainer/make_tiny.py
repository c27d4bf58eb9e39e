"""Write a seeded tiny Qwen2 checkpoint in Hugging Face format plus the real Qwen2.5 tokenizer files.

Usage: python -m trainer.make_tiny OUT_DIR [--preset tiny] [--seed 0]   (exit 0 done, 1 failed)
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
HUB_TOKENIZER = "Qwen/Qwen2.5-0.5B-Instruct"  # the same tokenizer, for a VM without the shared data folder


def tokenizer_files(tokenizer_dir: str | Path | None) -> Path:
    """The Qwen2.5 tokenizer folder: given, else $TRAINER_DATA_DIR (or ../shared/data), else from the hub."""
    from trainer.data import data_dir

    folder = Path(tokenizer_dir) if tokenizer_dir else data_dir() / "qwen2.5-tokenizer"
    if (folder / "tokenizer.json").exists() or tokenizer_dir:
        return folder
    from huggingface_hub import snapshot_download  # only on a VM with internet

    return Path(snapshot_download(HUB_TOKENIZER, allow_patterns=list(TOKENIZER_FILES)))


def make_tiny(
    out_dir: str | Path, preset: str = "tiny", seed: int = 0, *, tokenizer_dir: str | Path | None = None
) -> Path:
    """Initialise `preset` with `seed`, save it with save_pretrained, copy the tokenizer; returns out_dir."""
    import jax

    from trainer.model.config import preset as get_preset
    from trainer.model.loading import save_pretrained
    from trainer.model.qwen2 import init_params

    config = get_preset(preset)
    out = Path(out_dir)
    params = init_params(config, jax.random.key(seed))
    # Host-local parameters: every process of a multi-host run writes its own copy (train uses one per process).
    save_pretrained(config, params, out, every_process=True)
    source = tokenizer_files(tokenizer_dir)
    for name in TOKENIZER_FILES:
        shutil.copyfile(source / name, out / name)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.make_tiny", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        out = make_tiny(args.out_dir, args.preset, args.seed)
    except (OSError, ValueError, KeyError) as exc:
        print(f"make_tiny: failed: {exc}", file=sys.stderr)
        return 1
    print(f"make_tiny: wrote {args.preset} (seed {args.seed}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
