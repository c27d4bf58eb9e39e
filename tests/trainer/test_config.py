"""The typed config: presets load, `--set` is strict and typed, batch semantics are checked, no JAX import."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.data import pythonpath
from trainer import config
from trainer.main import main

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", config.presets())
def test_every_preset_loads_and_has_a_consistent_batch(name: str) -> None:
    cfg = config.load(name)
    cfg.check_batch()
    assert cfg.sequences_per_step == cfg.train.prompts_per_step * cfg.rollout.samples_per_prompt
    assert cfg.accumulation_steps * cfg.train.micro_batch == cfg.sequences_per_step


def test_set_overrides_are_typed() -> None:
    cfg = config.load(
        "tiny", ["train.steps=7", "loss.beta=0.04", "log.log_compiles=true", "data.prompt_buckets=[64,128]"]
    )
    assert (cfg.train.steps, cfg.loss.beta, cfg.log.log_compiles, cfg.data.prompt_buckets) == (
        7,
        0.04,
        True,
        (64, 128),
    )


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("train.step=3", "train.steps"),  # the closest valid key
        ("trian.steps=3", "train.steps"),
        ("train.steps=many", "many"),
        ("loss.loss_type=ppo", "ppo"),
        ("rollout.samples_per_prompt=1", "received 1"),
        ("train.learning_rate=-1", "received -1"),
        ("rollout.decode_layers=loop", "'auto', 'scan', 'unrolled'], received 'loop'"),
    ],
)
def test_bad_override_is_one_clear_error(override: str, needle: str) -> None:
    with pytest.raises(config.ConfigError, match=needle.replace(".", r"\.")):
        config.load("tiny", [override])


def test_impossible_batch_is_rejected_before_compile() -> None:
    cfg = config.load("tiny", ["train.micro_batch=3"])
    with pytest.raises(config.ConfigError, match="micro_batch"):
        cfg.check_batch()
    with pytest.raises(config.ConfigError, match="device count"):
        config.load("tiny").check_batch(device_count=3)


def test_print_config_exits_2_on_bad_key_and_does_not_import_jax() -> None:
    code = (
        "import sys; from trainer.main import main; rc = main(sys.argv[1:]); "
        "assert 'jax' not in sys.modules, 'jax imported'; sys.exit(rc)"
    )
    ok = subprocess.run([sys.executable, "-c", code, "--config", "tiny", "--set", "train.steps=3", "--print-config"],
                        capture_output=True, text=True, check=False)  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    printed = json.loads(ok.stdout)
    assert printed["train"]["steps"] == 3 and printed["batch"]["sequences_per_step"] == 8
    bad = subprocess.run([sys.executable, "-c", code, "--config", "tiny", "--set", "train.stepz=3", "--print-config"],
                         capture_output=True, text=True, check=False)  # fmt: skip
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "train.steps" in bad.stderr


def test_main_returns_2_on_unknown_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "tinny", "--print-config"]) == 2
    assert "did you mean 'tiny'" in capsys.readouterr().err


def test_a_config_path_that_does_not_exist_says_file_not_found(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--config", "/nonexistent/cfg.yaml", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert "config file '/nonexistent/cfg.yaml': file not found" in err and "no config preset" not in err


@pytest.mark.parametrize(
    ("sets", "needle"),
    [
        (["mesh.dp=3"], "config: mesh: "),  # only the machine can tell: 1 CPU device
        (["data.prompt_buckets=4"], "config: no prompt fits data.prompt_buckets (largest 4 tokens)"),
    ],
)
def test_a_config_the_run_rejects_exits_2_with_one_line(tmp_path: Path, sets: list[str], needle: str) -> None:
    """Errors found once JAX and the tokenizer are up (the mesh, the prompt buckets) exit 2 as docs/contracts.md
    says, with one `config:` line on stderr and no traceback, like those found by config.load."""
    argv = [sys.executable, "-m", "trainer.main", "--config", "arith", "--set", f"log.output_dir={tmp_path}"]
    for s in sets:
        argv += ["--set", s]
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", "PYTHONPATH": pythonpath(REPO)}
    proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith(needle), (
        proc.stderr
    )
    assert "\nstep=" not in proc.stdout  # no step ran
