"""Every everyday command on emulated TPU VMs (1 and 2 workers): real sshd, real git, the tiny model on CPU.

One 1-worker VM (v4-8) and one 2-worker VM (v4-16) serve the whole module, and commands that fit together
share a test, so the trainer starts as few times as the checks allow.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud
from tests.tpuops.cloud.vms import (
    Follower,
    Vm,
    create_vm,
    ok_json,
    saved_past,
    step_numbers,
    tpuops,
)
from tpuops.errors import ExitCode


@pytest.fixture(scope="module")
def module_cloud(cloud_session: Cloud) -> Iterator[Cloud]:
    """The session emulator; the VMs this module made are powered off after its last test."""
    model = cloud_session.emu.model
    before = set(model.nodes)
    yield cloud_session
    with model.lock:
        made = [model.nodes[n] for n in set(model.nodes) - before]
    for rec in made:
        model._teardown(rec, None)


@pytest.fixture(scope="module")
def code_sets(worker_python: str, committed_repo: Path) -> dict[str, str]:
    """The SOPs' --set values that point the workers at the bare clone of this checkout's HEAD."""
    head = subprocess.run(
        ["git", "-C", str(committed_repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return {
        "repo_url": str(committed_repo), "branch": head, "venv": "none", "python": worker_python,
        "lockfile": "~/libtpu_lockfile",
    }  # fmt: skip


@pytest.fixture(scope="module")
def vm1(module_cloud: Cloud, code_sets: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Vm:
    vm = create_vm(
        module_cloud, f"c{os.getpid() % 1000}-one", "v4-8", code_sets, tmp_path_factory.mktemp("vm1")
    )
    assert len(vm.users) == 1
    return vm


@pytest.fixture(scope="module")
def vm2(module_cloud: Cloud, code_sets: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Vm:
    vm = create_vm(
        module_cloud, f"c{os.getpid() % 1000}-two", "v4-16", code_sets, tmp_path_factory.mktemp("vm2")
    )
    assert len(vm.users) == 2
    return vm


# -- both, first: nothing may touch a worker -----------------------------------------------------------


def _snapshot(homes: list[Path]) -> list[tuple[str, int]]:
    return sorted((str(p), p.lstat().st_mtime_ns) for h in homes for p in h.rglob("*"))


@pytest.mark.parametrize("workers", [1, 2])
def test_trainer_override_typo_is_refused_before_any_remote_command(
    workers: int, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    vm: Vm = request.getfixturevalue(f"vm{workers}")
    before = _snapshot(vm.homes)
    sets = {**vm.trainer_sets(3), "train.stepz": "3"}
    r = tpuops(vm.cloud, vm.args("run", "grpo", sets=sets), tmp_path)
    assert r.returncode == 2, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        "error: trainer config: unknown config key 'train.stepz'; did you mean 'train.steps'?"
    )
    assert _snapshot(vm.homes) == before  # no file on any worker was made or changed
    assert ok_json(tpuops(vm.cloud, ["runs", "--json"], tmp_path)) == []  # no run was started or recorded


# -- one worker ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_recompile_check_fails_on_changing_shapes_and_names_the_function_on_one_worker(
    vm1: Vm, tmp_path: Path
) -> None:
    # Each step pads its prompts to the smallest of many buckets: the shapes change from step to step. Two steps
    # are enough: step 0 is the warm-up and step 1, in a bucket of its own, compiles again (each compile of a
    # new bucket costs seconds of CPU: no more steps than the check needs).
    buckets = ",".join(str(b) for b in range(48, 264, 8))
    sets = {**vm1.trainer_sets(2), "data.fixed_bucket": "false", "data.prompt_buckets": buckets}
    r = tpuops(vm1.cloud, vm1.args("recompile-check", "--json", sets=sets), tmp_path)
    assert r.returncode == 7, r.stderr[-3000:]
    data = json.loads(r.stdout)
    assert data["sop"] == "recompile-check" and data["workers"] == [0] and data["error_class"] == "recompile"
    assert {w["sha"] for w in data["steps"][0]["workers"].values()} == {vm1.code["branch"][:7]}
    log = data["log"]
    assert log["steps"] == 2 and log["exit_codes"] == {"0": 0} and not log["failures"]
    recompiles = log["recompiles"]
    assert log["compiles"]["after_warmup"] == len(recompiles) > 0
    functions = {c["function"] for c in recompiles}
    assert any("update" in f for f in functions) and any("_prefill" in f for f in functions), functions
    assert all(c["step"] >= 1 and c["worker"] == 0 for c in recompiles)
    assert any(c["explanation"] for c in recompiles)  # JAX's reason for the cache miss
    # `tpuops report` reads the local copy the run fetched: the same verdict and the same compiles.
    again = tpuops(vm1.cloud, ["report", data["run_id"], "--json"], tmp_path)
    assert again.returncode == 7
    assert json.loads(again.stdout)["report"]["compiles"] == log["compiles"]
    # People's output names each one, with JAX's explanation.
    text = tpuops(vm1.cloud, ["report", data["run_id"]], tmp_path).stderr
    shown = [ln for ln in text.splitlines() if ln.startswith("recompile at step ")]
    assert len(shown) == len(recompiles) and any("_prefill" in ln for ln in shown), text
    assert "recompiles after warm-up (exit code 7)" in text
    # A warm-up window wide enough to hold every step counts none of them as a recompile.
    loose = ok_json(tpuops(vm1.cloud, ["report", data["run_id"], "--warmup", "2", "--json"], tmp_path))
    assert loose["report"]["recompiles"] == []


@pytest.mark.slow
def test_detached_run_on_one_worker_runs_logs_stop_attach(vm1: Vm, tmp_path: Path) -> None:
    sets = {"repo_url": vm1.code["repo_url"], "branch": vm1.code["branch"], "lockfile": "~/libtpu_lockfile",
            "steps": "2000", "step_seconds": "0.05"}  # fmt: skip
    first = Follower(vm1.cloud, vm1.args("sop", "run", "smoke", sets=sets), tmp_path)
    first.wait_for("[w0] step=5 ")
    saved_past(vm1, "step=5 ")  # a line is shown, then its offset saved: a kill -9 between shows it again
    shown = first.kill()
    (record,) = ok_json(tpuops(vm1.cloud, ["runs", "--json"], tmp_path))
    assert (record["sop"], record["target"], record["workers"]) == ("smoke", vm1.name, [0])
    assert record["status"] == "running"  # asked of the workers: the job goes on
    run_id = record["run_id"]

    logs = tpuops(vm1.cloud, ["logs", run_id], tmp_path)
    assert logs.returncode == 0, logs.stderr
    # The log on stdout as the worker wrote it (one worker: no prefix); how the VM was reached on stderr.
    assert "\nstep=5 " in logs.stdout and not any(
        ln.startswith(("[w", "tpu-api ")) for ln in logs.stdout.splitlines()
    )
    live = Follower(
        vm1.cloud, ["logs", run_id, "-f", "--prefix"], tmp_path, stdout=True
    )  # until the run ends
    live.wait_for("[w0] step=")

    stop = ok_json(tpuops(vm1.cloud, ["stop", run_id, "--json"], tmp_path))
    assert live.proc.wait(timeout=60) == 0  # `logs -f` ended by itself when the run did
    live.reader.join(timeout=10)
    while (line := live.lines.get()) is not None:
        live.seen.append(line)
    followed = step_numbers(live.seen)
    (w,) = stop["workers"].values()
    assert w["ok"] and w["detail"].startswith("terminated") and w["detail"].endswith("lock cleared"), w
    left = subprocess.run(["pgrep", "-u", vm1.users[0], "-f", "sleep 0.05"], check=False, capture_output=True)
    assert left.returncode == 1, left.stdout  # nothing of the job is left

    # Attach to the stopped run: it shows the lines the killed follower had not, then reports how it ended.
    attached = tpuops(vm1.cloud, ["attach", run_id, "--json"], tmp_path)
    assert attached.returncode == ExitCode.STOPPED, attached.stderr
    steps = step_numbers(shown) + step_numbers(attached.stderr.splitlines())
    assert steps == list(range(len(steps))) and 5 < len(steps) < 2000  # none lost, none twice, stopped early
    assert followed == steps  # `logs -f` printed the whole log, from the first line to the last
    log = json.loads(attached.stdout)["report"]
    assert log["exit_codes"] == {"0": 143} and log["steps"] == len(steps)
    (record,) = ok_json(tpuops(vm1.cloud, ["runs", "--json"], tmp_path))
    assert record["status"] == "stopped"  # `tpuops stop` recorded how the run ended


# -- two workers --------------------------------------------------------------------------------------


@pytest.mark.slow
def test_bench_rollout_compares_two_variants(vm1: Vm, tmp_path: Path) -> None:
    """On one worker only: each variant is a run of its own through the path every run takes (the multi-worker
    runs are the grpo and detached tests'), and each worker is a trainer process that costs seconds of compiles.
    The variant is another seed (run-to-run noise, a real use of the bench): the same programs, so the second run
    reads the first one's compiles from the session's cache."""
    vm, workers = vm1, 1
    argv = vm.args("bench", "rollout", "--variant", "", "--variant", "train.seed=1", "--json",
                   sets=vm.trainer_sets(2))  # fmt: skip
    base, short = ok_json(tpuops(vm.cloud, argv, tmp_path, timeout=500))
    assert base["label"] == "baseline" and short["label"] == "train.seed=1"
    assert base["ok"] and short["ok"] and base["steps"] == short["steps"] == 2
    assert base["dt_p50_ratio"] == 1.0 and short["rollout_ratio"] is not None
    assert base["rollout_generate_mean"] > 0 and short["rollout_generate_mean"] > 0
    assert base["run_id"] != short["run_id"]
    # Each variant is a run of its own, with its own fetched log, and the trainer ran each one's config.
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    for row, seed in ((base, 0), (short, 1)):
        log = (runs / row["run_id"] / "worker-0.log").read_text().splitlines()
        # The log's `config:` line is a short summary; the full JSON is fetched beside the log (config.json).
        assert len([ln for ln in log if ln.startswith("config: ")]) == 1
        config = json.loads((runs / row["run_id"] / "config.json").read_text())
        assert config["train"]["seed"] == seed
        (start,) = [ln for ln in log if ln.startswith("start: ")]
        assert f"process_count={workers} " in start  # one jax.distributed job over every worker
        assert sorted(p.name for p in (runs / row["run_id"]).glob("worker-*.log")) == [
            f"worker-{w}.log" for w in range(workers)
        ]


@pytest.mark.slow
def test_gradcheck_and_microbench(vm2: Vm, tmp_path: Path) -> None:
    """On two workers only, each checking its own devices (one worker is one of them)."""
    vm, workers = vm2, 2
    everyone = [str(w) for w in range(workers)]
    data = ok_json(tpuops(vm.cloud, vm.args("gradcheck", "ce", "--json", sets=vm.code), tmp_path))
    assert data["sop"] == "gradcheck" and data["workers"] == list(range(workers)) and data["exit_code"] == 0
    (check,) = [s for s in data["steps"] if s["title"] == "gradcheck"]
    assert sorted(check["workers"]) == everyone
    # Each worker checked its own devices to the end (its last line is its metrics line).
    assert all(o["detail"].startswith('metrics: {"kind":"gradcheck"') for o in check["workers"].values())
    (m,) = data["log"]["metrics"]  # worker 0's: the merged report keeps one worker's metrics
    assert m["kind"] == "gradcheck" and m["loss"] == "ce" and m["ok"] and m["backend"] == "cpu"
    assert set(m["impls"]) >= {"chunked", "pallas", "fused_lm_head"}
    assert all(r["ok"] for r in m["impls"].values())

    sets = {**vm.code, "tokens": "64", "vocab": "1024", "iters": "2"}
    argv = vm.args("microbench", "--impl", "chunked", "--impl", "reference", "--json", sets=sets)
    data = ok_json(tpuops(vm.cloud, argv, tmp_path))
    assert data["sop"] == "microbench" and data["workers"] == list(range(workers))
    (bench,) = [s for s in data["steps"] if s["title"] == "microbench"]
    assert all(o["detail"].startswith('metrics: {"kind":"microbench"') for o in bench["workers"].values())
    chunked, reference = data["log"]["metrics"]  # worker 0's, one per implementation, in the order asked
    assert (chunked["impl"], reference["impl"]) == ("chunked", "reference")
    for m in (chunked, reference):
        assert m["kind"] == "microbench" and m["backend"] == "cpu"
        assert (m["B"], m["T"], m["V"]) == (1, 64, 1024) and m["iters"] == 2 and m["p50_ms"] > 0


def pgrep(user: str, pattern: str) -> list[str]:
    """The pids of `user`'s processes whose command line matches (the test's own worker users: unique names)."""
    r = subprocess.run(["pgrep", "-u", user, "-f", pattern], capture_output=True, text=True, check=False)
    return r.stdout.split()


@pytest.mark.slow
def test_detached_multihost_recompile_check_runs_logs_attach_report(vm2: Vm, tmp_path: Path) -> None:
    # Step 0 (the warm-up) is shown by the follower; attach must show the rest: steps after the warm-up to
    # check for recompiles, and more than one to show attach going on in order. Each is a step of two trainers.
    steps = 3
    # Started and followed, then the follower is killed (the laptop goes away); the job goes on.
    first = Follower(vm2.cloud, vm2.args("recompile-check", sets=vm2.trainer_sets(steps)), tmp_path)
    first.wait_for("[w0] step=0 ")
    # Both trainer processes held (SIGSTOP) while the job is looked at: a tiny step takes well under a second,
    # and `runs` asking the workers takes seconds, so without this the job may have ended already.
    held = [
        int(p) for user in vm2.users for p in pgrep(user, "trainer.main")
    ]  # the trainers (and their shells)
    assert len(held) >= 2, held
    try:
        for pid in held:
            os.kill(pid, signal.SIGSTOP)
        saved_past(vm2, "step=0 ")  # a line is shown, then its offset saved: a kill -9 between shows it again
        shown = first.kill()
        (record,) = ok_json(tpuops(vm2.cloud, ["runs", "--json"], tmp_path))
    finally:
        for pid in held:
            os.kill(pid, signal.SIGCONT)
    assert record["status"] == "running"  # asked of the workers: the job goes on
    assert (record["sop"], record["target"], record["workers"]) == ("recompile-check", vm2.name, [0, 1])
    run_id = record["run_id"]

    # Worker 1's log, read from the worker (the follower only showed worker 0's lines).
    logs = tpuops(vm2.cloud, ["logs", run_id, "--worker", "1", "--prefix"], tmp_path)
    assert logs.returncode == 0, logs.stderr
    lines = logs.stdout.splitlines()  # the log on stdout; how the VM was reached (tpu-api lines) on stderr
    assert lines and all(ln.startswith("[w1] ") for ln in lines)
    assert any(ln.startswith("[w1] start: ") and "process_count=2 process_index=1" in ln for ln in lines)

    attached = tpuops(vm2.cloud, ["attach", run_id, "--json"], tmp_path)
    data = ok_json(attached)
    # Attach went on from where the follower stopped: every step once, none twice.
    assert step_numbers(shown) + step_numbers(attached.stderr.splitlines()) == list(range(steps))
    log = data["report"]
    assert data["exit_code"] == 0 and log["steps"] == steps and log["workers"] == [0, 1]
    assert log["start"]["process_count"] == "2"  # one jax.distributed job across both workers
    assert log["exit_codes"] == {"0": 0, "1": 0} and not log["failures"]
    assert log["compiles"]["after_warmup"] == 0 and log["compiles"]["warmup"] > 0

    report = ok_json(tpuops(vm2.cloud, ["report", run_id, "--json"], tmp_path))
    assert report["report"]["steps"] == steps and report["report"]["exit_codes"] == {"0": 0, "1": 0}
    (record,) = ok_json(tpuops(vm2.cloud, ["runs", "--json"], tmp_path))
    assert record["status"] == "ok"  # attach recorded how the run ended


@pytest.mark.slow
def test_stop_a_detached_run_on_two_workers(vm2: Vm, tmp_path: Path) -> None:
    follower = Follower(vm2.cloud, vm2.args("run", "grpo", sets=vm2.trainer_sets(500)), tmp_path)
    try:
        follower.wait_for("[w0] start: ")  # both processes joined the job
    finally:
        follower.kill()
    (record,) = ok_json(tpuops(vm2.cloud, ["runs", "--json"], tmp_path))
    run_id = record["run_id"]
    stop = ok_json(tpuops(vm2.cloud, ["stop", run_id, "--json"], tmp_path))
    assert stop["run_id"] == run_id and set(stop["workers"]) == {"0", "1"}
    for w in stop["workers"].values():
        # jax.distributed's preemption notifier catches SIGTERM: the grace period ends in SIGKILL.
        assert w["ok"] and w["detail"].startswith(("terminated", "killed")), w
        assert w["detail"].endswith("lock cleared"), w
    for user in vm2.users:  # nothing of the trainer is left on either worker
        assert pgrep(user, "trainer.main") == []
    # Attaching to a stopped run fetches its logs at once and says it was stopped (exit 14), not failed.
    attached = tpuops(vm2.cloud, ["attach", run_id, "--json"], tmp_path)
    log = json.loads(attached.stdout)["report"]
    assert attached.returncode == 14 and json.loads(attached.stdout)["error_class"] == "stopped"
    assert log["exit_codes"] == {"0": 143, "1": 143}  # the jobs' own exit codes (SIGTERM) stay in the report
    # How each process ended is the report; one torn down in the middle of a collective while the other
    # was already gone may also print that traceback (seen under load), and nothing else may appear.
    kinds = {f["kind"] for f in log["failures"]}
    assert "exit_code" in kinds and kinds <= {"exit_code", "traceback"} and log["steps"] < 500, log[
        "failures"
    ]
    (record,) = ok_json(tpuops(vm2.cloud, ["runs", "--json"], tmp_path))
    assert record["status"] == "stopped"  # `tpuops stop` recorded how the run ended
    again = ok_json(tpuops(vm2.cloud, ["stop", run_id, "--json"], tmp_path))
    assert all("not running" in w["detail"] for w in again["workers"].values())
