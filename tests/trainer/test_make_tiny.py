"""The tiny-model cache is written atomically: an interrupted write is never trusted, the next run rebuilds."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from trainer import config, startup
from trainer.make_tiny import MARKER, complete


def arith(tmp_path: Path) -> config.Config:
    return config.load("arith", [f"log.output_dir={tmp_path / 'out'}"])


def test_make_tiny_killed_mid_write_leaves_no_folder_and_the_next_run_rebuilds(tmp_path: Path) -> None:
    cfg = arith(tmp_path)
    target = startup.tiny_folder(cfg, 0)
    writer = subprocess.Popen(
        [sys.executable, "-m", "trainer.make_tiny", str(target), "--tokenizer", "bundled"],
        env={**os.environ, "JAX_PLATFORMS": "cpu"}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    partial: list[Path] = []
    while not partial and writer.poll() is None and time.monotonic() < deadline:
        partial = [p for p in target.parent.glob(f".{target.name}.partial-*") if any(p.iterdir())]
        time.sleep(0.005)
    writer.send_signal(signal.SIGKILL)  # mid-write: the temporary folder has some files, not all
    assert writer.wait() == -signal.SIGKILL, "make_tiny finished before it could be interrupted"
    assert partial and not target.exists()  # nothing under the real name: no reader can trust half a model
    folder = startup.model_folder(cfg, 0)  # the next run
    assert folder == target and complete(folder)
    assert json.loads((folder / "config.json").read_text())["vocab_size"] == 384


def test_a_half_written_folder_from_an_older_version_is_rebuilt(tmp_path: Path) -> None:
    """The issue's case: config.json and weights but no tokenizer (a make_tiny that failed half way, before
    writes were atomic). The next run does not trust it: it rebuilds the folder and trains."""
    cfg = arith(tmp_path)
    target = startup.tiny_folder(cfg, 0)
    target.mkdir(parents=True)
    (target / "config.json").write_text("{}")
    (target / "model.safetensors").write_bytes(b"partial")
    folder = startup.model_folder(cfg, 0)
    assert complete(folder) and (folder / "tokenizer.json").exists() and (folder / MARKER).exists()
    from trainer.model.loading import load_pretrained

    mconf, _ = load_pretrained(folder, dtype="float32")
    assert mconf.vocab_size == 384
    assert not list(target.parent.glob(".*partial-*"))  # the successful write left no temporary folder
