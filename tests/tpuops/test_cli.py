"""The CLI as users and CI jobs call it: start-up cost, exit codes, --json, one-line errors, secrets."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.tpuops.conftest import SshdPool
from tpuops.errors import ExitCode
from tpuops.run.tree import repo_home

HEAVY = (
    "jax",
    "google.cloud",
    "google.api_core",
    "fabric",
    "paramiko",
    "torch",
    "transformers",
    "matplotlib",
    "pydantic",  # tpuops.config's settings model: imported when a command runs, not for --help
)


def tpuops(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        [sys.executable, "-m", "tpuops", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_help_imports_nothing_heavy(tmp_path: Path) -> None:
    code = (
        "import sys, runpy; sys.argv=['tpuops','--help']\n"
        "try: runpy.run_module('tpuops', run_name='__main__')\nexcept SystemExit: pass\n"
        "print(sorted(m for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    modules = out.stdout.strip().splitlines()[-1]
    for heavy in HEAVY:
        assert f"'{heavy}'" not in modules and f"'{heavy}." not in modules, heavy
    assert "Usage: tpuops" in out.stdout


@pytest.mark.parametrize("argv", [["vm", "--help"], ["vm", "create", "--help"], ["emulator", "--help"]])
def test_vm_help_imports_no_google_client(tmp_path: Path, argv: list[str]) -> None:
    """The vm commands import their clients when they run: no google.cloud.tpu_v2, no google.cloud.compute_v1
    (~1.4 s) at start-up."""
    code = (
        f"import sys, runpy; sys.argv=['tpuops', *{argv!r}]\n"
        "try: runpy.run_module('tpuops', run_name='__main__')\nexcept SystemExit: pass\n"
        "print(sorted(m for m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True
    )
    modules = out.stdout.strip().splitlines()[-1]
    for heavy in ("google.cloud", "google.api_core", "paramiko"):
        assert f"'{heavy}" not in modules, heavy
    assert "Usage: tpuops" in out.stdout


def test_bad_set_is_one_line_usage_error_before_anything_runs(sshd_pool: SshdPool, tmp_path: Path) -> None:
    (w,) = sshd_pool.take(1)
    r = tpuops(
        "sop",
        "run",
        "exec",
        *sshd_pool.host_args([w]),
        "--set",
        "cmd=touch ~/ran",
        "--set",
        "timeoutt=3",
        cwd=tmp_path,
    )
    assert r.returncode == ExitCode.USAGE
    assert r.stderr.strip().splitlines() == [
        "error: unknown parameter 'timeoutt' for SOP exec; did you mean 'timeout'?"
    ]
    assert not (w.home / "ran").exists()


def test_json_report_and_exit_code_of_a_failing_worker(sshd_pool: SshdPool, tmp_path: Path) -> None:
    workers = sshd_pool.take(2)
    (workers[1].home / "fail").write_text("")
    cmd = "if [ -e ~/fail ]; then echo no-tpu-here >&2; exit 3; fi; echo fine"
    r = tpuops(
        "sop",
        "run",
        "exec",
        *sshd_pool.host_args(workers),
        "--set",
        f"cmd={cmd}",
        "--json",
        "--keep-going",
        cwd=tmp_path,
    )
    assert r.returncode == ExitCode.FAILED
    data = json.loads(r.stdout)
    assert data["ok"] is False and data["exit_code"] == 1
    assert data["failure"] == {"step": "shell", "worker": 1, "status": "failed", "detail": "no-tpu-here"}
    assert data["steps"][0]["workers"]["0"]["status"] == "ok"


def test_unknown_host_key_is_refused_with_advice(sshd_pool: SshdPool, tmp_path: Path) -> None:
    (w,) = sshd_pool.take(1)
    r = tpuops(
        "sop",
        "run",
        "exec",
        "--host",
        f"{w.user}@127.0.0.1:{w.port}",
        "-i",
        str(sshd_pool.key),
        "--set",
        "cmd=true",
        "--json",
        cwd=tmp_path,
    )
    assert r.returncode == ExitCode.CONNECT
    data = json.loads(r.stdout)
    assert data["error"] == "host_key"
    assert w.fingerprint in data["message"] and "--hostkey" in data["message"]


def test_changed_known_hosts_key_names_both_fingerprints(sshd_pool: SshdPool, tmp_path: Path) -> None:
    from tpuops.transport.hostkeys import add_known_host

    a, b = sshd_pool.take(2)
    add_known_host(Path(os.environ["TPUOPS_HOME"]) / "known_hosts", "127.0.0.1", a.port, b.host_public_key)
    r = tpuops(
        "sop",
        "run",
        "exec",
        "--host",
        f"{a.user}@127.0.0.1:{a.port}",
        "-i",
        str(sshd_pool.key),
        "--set",
        "cmd=true",
        cwd=tmp_path,
    )
    assert r.returncode == ExitCode.CONNECT
    assert a.fingerprint in r.stderr and b.fingerprint in r.stderr and "changed" in r.stderr


def _checkout(url: object) -> str:
    """Where a repository's checkout is on a worker, relative to its home (tree.repo_home)."""
    return repo_home(str(url)).removeprefix("~/") + "/checkout"


