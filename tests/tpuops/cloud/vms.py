"""Emulated TPU VMs for the command tests: one made with `tpuops vm create` (`create_vm`), the `tpuops` command
aimed at the emulator, and a background command's lines read as they come (`Follower`)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.data import DATA
from tests.tpuops.cloud.conftest import Cloud
from tpuops.cloud.emulator.sshd import free_port

ZONE = "us-east1-d"
# The smallest GRPO step the tiny model takes: 2 prompts x 2 samples, 8 new tokens, one micro-batch.
TINY = {  # the tiny model on GSM8K prompts (their lengths vary: the bucket tests need that)
    "config": "tiny", "train.prompts_per_step": "2", "rollout.samples_per_prompt": "2", "rollout.max_new_tokens": "8",
    "train.micro_batch": "4", "log.output_dir": "~/trainer-out",
}  # fmt: skip


@dataclass(frozen=True)
class Vm:
    """One emulated VM made with `tpuops vm create`, and what the commands need to reach and use it."""

    name: str
    users: list[str]  # the worker users, by worker index (to look at their processes)
    homes: list[Path]  # their home folders (to see that nothing was touched)
    cloud: Cloud
    code: dict[str, str]  # --set values every SOP here takes: the repository, commit, interpreter, lock
    env_file: Path  # the .env the trainer runs get (sent by their sync_env step, sourced by the job)

    def target(self) -> list[str]:
        return ["--vm", self.name, "--zone", ZONE, "--identity", str(self.cloud.identity)]

    def args(self, *command: str, sets: dict[str, str] | None = None) -> list[str]:
        """A command's arguments aimed at this VM, with `--set k=v` for each of `sets`. GRPO-based SOPs skip
        the fit preflight: these workers run the trainer on CPU (the preflight is tested in test_fit_preflight)."""
        out = [*command, *self.target()]
        if command[0] in ("run", "recompile-check", "bench"):
            out.append("--skip-fit")
        for k, v in (sets or {}).items():
            out += ["--set", f"{k}={v}"]
        return out

    def trainer_sets(self, steps: int) -> dict[str, str]:
        return {
            **self.code, "data_dir": str(DATA), "steps": str(steps), "coordinator_port": str(free_port()),
            "env_file": str(self.env_file), **TINY,
        }  # fmt: skip


def _env(cloud: Cloud, home: Path | None = None) -> dict[str, str]:
    """The emulator as the TPU API, no gcloud or user config; tpuops state in `home` (default: the test's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")}
    home = home or Path(env["TPUOPS_HOME"])
    return {
        **env, "TPUOPS_HOME": str(home), "TPUOPS_TPU_API": cloud.url, "CLOUDSDK_CONFIG": str(home / "no-gcloud"),
        "XDG_CONFIG_HOME": str(home / "xdg"), "COLUMNS": "200",
    }  # fmt: skip


def tpuops(
    cloud: Cloud, args: list[str], cwd: Path, timeout: float = 300, home: Path | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True,
        env=_env(cloud, home), timeout=timeout, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def ok_json(r: subprocess.CompletedProcess[str]) -> dict:
    """The --json answer of a command that must have succeeded; on failure, the workers' logs say why."""
    if r.returncode != 0:
        runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
        tails = [
            f"{p.parent.name}/{p.name}: {p.read_text()[-1500:]}" for p in sorted(runs.glob("*/worker-*.log"))
        ]
        pytest.fail(f"exit {r.returncode}: {r.stdout[-1500:]}\n{r.stderr[-2500:]}\n" + "\n".join(tails))
    return json.loads(r.stdout)


def saved_past(vm: Vm, line: str, timeout: float = 60) -> None:
    """Wait until the follower's saved offset (runs/<id>/follow.json) is past the first line of worker 0's log
    that starts with `line`: killed from then on, it cannot show that line again on attach."""
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for saved in runs.glob("*/follow.json"):
            log = vm.homes[0] / "tpuops" / "runs" / saved.parent.name / "worker-0.log"
            data = log.read_bytes() if log.exists() else b""
            at = (
                data.find(line.encode())
                if data.startswith(line.encode())
                else data.find(b"\n" + line.encode())
            )
            end = data.find(b"\n", at + 1) if at >= 0 else -1
            offsets = json.loads(saved.read_text() or "{}")
            if end >= 0 and offsets.get("0", 0) > end:
                return
        time.sleep(0.02)
    pytest.fail(f"the follower saved no offset past {line!r} within {timeout:g}s")


class Follower:
    """A command run in the background whose stderr lines (`tpuops logs`: stdout) are read by one thread
    (nothing read twice)."""

    def __init__(self, cloud: Cloud, args: list[str], cwd: Path, *, stdout: bool = False) -> None:
        read, other = subprocess.PIPE, subprocess.DEVNULL
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tpuops", *args], cwd=cwd, stdout=read if stdout else other,
            stderr=other if stdout else read, text=True, env=_env(cloud), stdin=subprocess.DEVNULL,
        )  # fmt: skip
        self.stream = self.proc.stdout if stdout else self.proc.stderr
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        self.ended = False  # the reader's end mark was taken from the queue
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.stream is not None
        for line in self.stream:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def wait_for(self, prefix: str, timeout: float = 240) -> None:
        """Read until a line starts with `prefix`; fail (with what was printed) on exit or time-out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                self.ended = True
                pytest.fail(f"exited {self.proc.wait()} before {prefix!r}:\n" + "\n".join(self.seen[-40:]))
            self.seen.append(line)
            if line.startswith(prefix):
                return
        self.kill()
        pytest.fail(f"no {prefix!r} line within {timeout}s:\n" + "\n".join(self.seen[-40:]))

    def kill(self) -> list[str]:
        """SIGKILL (the laptop goes away); returns every line it printed."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()
        self.reader.join(timeout=10)
        while not self.ended:  # a wait_for that saw the end took its mark: nothing more will come
            try:
                line = self.lines.get(timeout=10)
            except queue.Empty:
                break
            if line is None:
                self.ended = True
            else:
                self.seen.append(line)
        return self.seen


def step_numbers(lines: list[str], worker: int = 0) -> list[int]:
    prefix = f"[w{worker}] step="
    return [int(ln[len(prefix) :].split()[0]) for ln in lines if ln.startswith(prefix)]


def create_vm(cloud: Cloud, name: str, accelerator: str, code: dict[str, str], home: Path) -> Vm:
    create = ["vm", "create", name, "--type", accelerator, "--zone", ZONE, "--runtime-version", "base"]
    r = tpuops(cloud, create, home, timeout=120, home=home)
    assert r.returncode == 0, r.stderr
    (rec,) = [rec for n, rec in cloud.emu.model.nodes.items() if n.endswith(f"/nodes/{name}")]
    # The trainer runs' .env names the session's one JAX compilation cache (tests/conftest.py; sshd's SetEnv
    # gives every worker session the same): a run of shapes that ran before on any VM of the session (these
    # VMs' later runs; test_e2e_grpo's runs of the same TINY step on 1 and 2 workers) skips most of its ~20 s
    # of compiling. A cache hit still logs `Compiling ...`, so the recompile checks see the same lines.
    env_file = home / ".env"
    env_file.write_text(f"JAX_COMPILATION_CACHE_DIR={os.environ['JAX_COMPILATION_CACHE_DIR']}\n")
    return Vm(name, [w.user for w in rec.workers], [w.home for w in rec.workers], cloud, code, env_file)
