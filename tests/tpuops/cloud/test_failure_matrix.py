"""The failure matrix: every exit code of README's table induced end to end, read in both output modes.

One emulated VM (real sshd workers) serves the module; the trainer is stood in for by a shell job printing
the log lines the real one prints (step lines, JAX's compile and out-of-memory lines, Python tracebacks).
Each case runs twice through the CLI: people's output (the code in the last line, no traceback) and --json
(`exit_code` and `error_class`). docs/reliability.md's matrix table lists the same cases.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud

ZONE = "us-east1-d"
JOB = """name: job
description: a stand-in trainer
params:
  cmd: {type: str}
  timeout: {type: float, default: 60}
  hang_factor: {type: float, default: 0}
scan: {source: log, warmup: 1, fail_on_recompile: true}
steps:
  - kind: run
    command: "sh -c {cmd}"
    runs_dir: ~/matrix-runs
  - kind: follow
    runs_dir: ~/matrix-runs
    poll_s: 0.1
    timeout: "{timeout}"
    hang_factor: "{hang_factor}"
    hang_min_s: 1
  - kind: fetch_log
    runs_dir: ~/matrix-runs
"""
STEP = "echo 'step={i} loss=0.1 entropy=1.0 reward_mean=0.0 dt=0.20s'"
WARMUP = "echo 'Compiling jit(train_step) with global shapes and types [f32[8]]'"
# A clean run with compile logging on: its one compile comes in the warm-up, before step 0's line. Without any
# compile line, a SOP with fail_on_recompile cannot verify the run and says so (exit 13, the "unverified" case).
STEPS = "; ".join([WARMUP] + [STEP.format(i=i) for i in range(3)])
BARE_STEPS = "; ".join(STEP.format(i=i) for i in range(3))
TRACEBACK = "printf 'Traceback (most recent call last):\\n  File \"train.py\", line 3, in <module>\\n{error}\\n'; exit 1"


@dataclass(frozen=True)
class Case:
    code: int
    error_class: str
    sets: dict[str, str]
    args: tuple[str, ...] = ()  # options besides the VM's (replacing the VM with `vm=...`)
    says: str = ""  # what the people's output must name besides the code


CASES = {
    "ok": Case(0, "ok", {"cmd": STEPS}),
    "user_code": Case(1, "user_code", {"cmd": f"{STEPS}; " + TRACEBACK.format(error="ValueError: my bug")},
                      says="ValueError: my bug"),
    "bad_set": Case(2, "usage", {"cmd": "true", "timeout": "soon"}, says="parameter timeout must be float"),
    "bad_option": Case(2, "usage", {"cmd": "true"}, ("--bogus",), says="No such option: --bogus"),
    "host_key": Case(3, "connect", {"cmd": "true"}, ("--hostkey", "SHA256:" + "A" * 43), says="host key"),
    "tpu_busy": Case(4, "tpu_busy", {"cmd": "echo 'RuntimeError: Unable to initialize backend tpu: ABORTED: The "
                     "TPU is already in use by process with pid 4242.'; exit 1"}, says="already in use"),
    "timeout": Case(5, "timeout", {"cmd": "sleep 30", "timeout": "1"}, says="timed out after 1s"),
    "cloud": Case(6, "cloud", {"cmd": "true"}, ("vm=no-such-vm",), says="no-such-vm"),
    "recompile": Case(7, "recompile", {"cmd": f"{STEPS}; echo 'Compiling jit(train_step) with global shapes "
                      "and types [f32[8]]'; " + STEP.format(i=3)}, says="train_step"),
    "unverified": Case(13, "unverified", {"cmd": BARE_STEPS}, says="JAX compile logging not seen"),
    # "preempted" (8) needs a VM of its own per mode: test_a_preempted_vm_is_exit_8_in_both_outputs below.
    "hang": Case(9, "hang", {"cmd": f"{STEPS}; sleep 60", "hang_factor": "3"}, says="no step line for"),
    "oom": Case(10, "oom", {"cmd": f"{STEP.format(i=0)}; " + TRACEBACK.format(
        error="jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED: Out of memory while trying to "
        "allocate 8.00GiB.")}, says="tpuops fit CONFIG --accelerator v4-8 --set train.micro_batch="),
}  # fmt: skip


@pytest.fixture(scope="module")
def matrix_vm(
    cloud_session: Cloud, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Cloud, str, Path]]:
    """One 1-worker VM and a folder holding the job SOP; the VMs this module made are gone after it."""
    model = cloud_session.emu.model
    before = set(model.nodes)
    home = tmp_path_factory.mktemp("matrix")
    (home / "job.yaml").write_text(JOB)
    name = f"m{os.getpid() % 1000}-matrix"
    made = run(
        cloud_session,
        home,
        "vm",
        "create",
        name,
        "--type",
        "v4-8",
        "--zone",
        ZONE,
        "--runtime-version",
        "base",
    )
    assert made.returncode == 0, made.stderr
    yield cloud_session, name, home
    with model.lock:
        ours = [model.nodes[n] for n in set(model.nodes) - before]
    for rec in ours:
        model._teardown(rec, None)


def run(cloud: Cloud, cwd: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")}
    env.update(TPUOPS_TPU_API=cloud.url, CLOUDSDK_CONFIG=str(cwd / "no-gcloud"), XDG_CONFIG_HOME=str(cwd / "xdg"),
               COLUMNS="200")  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, env=env, timeout=timeout,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def job_args(cloud: Cloud, vm: str, home: Path, case: Case, as_json: bool) -> list[str]:
    extra = [a for a in case.args if not a.startswith("vm=")]
    vm = next((a[3:] for a in case.args if a.startswith("vm=")), vm)
    # --force: a job a timeout or a hang left running on the VM is stopped (one run per VM).
    args = [
        "sop",
        "run",
        str(home / "job.yaml"),
        "--vm",
        vm,
        "--zone",
        ZONE,
        "--identity",
        str(cloud.identity),
    ]
    args.append("--force")
    args += [w for k, v in case.sets.items() for w in ("--set", f"{k}={v}")] + extra
    return args + (["--json"] if as_json else [])


def check_people(r: subprocess.CompletedProcess[str], code: int, says: str) -> None:
    """People's output: the exit code, said on stderr, what went wrong named, and never a traceback."""
    assert r.returncode == code, r.stderr[-3000:]
    assert "Traceback (most recent" not in r.stderr.replace("[w0] Traceback (most recent", ""), r.stderr[
        -3000:
    ]
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ") or last.endswith(f"exit code {code}"), last
    assert says in " ".join(r.stderr.split()), r.stderr[-3000:]


