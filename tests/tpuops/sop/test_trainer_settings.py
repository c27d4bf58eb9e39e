"""One owner per setting: a SOP passes a trainer key only when someone set it (`maps_to`); otherwise the
trainer preset's own value stands. Checked on the dry-run plan and on the trainer's own --print-config."""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from tpuops.config import TargetSpec
from tpuops.run import launch, prepare
from tpuops.run.result import Planned
from tpuops.sop import loader
from tpuops.sop.actions import render_plan

CODE = {"repo_url": "https://github.com/example/mllm-jax.git", "branch": "main"}
HOSTS = ("me@10.0.0.2:22",)
PRESET = "qwen2.5-1.5b-v6e-8"  # its YAML says train.steps: 200, checkpoint and eval every 50


def _dry(sop: str, sets: dict[str, str], cwd: Path) -> Planned:
    result = launch.start(
        launch.RunRequest(sop=sop, sets={**CODE, **sets}, target=TargetSpec(hosts=HOSTS), dry_run=True),
        cwd=cwd,
    )
    assert result.planned is not None  # a dry run
    return result.planned


def _trainer_argv(result: Planned) -> list[str]:
    """The words after `-m trainer.main` in the command the workers would start."""
    line = next(ln for ln in render_plan(result.plan).splitlines() if "-m trainer.main" in ln)
    inner = shlex.split(line.split("sh -c ", 1)[1])[0]  # the detached job's own shell text
    job = inner.split("-m trainer.main", 1)[1].split("; code=", 1)[0]
    return shlex.split(job)


def _printed_config(sop: str, result: Planned) -> dict:
    """What the preflight check (the trainer's --print-config, the same overrides list) resolves to."""
    argvs = prepare.preflight_argv(loader.load(loader.find(sop)), result.values)
    assert len(argvs) == 1 and argvs[0][-1] == "--print-config"
    out = subprocess.run(argvs[0], capture_output=True, text=True, timeout=120, check=True)
    return json.loads(out.stdout)


def test_the_preset_keeps_its_own_steps_when_none_are_given(tmp_path: Path) -> None:
    result = _dry("grpo", {"config": PRESET}, tmp_path)
    argv = _trainer_argv(result)
    assert argv == ["--config", PRESET]  # no train.steps (nor any other key nobody set)
    assert "steps" not in result.values
    printed = _printed_config("grpo", result)
    assert printed["train"]["steps"] == 200
    assert (printed["checkpoint"]["every"], printed["eval"]["every"]) == (50, 50)


def test_steps_given_with_set_reach_the_trainer(tmp_path: Path) -> None:
    result = _dry("grpo", {"config": PRESET, "steps": "20"}, tmp_path)
    assert _trainer_argv(result) == ["--config", PRESET, "--set=train.steps=20"]
    assert _printed_config("grpo", result)["train"]["steps"] == 20


def test_an_explicit_trainer_key_has_the_last_word(tmp_path: Path) -> None:
    result = _dry("grpo", {"config": PRESET, "steps": "20", "train.steps": "30", "data_dir": "/d"}, tmp_path)
    assert _trainer_argv(result) == [
        "--config",
        PRESET,
        "--set=train.steps=20",
        "--set=data.root=/d",
        "--set=train.steps=30",
    ]
    printed = _printed_config("grpo", result)
    assert (printed["train"]["steps"], printed["data"]["root"]) == (30, "/d")


def test_a_user_config_default_counts_as_given(tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text("[params]\nsteps = 7\n")
    result = _dry("grpo", {"config": PRESET}, tmp_path)
    assert _trainer_argv(result) == ["--config", PRESET, "--set=train.steps=7"]


def test_recompile_check_runs_five_steps_with_compile_logging(tmp_path: Path) -> None:
    result = _dry("recompile-check", {}, tmp_path)
    assert _trainer_argv(result) == [
        "--config",
        "arith",
        "--set=train.steps=5",
        "--set=log.log_compiles=true",
    ]
    printed = _printed_config("recompile-check", result)
    assert (printed["train"]["steps"], printed["log"]["log_compiles"]) == (5, True)
    text = render_plan(result.plan)
    assert "JAX_LOG_COMPILES" not in text and "TRAINER_DATA_DIR" not in text  # no env side doors


def test_recompile_check_steps_can_still_be_changed(tmp_path: Path) -> None:
    result = _dry("recompile-check", {"steps": "3", "compile_log": "false"}, tmp_path)
    assert _trainer_argv(result) == [
        "--config",
        "arith",
        "--set=train.steps=3",
        "--set=log.log_compiles=false",
    ]
