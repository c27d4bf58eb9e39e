"""Bad names and numbers stop at the edge: one line, exit 2, nothing run (the real entry point)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.tpuops.test_usage_errors import _one_line, tpuops
from tpuops.config import validators
from tpuops.errors import UsageError


def _nothing_ran(tmp_path: Path) -> None:
    assert not (tmp_path / "ran").exists()
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    assert not runs.exists() or not any(runs.iterdir())


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--vm", "a/b"], "--vm 'a/b' is not a valid vm name"),
        (["--vm", "My-VM"], "--vm 'My-VM' is not a valid vm name"),
        (["--vm", "v", "--zone", "us-east1-d/../x"], "--zone 'us-east1-d/../x' is not a valid zone name"),
        (["--vm", "v", "--project", "p/q"], "--project 'p/q' is not a valid project name"),
        (["--vm", "v", "--unreachable-s", "inf"], "--unreachable-s must be a finite number >= 1"),
        (
            ["--local", "--set", "timeout=-1"],
            "step field timeout must be a number of seconds > 0, received '-1.0'",
        ),
        (["--local", "--set", "timeout=0"], "step field timeout must be a number of seconds > 0"),
        (["--local", "--set", "timeout=nan"], "parameter timeout must be a finite number, received 'nan'"),
        (["--local", "--set", "timeout=inf"], "parameter timeout must be a finite number, received 'inf'"),
    ],
)
def test_bad_names_and_numbers_on_the_command_line(argv: list[str], says: str, tmp_path: Path) -> None:
    r = tpuops("sop", "run", "exec", *argv, "--set", f"cmd=touch {tmp_path / 'ran'}", cwd=tmp_path)
    assert says in _one_line(r)
    _nothing_ran(tmp_path)


@pytest.mark.parametrize(
    "toml, says",
    [
        ("parallel = 0", "parallel must be a finite whole number >= 1, received 0"),
        ("parallel = -3", "parallel must be a finite whole number >= 1, received -3"),
        ("parallel = 2.5", "parallel must be a finite whole number >= 1, received 2.5"),
        ('unreachable_s = "soon"', "unreachable_s must be a finite number >= 1, received 'soon'"),
        ("unreachable_s = nan", "unreachable_s must be a finite number >= 1, received nan"),
        ("key_ttl = -5", "key_ttl must be a finite number > 0, received -5"),
        ('zone = "us/east1"', "zone 'us/east1' is not a valid zone name"),
        ('vm = "a b"', "vm 'a b' is not a valid vm name"),
    ],
)
def test_bad_values_in_tpuops_toml(toml: str, says: str, tmp_path: Path) -> None:
    (tmp_path / "tpuops.toml").write_text(toml + "\n")
    r = tpuops("sop", "run", "exec", "--local", "--set", f"cmd=touch {tmp_path / 'ran'}", cwd=tmp_path)
    line = _one_line(r)
    assert str(tmp_path / "tpuops.toml") in line and says in line, line
    _nothing_ran(tmp_path)


@pytest.mark.parametrize(
    "kind, good",
    [
        ("vm", ["a", "mllm-jax-v6e-8", "x" * 63]),
        ("zone", ["us-east1-d", "europe-west4-a", "northamerica-northeast2-b", "us-central2-b"]),
        ("project", ["tpuops-grpo", "my-project-123456", "example.com:my-project"]),
    ],
)
def test_valid_names_pass(kind: str, good: list[str]) -> None:
    for value in good:
        assert validators.name(kind, value, f"--{kind}") == value
    for bad in ["", "-a", "a-", "A", "a_b", "a/b", "x" * 64 if kind == "vm" else "a" * 31]:
        with pytest.raises(UsageError):
            validators.name(kind, bad, f"--{kind}")


@pytest.mark.parametrize(
    "command", [["describe"], ["wait"], ["delete", "--yes"], ["create", "--accelerator", "v6e-8"]]
)
def test_a_bad_vm_name_in_vm_commands_is_one_line_not_a_traceback(command: list[str], tmp_path: Path) -> None:
    """No TPU API is reachable at this endpoint: the name is refused before anything is asked."""
    argv = [
        "vm",
        command[0],
        "a/b",
        *command[1:],
        "--zone",
        "us-east1-d",
        "--api-endpoint",
        "http://127.0.0.1:9",
    ]
    assert "NAME 'a/b' is not a valid vm name" in _one_line(tpuops(*argv, cwd=tmp_path))