def check_json(r: subprocess.CompletedProcess[str], code: int, error_class: str) -> dict:
    assert r.returncode == code, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert (data["exit_code"], data["error_class"]) == (code, error_class), data
    return data


@pytest.mark.parametrize("mode", ["people", "json"])
@pytest.mark.parametrize("name", list(CASES))
def test_each_exit_code_end_to_end(name: str, mode: str, matrix_vm: tuple[Cloud, str, Path]) -> None:
    cloud, vm, home = matrix_vm
    case = CASES[name]
    t0 = time.monotonic()
    r = run(cloud, home, *job_args(cloud, vm, home, case, mode == "json"))
    took = time.monotonic() - t0
    if mode == "people":
        check_people(r, case.code, case.says)
        if case.code == 9:
            assert re.search(r"│ follow +│ hang hung: no step line for", r.stderr), r.stderr[-2000:]
    else:
        data = check_json(r, case.code, case.error_class)
        if case.code == 10:
            assert data["log"]["cause"]["kind"] == "oom" and "tpuops fit" in data["hint"], data
        if case.code == 9:
            assert data["failure"]["status"] == "hang", data["failure"]
    if case.code in (5, 9):
        assert took < 30  # reported at the timeout or the hang bound, not the job's own 30-60 s


def test_a_preempted_vm_is_exit_8_in_both_outputs(matrix_vm: tuple[Cloud, str, Path]) -> None:
    cloud, _, home = matrix_vm
    for mode in ("people", "json"):
        name = f"m{os.getpid() % 1000}-pre-{mode}"
        made = run(
            cloud, home, "vm", "create", name, "--type", "v4-8", "--zone", ZONE, "--runtime-version", "base"
        )
        assert made.returncode == 0, made.stderr
        node = next(k for k in cloud.emu.model.nodes if k.endswith(f"/{name}"))
        case = Case(8, "preempted", {"cmd": f"{STEPS}; sleep 120"})
        argv = [sys.executable, "-m", "tpuops", *job_args(cloud, name, home, case, mode == "json")]
        env = {
            **os.environ,
            "TPUOPS_TPU_API": cloud.url,
            "COLUMNS": "200",
            "CLOUDSDK_CONFIG": str(home / "no-gcloud"),
        }
        proc = subprocess.Popen(
            argv, cwd=home, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        assert proc.stderr is not None
        while "[w0] step=2 " not in (line := proc.stderr.readline()):
            assert line, "the run ended before step 2"
        cloud.emu.model.preempt(node)
        out, err = proc.communicate(timeout=60)
        r = subprocess.CompletedProcess(argv, proc.returncode, out, err)
        if mode == "people":
            check_people(r, 8, "was PREEMPTED at step 2")
        else:
            check_json(r, 8, "preempted")


def test_tpu_api_retries_of_a_vm_run_are_printed_at_start_and_in_the_watch(
    matrix_vm: tuple[Cloud, str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    cloud, vm, home = matrix_vm
    cloud.emu.admin("faults", unavailable=2)  # the run's first two API calls answer 503
    r = run(cloud, home, *job_args(cloud, vm, home, CASES["ok"], False))
    check_people(r, 0, "exit code 0")
    retries = [ln for ln in r.stderr.splitlines() if ln.startswith("tpu-api ") and "retry" in ln]
    assert [("retry 1/5" in ln, "retry 2/5" in ln) for ln in retries] == [(True, False), (False, True)], (
        r.stderr
    )

    # The VM watch (every 0.2 s here): a 503 while the job runs is retried and said, and the run goes on.
    from tpuops.config import TargetSpec
    from tpuops.run import launch

    monkeypatch.setenv("TPUOPS_TPU_API", cloud.url)
    notes: list[str] = []

    def line(w: int, text: str) -> None:
        if text.startswith("step=1 "):
            cloud.emu.admin("faults", unavailable=1)

    spec = TargetSpec(vm=vm, zone=ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    req = launch.RunRequest(str(home / "job.yaml"), {"cmd": f"{STEPS}; sleep 1.5"}, spec, force=True)
    report = launch.start(req, max_recoveries=0, watch_s=0.2, on_line=line, notify=notes.append, cwd=home)
    assert report.ok and any("get" in n.lower() and "retry 1/5" in n for n in notes), notes
