"""Every Google API answer is checked: an HTML page (a captive portal, a proxy's error page), JSON cut off
half-way, or no answer at all from the TPU API or Compute Engine is one line and exit 6 for `vm describe`,
`vm list` and `run --dry-run --vm` (the emulator's `fault answer`, the real google-cloud-tpu and REST clients);
a run already going survives them; `vm create` names that would outgrow the API's limits are exit 2 before any
request. TPUOPS_API_TIMEOUT=0.5 keeps each hang to about 2 s (4 x 0.5 s, api_core's Retry deadline)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.tpuops.cloud.conftest import Cloud

TPU_ZONE, COMPUTE_ZONE = "us-east1-d", "us-east5-a"
SAYS = {
    "html": "answered an HTML page ('Sign in to the network') with HTTP 200, not the API's JSON",
    "proxy": "502 an HTML page ('502 Proxy Error')",
    "truncated": "answered JSON that is cut off or damaged",
    "hang": "no answer within 2s (each try waited 0.5s)",
}


def tpuops(cloud: Cloud, cwd: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        k: v for k, v in os.environ.items() if k not in ("GOOGLE_CLOUD_PROJECT", "CLOUDSDK_CORE_PROJECT")
    }
    clean.update(TPUOPS_TPU_API=cloud.url, CLOUDSDK_CONFIG=str(cwd / "no-gcloud"), COLUMNS="200",
                 TPUOPS_API_TIMEOUT="0.5", **env)  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, env=clean, timeout=120,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


@pytest.fixture(scope="module")
def vms(cloud_session: Cloud, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Cloud, Path, dict]]:
    """A Cloud TPU node and a Compute Engine TPU instance (one worker each); gone after the module."""
    model = cloud_session.emu.model
    before, before_instances = set(model.nodes), set(model.compute.instances)
    home = tmp_path_factory.mktemp("answers")
    tag = f"a{os.getpid() % 1000}"
    names = {"tpu": f"{tag}-node", "compute": f"{tag}-inst"}
    for args in (
        ["vm", "create", names["tpu"], "--type", "v4-8", "--zone", TPU_ZONE, "--runtime-version", "base"],
        ["vm", "create", names["compute"], "--type", "tpu7x-8", "--zone", COMPUTE_ZONE, "--wait"],
    ):
        made = tpuops(cloud_session, home, *args)
        assert made.returncode == 0, made.stderr
    yield cloud_session, home, names
    model.faults.answers.clear()
    with model.lock:
        nodes = [model.nodes[n] for n in set(model.nodes) - before]
        instances = [model.compute.instances[n] for n in set(model.compute.instances) - before_instances]
    for rec in nodes:
        model._teardown(rec, None)
    for inst in instances:
        model.compute._remove(inst, None)


def _break(cloud: Cloud, mode: str, api: str) -> None:
    kind, code = ("html", 502) if mode == "proxy" else (mode, 200)
    cloud.emu.admin("faults", answers={"mode": kind, "count": 1000, "api": api, "code": code})


def _one_error_line(r: subprocess.CompletedProcess[str]) -> str:
    """The one error line of a failed command; every other stderr line is a retry note."""
    lines = r.stderr.strip().splitlines()
    errors = [ln for ln in lines if not ("retry " in ln and ln.startswith("tpu-api "))]
    assert r.returncode == 6 and len(errors) == 1 and "Traceback" not in r.stderr, (r.returncode, r.stderr)
    assert errors[0].startswith("error: "), errors
    return errors[0]


COMMANDS = {
    "describe": lambda name, zone: ["vm", "describe", name],
    "list": lambda name, zone: ["vm", "list"],
    "dry-run": lambda name, zone: [
        "run",
        "exec",
        "--vm",
        name,
        "--zone",
        zone,
        "--dry-run",
        "--set",
        "cmd=true",
    ],
}


@pytest.mark.parametrize("api", ["tpu", "compute"])
@pytest.mark.parametrize("mode", ["html", "proxy", "truncated", "hang"])
@pytest.mark.parametrize("command", list(COMMANDS))
def test_a_broken_answer_is_one_line_and_exit_6(
    vms: tuple[Cloud, Path, dict], command: str, mode: str, api: str
) -> None:
    cloud, home, names = vms
    zone = TPU_ZONE if api == "tpu" else COMPUTE_ZONE
    argv = COMMANDS[command](names[api], zone)
    _break(cloud, mode, api)
    try:
        t0 = time.monotonic()
        r = tpuops(cloud, home, *argv, "--identity", str(cloud.identity)) if command == "dry-run" else (
            tpuops(cloud, home, *argv)
        )  # fmt: skip
        took = time.monotonic() - t0
    finally:
        cloud.emu.model.faults.answers.clear()
    line = _one_error_line(r)
    service = "TPU API" if api == "tpu" else "Compute API"
    assert line.startswith(f"error: {service} ") and SAYS[mode] in line, line
    assert "/v2/" not in line and "/compute/v1/" not in line and "<" not in line, (
        line
    )  # no request URL, no markup
    if mode == "hang":
        assert took < 30, took  # the deadline, not a 30 s try or a forever
    if mode != "hang":
        return
    # Once the API answers again, so does the same command (nothing of the hang is left in the client's pool).
    again = tpuops(cloud, home, *argv, "--identity", str(cloud.identity)) if command == "dry-run" else (
        tpuops(cloud, home, *argv)
    )  # fmt: skip
    assert again.returncode == 0, again.stderr


TICKS = """name: ticks
description: a job that prints a line every 2 s
params:
  cmd: {type: str}
