"""What workers print, as the user sees it: secrets in every form redacted (also after the local .env changed),
terminal control sequences inert (unless --raw), the local run folder private. Local transport, real CLI."""

from __future__ import annotations

import json
import os
import shlex
import stat
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

import pytest

from tests.tpuops.test_usage_errors import tpuops

PW = 'pa"ss wo&rd/x\\y'
PEM_LINES = [
    "-----BEGIN PRIVATE KEY-----",
    "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC",
    "BKcwggSjAgEAAoIBAQC7VJTUt9Us8cKj",
    "-----END PRIVATE KEY-----",
]
PEM = "\n".join(PEM_LINES)
# Every form the job prints a value in; none may reach the user.
FORMS = [PW, json.dumps(PW)[1:-1], shlex.quote(PW), quote(PW, safe=""), quote_plus(PW), *PEM_LINES[1:3]]
FORMS += [json.dumps(PEM)[1:-1]]

SOP = """name: job
description: a detached job printing its secrets (tests)
params:
  env_file: {type: path, default: .env, description: "local .env"}
  python: {type: str, description: "interpreter"}
  script: {type: str, description: "the job"}
steps:
  - kind: sync_env
    source: "{env_file}"
    dest: "~/job/.env"
  - kind: run
    source_env_file: "~/job/.env"
    command: "{python} {script}"
  - kind: follow
  - kind: fetch_log
"""
JOB = r"""import json, os, shlex, urllib.parse as u
pw, pem = os.environ["PW"], os.environ["PEM"]
print("plain", pw)
print("json", json.dumps(pw))
print("config: " + json.dumps({"pw": pw, "pem": pem}))
print("sh", shlex.quote(pw))
print("url", u.quote(pw, safe=""), u.quote_plus(pw))
print(pem)
print("\x1b]0;owned\x07title \x1b[2J clear \x1b]52;c;aGVsbG8=\x07 clipboard \x9b31m c1")
"""


@pytest.fixture
def job_run(tmp_path: Path) -> tuple[str, Path, str]:
    """A finished run of the job: (run id, cwd, what `tpuops sop run` printed on stderr and stdout)."""
    (tmp_path / "job.yaml").write_text(SOP)
    (tmp_path / "job.py").write_text(JOB)
    # python-dotenv reads `\n` in double quotes as a newline: PEM is a real multi-line value.
    escaped = PW.replace("\\", "\\\\").replace('"', '\\"')
    (tmp_path / ".env").write_text(f'PW="{escaped}"\nPEM="{PEM.replace(chr(10), chr(92) + "n")}"\n')
    argv = ["sop", "run", "./job.yaml", "--local", "--set", f"python={sys.executable}"]
    argv += ["--set", f"script={tmp_path / 'job.py'}"]
    shown = ""
    for extra in ([], ["--json"]):
        r = tpuops(*argv, *extra, cwd=tmp_path)
        assert r.returncode == 0, r.stderr
        shown += r.stderr + r.stdout
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    run_id = sorted(p.name for p in runs.iterdir())[-1]
    return run_id, tmp_path, shown


def _assert_no_secret(text: str, where: str) -> None:
    for form in FORMS:
        assert form not in text, f"{form!r} in {where}"


def test_every_form_of_a_secret_is_redacted_live_in_json_and_in_local_copies(
    job_run: tuple[str, Path, str],
) -> None:
    _, _, shown = job_run
    _assert_no_secret(shown, "the run's output")
    assert "[w0] plain ***" in shown and '"pw": "***"' in shown and "[w0] url *** ***" in shown
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    for f in runs.rglob("*"):
        if f.is_file():
            _assert_no_secret(f.read_text(), str(f))


def test_the_local_run_folder_is_private(job_run: tuple[str, Path, str]) -> None:
    runs = Path(os.environ["TPUOPS_HOME"]) / "runs"
    for d in (runs, runs / job_run[0]):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
    files = list((runs / job_run[0]).iterdir())
    assert {f.name for f in files} >= {"run.json", "result.json", "worker-0.log", "worker-0.exit"}
    for f in files:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f


def test_logs_and_attach_redact_what_was_sent_after_the_local_env_changed(
    job_run: tuple[str, Path, str],
) -> None:
    """The run record keeps keyed hashes of what was sent (never a value): `logs` learns the values from the
    worker's own .env (the fast way), and with that gone too `attach` finds them by their hashes."""
    run_id, cwd, _ = job_run
    (cwd / ".env").write_text("PW=a-new-value\n")
    local = Path(os.environ["TPUOPS_HOME"]) / "runs" / run_id
    (local / "worker-0.log").unlink()  # so `logs` reads the worker's own copy
    record = (local / "run.json").read_text()
    _assert_no_secret(record, "run.json")
    assert json.loads(record)["secret_digests"]["forms"]
    logs = tpuops("logs", run_id, cwd=cwd)
    assert logs.returncode == 0 and "plain ***\n" in logs.stdout, (
        logs.stderr
    )  # one worker: its lines as they are
    _assert_no_secret(logs.stderr + logs.stdout, "tpuops logs")
    (Path(os.environ["TPUOPS_HOME"]) / "local" / "w0" / "job" / ".env").unlink()  # the worker's copy gone too
    attached = tpuops("attach", run_id, "--from-start", cwd=cwd)
    assert attached.returncode == 0 and "[w0] plain ***" in attached.stderr, attached.stderr
    _assert_no_secret(attached.stderr + attached.stdout, "tpuops attach")
    _assert_no_secret((local / "worker-0.log").read_text(), "the copy attach fetched")


def test_terminal_escapes_from_workers_are_inert_unless_raw(job_run: tuple[str, Path, str]) -> None:
    run_id, cwd, shown = job_run
    logs = tpuops("logs", run_id, cwd=cwd)
    for text in (shown, logs.stdout):
        assert "\x1b" not in text and "\x07" not in text and "\x9b" not in text
        assert "\\x1b]0;owned\\x07title \\x1b[2J clear \\x1b]52;c;aGVsbG8=\\x07 clipboard \\x9b31m c1" in text
    raw = tpuops("logs", run_id, "--raw", cwd=cwd)
    assert "\x1b]52;c;aGVsbG8=" in raw.stdout and "\x1b[2J" in raw.stdout


def test_values_too_short_to_redact_are_named_when_sent(tmp_path: Path) -> None:
    """Under MIN_SECRET_CHARS a value is not redacted (docs/reliability.md says why); the run says which keys."""
    (tmp_path / "job.yaml").write_text(SOP)
    (tmp_path / "job.py").write_text("print('ok')\n")
    (tmp_path / ".env").write_text("PIN=123\nX=1\nTOKEN=long-enough-value\n")
    argv = ["sop", "run", "./job.yaml", "--local", "--set", f"python={sys.executable}"]
    r = tpuops(*argv, "--set", f"script={tmp_path / 'job.py'}", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    (sync,) = [s for s in json.loads(r.stdout)["steps"] if s["kind"] == "sync_env"]
    assert "not redacted (under 4 characters): PIN, X" in json.dumps(sync)
    assert "long-enough-value" not in r.stdout + r.stderr