def test_secret_never_in_output_plan_or_json(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    secret = "sentinel-9d2c41aa"
    (tmp_path / ".env").write_text(f"WANDB_API_KEY={secret}\r\nOTHER = x \r\n")
    sets = [
        "--set",
        f"repo_url={git_remote[0]}",
        "--set",
        "lockfile=~/l",
        "--set",
        "steps=2",
        "--set",
        "step_seconds=0",
    ]
    base = ["sop", "run", "smoke", *sshd_pool.host_args([w]), *sets]
    plan = tpuops(*base, "--dry-run", cwd=tmp_path)
    ran = tpuops(*base, "--json", cwd=tmp_path, env={"TPUOPS_DEBUG": "0"})
    assert ran.returncode == 0, ran.stderr
    for text in (plan.stdout, plan.stderr, ran.stdout, ran.stderr):
        assert secret not in text
    # The worker got the value (normalised: CRLF and spaces gone) in a 0600 file, and the job could read it.
    env_file = w.home / _checkout(git_remote[0]) / ".env"  # the repository's own home on the worker
    assert env_file.stat().st_mode & 0o777 == 0o600
    assert env_file.read_text() == f"OTHER='x'\nWANDB_API_KEY='{secret}'\n"
    assert "fixed CRLF line endings" in json.loads(ran.stdout)["steps"][2]["workers"]["0"]["detail"]
    run_id = json.loads(ran.stdout)["run_id"]
    local = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id
    for f in local.rglob("*"):
        assert secret not in f.read_text()


def test_local_transport_runs_the_smoke_sop(tmp_path: Path) -> None:
    repo = Path(__file__).resolve().parents[2]
    r = tpuops(
        "sop",
        "run",
        "smoke",
        "--local",
        "--set",
        f"repo_url={repo}",
        "--set",
        "steps=2",
        "--set",
        "step_seconds=0",
        "--set",
        "branch=HEAD",
        "--json",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["transport"] == "local"
    assert [s["kind"] for s in data["steps"]] == [
        "git_sync",
        "clear_lockfile",
        "sync_env",
        "run",
        "follow",
        "fetch_log",
    ]
    assert "[w0] step=1" in r.stderr
    home = Path(os.environ["TPUOPS_HOME"])
    # The scratch root stands in for the VM's filesystem; the checkout is the repository's own.
    assert (home / "local/w0" / _checkout(repo) / ".git").is_dir()


def test_doctor_compares_env_keys_by_hash_and_shows_no_value(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    workers = sshd_pool.take(2)
    secret, other = "sentinel-doctor-77aa", "sentinel-other-55bb"
    (tmp_path / ".env").write_text(f"WANDB_API_KEY={secret}\nHF_TOKEN=hf-abcdef\n")
    sync = tpuops(
        "sop",
        "run",
        "sync",
        *sshd_pool.host_args(workers),
        "--set",
        f"repo_url={git_remote[0]}",
        "--set",
        "lockfile=~/l",
        cwd=tmp_path,
    )
    assert sync.returncode == 0, sync.stderr
    # Worker 1 drifts: another W&B key, no HF token.
    (workers[1].home / _checkout(git_remote[0]) / ".env").write_text(f"WANDB_API_KEY={other}\n")
    # The repository the run synced (this folder is no checkout: named as the run named it).
    r = tpuops("doctor", *sshd_pool.host_args(workers), "--json", "--lockfile", "~/l",
               "--set", f"repo_url={git_remote[0]}", cwd=tmp_path)  # fmt: skip
    assert r.returncode == 1
    data = json.loads(r.stdout)
    assert data[0]["env_keys"] == {"HF_TOKEN": "match", "WANDB_API_KEY": "match"}
    assert data[1]["env_keys"] == {"HF_TOKEN": "missing", "WANDB_API_KEY": "differs"}
    assert all(h["connected"] for h in data)
    assert data[0]["fixes"] == [] and data[1]["fixes"] == [
        "w1 .env lacks or differs in HF_TOKEN, WANDB_API_KEY: `tpuops sop run sync "
        f"{' '.join(sshd_pool.host_args(workers))}` sends yours"
    ]
    for text in (r.stdout, r.stderr):
        assert secret not in text and other not in text and "hf-abcdef" not in text


def test_doctor_looks_where_the_run_keeps_things_repo_dir_and_lockfile_from_tpuops_toml(
    sshd_pool: SshdPool, git_remote: tuple[Path, str], tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    (tmp_path / ".env").write_text("WANDB_API_KEY=sentinel-doctor-params\n")
    (tmp_path / "tpuops.toml").write_text('[params]\nrepo_dir = "~/elsewhere"\nlockfile = "~/mylock"\n')
    sync = tpuops(
        "sop", "run", "sync", *sshd_pool.host_args([w]), "--set", f"repo_url={git_remote[0]}", cwd=tmp_path
    )
    assert sync.returncode == 0, sync.stderr
    assert (w.home / "elsewhere/.env").exists() and not (w.home / _checkout(git_remote[0])).exists()
    (w.home / "mylock").write_text("")
    r = tpuops("doctor", *sshd_pool.host_args([w]), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (health,) = json.loads(r.stdout)
    assert health["env_keys"] == {"WANDB_API_KEY": "match"} and health["lock"] == "present"
    assert len(health["fixes"]) == 1 and "`tpuops sop run lockfile --host " in health["fixes"][0]
    # --set wins over the file, as it does for a run
    r = tpuops("doctor", *sshd_pool.host_args([w]), "--json", "--set", "lockfile=~/nolock", cwd=tmp_path)
    assert json.loads(r.stdout)[0]["lock"] == "absent"


def test_default_code_is_this_checkouts_pushed_head(git_remote: tuple[Path, str], tmp_path: Path) -> None:
    """Remote workers sync this checkout's origin at its HEAD commit, which must be on a remote branch."""
    bare, first = git_remote
    work = tmp_path / "work"
    subprocess.run(["git", "clone", "-q", str(bare), str(work)], check=True)
    target = [
        "--host",
        "me@192.0.2.1:22",
        "--hostkey",
        "SHA256:" + "A" * 43,
        "--dry-run",
        "--offline",
        "--json",
    ]
    pushed = tpuops("sop", "run", "sync", *target, cwd=work)
    assert pushed.returncode == 0, pushed.stderr
    values = json.loads(pushed.stdout)["values"]
    assert (values["repo_url"], values["branch"]) == (str(bare), first)
    git = ["git", "-C", str(work), "-c", "user.name=t", "-c", "user.email=t@t"]
    (work / "new.py").write_text("x = 1\n")
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-qm", "not pushed"], check=True)
    head = subprocess.run([*git, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout
    unpushed = tpuops("sop", "run", "sync", *target, cwd=work)
    assert unpushed.returncode == ExitCode.USAGE
    assert (
        unpushed.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"error: this checkout's HEAD {head[:7]} is not on any remote branch, so the workers cannot fetch it"
        )
    ), unpushed.stderr
    assert "git push it, or pass --set branch=NAME" in unpushed.stderr
    named = tpuops("sop", "run", "sync", *target, "--set", "branch=main", cwd=work)
    assert named.returncode == 0 and json.loads(named.stdout)["values"]["branch"] == "main"
    subprocess.run([*git, "push", "-q", "origin", "HEAD:main"], check=True)
    subprocess.run([*git, "fetch", "-q"], check=True)
    after = tpuops("sop", "run", "sync", *target, cwd=work)
    assert after.returncode == 0 and json.loads(after.stdout)["values"]["branch"] == head.strip()


LEAKY_SOP = """name: leaky
steps:
  - kind: sync_env
    source: .env
    dest: ~/.env
  - kind: run
    runs_dir: ~/runs
    source_env_file: ~/.env
    command: 'echo "starting with key $WANDB_API_KEY"; echo "step=0 loss=0.100000 entropy=1.0000 reward_mean=0.0000 dt=0.10s"'
  - kind: follow
    runs_dir: ~/runs
    poll_s: 0.05
  - kind: fetch_log
    runs_dir: ~/runs
"""


def test_a_job_that_prints_its_secret_is_redacted_in_every_later_view(tmp_path: Path) -> None:
    """The user's code prints its W&B key: tpuops shows *** live, and later from any folder (attach, logs)."""
    secret = "sentinel-7f3e02bb"
    (tmp_path / ".env").write_text(f"WANDB_API_KEY={secret}\n")
    (tmp_path / "leaky.yaml").write_text(LEAKY_SOP)
    ran = tpuops("sop", "run", str(tmp_path / "leaky.yaml"), "--local", "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    run_id = json.loads(ran.stdout)["run_id"]
    elsewhere = tmp_path / "elsewhere"  # no .env here: the run record says which file held the secrets
    elsewhere.mkdir()
    views = {
        "live": ran.stderr,
        "attach": tpuops("attach", run_id, "--from-start", cwd=elsewhere).stderr,
        "logs -f": tpuops("logs", run_id, "-f", "--prefix", cwd=elsewhere).stdout,
        "logs": tpuops("logs", run_id, "--prefix", cwd=elsewhere).stdout,
        "report": tpuops("report", run_id, "--json", cwd=elsewhere).stdout,
    }
    for name, text in views.items():
        assert secret not in text, name
        assert name == "report" or "[w0] starting with key ***" in text, (name, text)
    home = Path(os.environ["TPUOPS_HOME"])
    assert (home / "local/w0/.env").read_text() == f"WANDB_API_KEY='{secret}'\n"  # the job did get the value
    for f in (home / "runs" / run_id).rglob("*"):
        assert secret not in f.read_text(), f
