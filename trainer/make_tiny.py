"""Write a seeded tiny Qwen2 checkpoint in Hugging Face format plus its tokenizer, atomically.

Usage: python -m trainer.make_tiny OUT_DIR [--preset tiny] [--seed 0] [--tokenizer bundled|qwen2.5|DIR]
(exit 0 done, 1 failed)

The folder is written under a temporary name beside OUT_DIR and renamed into place once complete, so an
interrupted write never leaves a folder that looks usable: `complete()` is what a cache trusts.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

from trainer.make_tokenizer import BUNDLED

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # all a fast tokenizer needs
# The Qwen2.5 folder's slow-tokenizer files, copied when there.
QWEN_EXTRA_FILES = ("vocab.json", "merges.txt")
HUB_TOKENIZER = "Qwen/Qwen2.5-0.5B-Instruct"  # the same tokenizer, for a VM without the shared data folder
MARKER = "tiny-complete"  # written last, inside the temporary folder, before the rename


def tokenizer_files(tokenizer: str | Path | None, data_root: str = "") -> Path:
    """The tokenizer folder: `bundled` (in the repository); a folder; `qwen2.5`/None: <data.root (or
    ../shared/data)>/qwen2.5-tokenizer, else the hub (a VM with internet)."""
    if str(tokenizer) == "bundled":
        return BUNDLED
    if tokenizer and str(tokenizer) != "qwen2.5":
        folder = Path(tokenizer).expanduser()
        if not (folder / "tokenizer.json").exists():
            raise FileNotFoundError(f"no tokenizer.json in {folder} (model.tokenizer)")
        return folder
    from trainer.data import data_dir

    folder = data_dir(data_root) / "qwen2.5-tokenizer"
    if (folder / "tokenizer.json").exists():
        return folder
    from huggingface_hub import snapshot_download  # only on a VM with internet

    return Path(snapshot_download(HUB_TOKENIZER, allow_patterns=[*TOKENIZER_FILES, *QWEN_EXTRA_FILES]))


def vocab_rows(preset_vocab: int, tokenizer_size: int) -> int:
    """Embedding rows: the preset's when they are this tokenizer's padded size (Qwen2.5: 151,665 tokens in
    151,936 rows, as the real models); otherwise the tokenizer's size rounded up to a multiple of 64."""
    if preset_vocab - 1024 < tokenizer_size <= preset_vocab:
        return preset_vocab
    return -(-tokenizer_size // 64) * 64


def complete(folder: str | Path) -> bool:
    """True only for a folder make_tiny finished (weights, tokenizer and the marker all there)."""
    out = Path(folder)
    return all((out / name).exists() for name in (MARKER, "config.json", *TOKENIZER_FILES))


def make_tiny(
    out_dir: str | Path,
    preset: str = "tiny",
    seed: int = 0,
    *,
    tokenizer_dir: str | Path | None = None,
    tokenizer: str | Path | None = None,
    data_root: str = "",
) -> Path:
    """Initialise `preset` with `seed`, save it with save_pretrained beside its tokenizer; returns out_dir.

    `tokenizer` (or the older name `tokenizer_dir`): `bundled`, `qwen2.5` (the default) or a folder. An
    existing incomplete `out_dir` (an interrupted earlier write) is replaced. `data_root`: data.root."""
    import jax

    from trainer.model.config import preset as get_preset
    from trainer.model.loading import save_pretrained
    from trainer.model.qwen2 import init_params
    from trainer.tokenizer import load_tokenizer, pad_id

    choice = tokenizer if tokenizer is not None else tokenizer_dir
    source = tokenizer_files(choice, data_root)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        for name in (*TOKENIZER_FILES, *QWEN_EXTRA_FILES):
            if (source / name).exists():
                shutil.copyfile(source / name, tmp / name)
        base = get_preset(preset)
        tok = load_tokenizer(tmp)
        config = dataclasses.replace(base, vocab_size=vocab_rows(base.vocab_size, len(tok)))
        params = init_params(config, jax.random.key(seed))
        # Host-local parameters: every process of a multi-host run writes its own copy (train uses one per process).
        save_pretrained(config, params, tmp, every_process=True)
        # The special ids of this tokenizer (the preset's are Qwen2.5's, outside a small vocabulary).
        hf = json.loads((tmp / "config.json").read_text())
        assert tok.eos_token_id is not None, f"the tokenizer in {tmp} names no eos_token"
        hf.update(bos_token_id=pad_id(tok), eos_token_id=int(tok.eos_token_id))
        (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
        marker = f"preset={preset} seed={seed} tokenizer={choice or 'qwen2.5'}\n"
        (tmp / MARKER).write_text(marker)
        _fsync_dir(tmp)
        if complete(out) and (out / MARKER).read_text() == marker:  # another process made the same meanwhile
            shutil.rmtree(tmp)
            return out
        if out.exists():  # an interrupted write's leftover (never trusted), or another model
            shutil.rmtree(out)
        tmp.replace(out)
        _fsync_dir(out.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out


def _fsync_dir(folder: Path) -> None:
    """Flush the folder's files and entries, so a crash after the rename cannot leave empty files behind it."""
    for child in folder.iterdir():
        if child.is_file():
            fd = os.open(child, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trainer.make_tiny", description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--tokenizer", default="qwen2.5", help="bundled, qwen2.5 or a folder")
    args = parser.parse_args(argv)
    try:
        out = make_tiny(args.out_dir, args.preset, args.seed, tokenizer=args.tokenizer)
    except (OSError, ValueError, KeyError) as exc:
        print(f"make_tiny: failed: {exc}", file=sys.stderr)
        return 1
    print(f"make_tiny: wrote {args.preset} (seed {args.seed}, tokenizer {args.tokenizer}) to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
