"""Fixtures for the cloud tests: one in-process TPU API emulator per session, a client, unique VM names,
a bare clone of this checkout's HEAD."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tpuops.cloud.client import Api, connect
from tpuops.cloud.emulator.server import Emulator
from tpuops.cloud.emulator.sshd import client_keypair, sshd_available, user_prefix

REPO = Path(__file__).resolve().parents[3]
ZONES = ["us-central1-a", "us-east1-d", "us-east5-a", "europe-west4-a"]
_names = itertools.count()


@dataclass
class Cloud:
    """The running emulator, a client for it, and the SSH identity its VMs accept."""

    emu: Emulator
    url: str
    identity: Path
    public: str
    notes: list[str] = field(default_factory=list)

    def api(self) -> Api:
        self.notes.clear()
        return connect(None, self.url, self.notes.append)

    def calls(self, since: int = 0) -> list[str]:
        """The emulator's request log from index `since` on, as `METHOD /path` lines."""
        return [r.line for r in self.emu.model.requests[since:]]

    def cli(
        self, *args: str, cwd: Path | None = None, env: dict[str, str] | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "tpuops", *args],
            cwd=cwd,
            check=False,
            capture_output=True,
            text=True,
            env={**os.environ, "TPUOPS_TPU_API": self.url, **(env or {})},
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )

    def run_grpo(self, vm: str, zone: str, sets: dict[str, str], cwd: Path) -> dict:
        """`tpuops run grpo --vm VM --json` with these --set values; its JSON report, or the test fails with
        the workers' own log tails. --skip-fit: emulated workers run the trainer on CPU (fit: test_fit.py)."""
        args = ["run", "grpo", "--vm", vm, "--zone", zone, "--identity", str(self.identity), "--json"]
        args.append("--skip-fit")
        for k, v in sets.items():
            args += ["--set", f"{k}={v}"]
        # A deadline, not a measure: a multi-host trainer job on a loaded 2-core machine took 77-130 s.
        r = self.cli(*args, cwd=cwd, timeout=400)
        if r.returncode != 0:  # the JSON's failed step and the workers' own logs say why
            run_dir = Path(os.environ["TPUOPS_HOME"]) / "runs"
            tails = [f"{p.name}: {p.read_text()[-1500:]}" for p in sorted(run_dir.glob("*/worker-*.log"))]
            pytest.fail(
                f"exit {r.returncode}: {r.stderr[-1500:]}\nstdout: {r.stdout[-3000:]}\n" + "\n".join(tails)
            )
        return json.loads(r.stdout)


@pytest.fixture(scope="session")
def cloud_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cloud]:
    if not sshd_available():
        pytest.fail("Debian's openssh-server is required (the README's test command installs it)")
    base = tmp_path_factory.mktemp("emulator")
    base.chmod(0o755)
    identity, public = client_keypair(base / "client")
    # This session's own worker users (deleted when the emulator stops), apart from `tpuops emulator serve`'s.
    emu = Emulator(base / "state", zones=ZONES, authorized_key=public, user_prefix=f"{user_prefix()}e")
    url = emu.start()
    yield Cloud(emu, url, identity, public)
    emu.stop()


@pytest.fixture
def cloud(cloud_session: Cloud, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cloud]:
    """The session emulator with no pending faults; VMs a test made are deleted after it."""
    monkeypatch.delenv("GOOGLE_CLOUD_PROJECT", raising=False)
    monkeypatch.delenv("CLOUDSDK_CORE_PROJECT", raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(Path(os.environ["TPUOPS_HOME"]) / "no-gcloud"))
    model = cloud_session.emu.model
    compute = model.compute
    before = set(model.nodes)
    before_compute = {t: set(getattr(compute, t)) for t in ("instances", "migs", "templates", "policies")}
    yield cloud_session
    with model.lock:
        model.faults.unavailable = 0
        model.faults.capacity.clear()
        model.faults.answers.clear()
        made = [model.nodes[n] for n in set(model.nodes) - before]
        instances = [compute.instances[n] for n in set(compute.instances) - before_compute["instances"]]
        for table in ("migs", "templates", "policies"):
            for n in set(getattr(compute, table)) - before_compute[table]:
                getattr(compute, table).pop(n)
    for rec in made:
        model._teardown(rec, None)
    for inst in instances:
        compute._remove(inst, None)
    with model.lock:
        model.qrs.clear()


@pytest.fixture
def vm_name() -> str:
    return f"t{os.getpid() % 1000}-{next(_names)}"


@pytest.fixture(scope="session")
def committed_repo() -> Iterator[Path]:
    """A bare clone of this checkout's HEAD that every worker user can read (the workers' `origin`).

    Under /tmp, not pytest's 0700 tmp folder, so the workers' own Unix users can fetch from it.
    """
    bare = Path(tempfile.mkdtemp(prefix="tpuops-e2e-", suffix=".git"))
    subprocess.run(["git", "clone", "-q", "--bare", str(REPO), str(bare)], check=True)
    subprocess.run(["chmod", "-R", "a+rX", str(bare)], check=True)
    yield bare
    subprocess.run(["rm", "-rf", str(bare)], check=True)
