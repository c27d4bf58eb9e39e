"""A VM with internet takes the model and GSM8K from the Hugging Face hub: here, from a prepared HF cache, offline.

The cache has the hub's own layout (refs/main -> snapshots/<revision>/...), so huggingface_hub's real lookup
runs; only the download itself (no network here) is left out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from tests.data import DATA, pythonpath
from trainer.make_tiny import make_tiny

REPO = Path(__file__).resolve().parents[2]
GSM8K = DATA / "gsm8k"
REVISION = "0123456789abcdef0123456789abcdef01234567"


def _snapshot(cache: Path, kind: str, repo_id: str) -> Path:
    root = cache / f"{kind}s--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True)
    (root / "refs" / "main").write_text(REVISION)
    snap = root / "snapshots" / REVISION
    snap.mkdir(parents=True)
    return snap


def test_model_and_gsm8k_come_from_the_hub_when_there_is_no_local_copy(tmp_path: Path) -> None:
    cache = tmp_path / "hub"
    make_tiny(
        _snapshot(cache, "model", "tpuops-test/tiny-qwen2"),
        "tiny",
        seed=0,
        tokenizer=DATA / "qwen2.5-tokenizer",
    )
    rows = [json.loads(ln) for ln in (GSM8K / "train.jsonl").read_text().splitlines()[:64]]
    split = _snapshot(cache, "dataset", "openai/gsm8k") / "main"
    split.mkdir()
    pq.write_table(pa.Table.from_pylist(rows), split / "train-00000-of-00001.parquet")
    no_data = tmp_path / "no-data"
    no_data.mkdir()  # a data.root without gsm8k/: the trainer must go to the hub
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1",
           "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONPATH": pythonpath(REPO)}  # fmt: skip

    code = f"from trainer import data; ex = data.load_gsm8k('auto', 'train', {str(no_data)!r}); print(len(ex), ex[5].gold)"
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False)
    assert got.returncode == 0, got.stderr[-2000:]
    assert got.stdout.split() == ["64", rows[5]["answer"].rsplit("####", 1)[1].strip().replace(",", "")]

    sets = ["model.path=tpuops-test/tiny-qwen2", "train.steps=1", "rollout.max_new_tokens=4", f"data.root={no_data}",
            f"log.output_dir={tmp_path / 'out'}"]  # fmt: skip
    argv = [
        sys.executable,
        "-m",
        "trainer.main",
        "--config",
        "tiny",
        *(w for s in sets for w in ("--set", s)),
    ]
    run = subprocess.run(
        argv, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "\nstep=0 reward_mean=" in run.stdout and "summary: " in run.stdout
    assert not (tmp_path / "out").exists() or not list(
        (tmp_path / "out").glob("tiny-*")
    )  # no tiny model made