steps:
  - kind: run
    command: "sh -c {cmd}"
    runs_dir: ~/answers-runs
  - kind: follow
    runs_dir: ~/answers-runs
    poll_s: 0.1
    timeout: 60
"""


def test_a_running_job_outlives_broken_answers_to_its_watch(
    vms: tuple[Cloud, Path, dict], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The VM watch (every 0.2 s here) meets a web page, cut JSON and a hang while the job runs: the run goes on
    and ends ok."""
    from tpuops.config import TargetSpec
    from tpuops.run import launch

    cloud, home, names = vms
    monkeypatch.setenv("TPUOPS_TPU_API", cloud.url)
    monkeypatch.setenv("TPUOPS_API_TIMEOUT", "0.5")
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(home / "no-gcloud"))
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    faults = iter(["html", "truncated", "hang"])

    since: list[int] = []  # the request log's length at each fault

    def line(w: int, text: str) -> None:
        if text.startswith("tick") and (mode := next(faults, None)):
            since.append(len(cloud.emu.model.requests))
            _break(cloud, mode, "tpu")

    (home / "ticks.yaml").write_text(TICKS)
    steps = "for i in 1 2 3; do echo tick $i; sleep 2; done"
    spec = TargetSpec(vm=names["tpu"], zone=TPU_ZONE, api_endpoint=cloud.url, identity=str(cloud.identity))
    req = launch.RunRequest(str(home / "ticks.yaml"), {"cmd": steps}, spec, force=True)
    try:
        report = launch.start(
            req, max_recoveries=0, watch_s=0.2, on_line=line, notify=lambda _m: None, cwd=home
        )
    finally:
        cloud.emu.model.faults.answers.clear()
    assert report.ok, report
    assert len(since) == 3  # each fault was on while the job ran, and the watch asked through each of them
    for start, end in zip(since, [*since[1:], len(cloud.emu.model.requests)], strict=True):
        assert any(r.purpose == "watch" for r in cloud.emu.model.requests[start:end]), (start, end)


@pytest.mark.parametrize(
    "args, says",
    [
        (["--type", "v4-8", "--runtime-version", "base", "--slices", "2"], "its last slice would be"),
        (["--type", "tpu7x-16"], "Compute Engine takes at most 58 for NAME"),
    ],
)
def test_names_a_create_would_make_too_long_are_exit_2_before_any_request(
    cloud: Cloud, tmp_path: Path, args: list[str], says: str
) -> None:
    zone = COMPUTE_ZONE if "tpu7x-16" in args else TPU_ZONE
    n = len(cloud.emu.model.requests)
    r = tpuops(cloud, tmp_path, "vm", "create", "v" * 62, "--zone", zone, *args)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2 and len(lines) == 1 and says in lines[0], r.stderr
    assert cloud.calls(n) == []
