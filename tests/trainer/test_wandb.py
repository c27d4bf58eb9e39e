"""W&B from train.run: an offline run holds the logged step metrics; an init failure stops or warns per config."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.data import DATA
from trainer import config, metrics, train

SENTINEL_KEY = "sentinel0123456789abcdef0123456789abcdef"  # not a key: it must simply never be printed
BLOCK = (
    32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of (crc u32, length u16, type u8) chunks
)


def wandb_records(path: Path) -> Iterator[Any]:
    """Each protobuf Record in a .wandb file (wandb >= 0.19 writes it from Go and ships no Python reader)."""
    from wandb.proto import wandb_internal_pb2 as pb

    buf = path.read_bytes()
    assert buf[:4] == b":W&B", buf[:7]
    pos, parts = 7, []
    while pos + 7 <= len(buf):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a chunk header is zero padding
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", buf[pos : pos + 7])
        parts.append(buf[pos + 7 : pos + 7 + length])
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST: a record is complete
            record = pb.Record()
            record.ParseFromString(b"".join(parts))
            parts = []
            yield record


@pytest.fixture(autouse=True)
def wandb_local_only(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Nothing leaves the machine: the server URL and the CoreWeave metadata probe point at a closed loopback
    port, system stats and error reports are off. W&B keeps its settings (key, URL) in a process-wide
    singleton from the first init on: teardown before and after, so each test's environment is the one read."""
    import wandb

    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("WANDB_BASE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("WANDB__STATS_COREWEAVE_METADATA_BASE_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("WANDB_X_DISABLE_STATS", "true")
    wandb.teardown()
    yield
    wandb.teardown()


class Recorder(metrics.Emitter):
    def __init__(self) -> None:
        super().__init__(0)
        self.rows: list[dict[str, Any]] = []

    def step(self, step: int, values: Mapping[str, Any]) -> None:
        super().step(step, values)
        self.rows.append(dict(values))


def toy(tmp_path: Path, model_dir: Path, *sets: str) -> config.Config:
    return config.load("toy", [
        f"log.output_dir={tmp_path / 'out'}", f"model.path={model_dir}", f"data.root={DATA}", "mesh.devices=1",
        "train.micro_batch=8", "rollout.samples_per_prompt=4", "rollout.max_new_tokens=4",
        *sets,
    ])  # fmt: skip


@pytest.mark.slow
def test_offline_run_holds_the_step_metrics(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb-env"))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_API_KEY", SENTINEL_KEY)
    rec = Recorder()
    train.run(toy(tmp_path, tiny_model_dir, "log.wandb=offline", "train.steps=2"), emit=rec)
    out, err = capsys.readouterr()
    runs = list((tmp_path / "out" / "wandb").glob("offline-run-*"))
    assert len(runs) == 1, runs
    assert f"wandb: mode=offline dir={runs[0] / 'files'}" in out.splitlines()
    records = list(wandb_records(next(runs[0].glob("*.wandb"))))
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.HasField("history")]  # fmt: skip
    assert [h["_step"] for h in history] == [0, 1]
    for logged, row in zip(history, rec.rows, strict=True):
        assert logged["train/loss"] == row["loss"] and logged["train/reward_mean"] == row["reward_mean"]
        assert logged["train/completion_len_max"] == row["completion_len_max"]
    run = next(r.run for r in records if r.HasField("run"))
    got = {i.key: i.value_json for i in run.config.update}
    assert run.project == "tpuops-grpo" and json.loads(got["train"])["steps"] == 2
    assert SENTINEL_KEY not in out + err


def online_env_without_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Online mode that must fail at once: no key anywhere, and a server URL on a closed loopback port."""
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NETRC", str(tmp_path / "home" / "no-netrc"))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_INIT_TIMEOUT", "10")


def test_init_failure_stops_the_run_when_required(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    online_env_without_key(tmp_path, monkeypatch)
    with pytest.raises(
        SystemExit, match=r"wandb init failed and log.wandb_required is true \(set log.wandb=disabled"
    ):
        train.run(toy(tmp_path, tiny_model_dir, "log.wandb=online", "train.steps=1"))
    out = capsys.readouterr().out
    assert "wandb: ERROR init failed: UsageError" in out
    assert not [ln for ln in out.splitlines() if ln.startswith("step=")]  # stopped before any work


@pytest.mark.slow
def test_init_failure_warns_and_trains_when_not_required(
    tmp_path: Path, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    online_env_without_key(tmp_path, monkeypatch)
    rec = Recorder()
    train.run(
        toy(tmp_path, tiny_model_dir, "log.wandb=online", "log.wandb_required=false", "train.steps=1"),
        emit=rec,
    )
    out = capsys.readouterr().out
    assert "wandb: ERROR init failed: UsageError" in out
    assert len(rec.rows) == 1 and "summary: " in out and rec.wandb is None
