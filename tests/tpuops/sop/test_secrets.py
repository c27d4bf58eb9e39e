""".env round trip: the local values = what a worker's `set -a; . .env` sees = what doctor parses; literal values,
refusals and fixes in one line, a named file that is missing, a stale worker .env removed, no value anywhere."""

from __future__ import annotations

import io
import json
import os
import random
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from dotenv import dotenv_values

from tests.tpuops.conftest import SshdPool
from tpuops.config import secrets
from tpuops.errors import ExitCode, UsageError

# Pieces of hostile values: quotes, backslashes, expansions, comments, blanks, line ends, unicode.
ATOMS = [
    "'",
    '"',
    "\\",
    "$",
    "${X}",
    "$(id)",
    "`id`",
    "#",
    " ",
    "\n",
    "\r\n",
    "\r",
    "\t",
    "é☃",
    "=",
    "\\n",
    "!",
]
ENV_SOP = """name: envcheck
params:
  env_file: {type: path, default: .env}
steps:
  - kind: sync_env
    source: "{env_file}"
    dest: ~/envcheck.env
  - kind: shell
    command: >-
      set -a && . ~/envcheck.env && set +a &&
      python3 -c 'import json, os; json.dump(dict(os.environ), open(os.path.expanduser("~/sourced.json"), "w"))'
"""


def _mixed(value: str) -> bool:
    """The values no .env form can carry for both readers (see secrets._form)."""
    return value.endswith("\\") or (("'" in value or "\\" in value) and ("$" in value or "`" in value))


def _hostile(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(ATOMS) for _ in range(n))


def test_every_writable_value_reads_back_exactly_in_sh_and_python_dotenv(tmp_path: Path) -> None:
    rng = random.Random(16)
    shell_checks = []
    for i in range(1500):
        value = _hostile(rng, rng.randint(0, 7))
        values = {"K": value, "NEXT": "x\"y'z"}  # a later line with quotes: K must end where it should
        if _mixed(value):
            with pytest.raises(UsageError) as e:
                secrets.serialize(values)
            assert "K" in e.value.line() and (len(value) < 4 or value not in e.value.line())
            continue
        data = secrets.serialize(values)
        assert dotenv_values(stream=io.StringIO(data.decode()), interpolate=False) == values, data
        assert secrets.parse(data) == (values, [], []), data
        if i % 15 == 0:
            shell_checks.append((value, data))
    assert len(shell_checks) > 40
    script = tmp_path / "check.sh"
    for k, (_value, data) in enumerate(shell_checks):
        (tmp_path / f"{k}.env").write_bytes(data)
    script.write_text(
        "for f in " + " ".join(f"{k}.env" for k in range(len(shell_checks))) + "; do\n"
        '  (set -a; . "./$f"; set +a; printf "%s\\0" "$K")\ndone\n'
    )
    out = subprocess.run(["sh", str(script)], cwd=tmp_path, capture_output=True, check=True).stdout
    assert out.decode().split("\0")[:-1] == [v for v, _ in shell_checks]


def test_values_are_literal_and_fixes_are_named(tmp_path: Path) -> None:
    f = tmp_path / ".env"
    f.write_bytes('\ufeffPW=pa$$wd${HOME}\r\nQUOTED="a\'b"\r\nexport E=1 # comment\r\n'.encode())
    env = secrets.load(f)
    assert env.values == {"PW": "pa$$wd${HOME}", "QUOTED": "a'b", "E": "1"}
    assert env.fixes == ("a byte-order mark", "CRLF line endings")


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ('A="never closed\nB=1\n', "line 1: A cannot be parsed"),
        ("A=1\nmy-key=1\n", "line 2: its key is not a shell variable name"),
        ('K="a\'b$c"\n', "the value of K has ' or \\ and also $ or `"),
        ('K="a\\\\"\n', "the value of K ends with \\"),
    ],
)
def test_a_local_env_that_cannot_round_trip_is_bad_input(tmp_path: Path, text: str, says: str) -> None:
    (tmp_path / ".env").write_text(text)
    with pytest.raises(UsageError) as e:
        secrets.load(tmp_path / ".env")
    assert says in e.value.line()
    assert e.value.exit_code == ExitCode.USAGE


def test_quoted_values_span_lines_as_in_python_dotenv(tmp_path: Path) -> None:
    f = tmp_path / ".env"
    f.write_text("CERT=\"-----BEGIN-----\nabc\n-----END-----\"\nexport KEY='line one\n  line two'\nAFTER=1\n")
    env = secrets.load(f)
    assert env.values == dotenv_values(f, interpolate=False)
    assert env.values == {
        "CERT": "-----BEGIN-----\nabc\n-----END-----",
        "KEY": "line one\n  line two",
        "AFTER": "1",
    }
    assert secrets.parse(secrets.serialize(env.values)) == (env.values, [], [])


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("TOKEN=abc123\nsk-live-wrapped-part\nB=1\n", 2),  # a value wrapped onto a line of its own
        ("A=1\n\n# c\n  tail0f+the/secret\n", 4),
        ("TOKEN=abc\nwrappedSecretPart\n", 2),  # a valid shell name: python-dotenv's key with no value
        ("export A=1\nexport wrappedSecretPart\n", 2),
        ("A=1\nsk.live-part=more\n", 2),  # a wrapped piece holding a `=`, not a shell name
    ],
)
def test_a_line_without_an_assignment_names_its_number_never_its_text(
    tmp_path: Path, text: str, line: int
) -> None:
    f = tmp_path / ".env"
    f.write_text(text)
    with pytest.raises(UsageError) as e:
        secrets.load(f)
    shown = e.value.line()
    assert f"line {line}" in shown and e.value.exit_code == ExitCode.USAGE
    secret = text.splitlines()[line - 1].strip().removeprefix("export ")
    for piece in (secret, *secret.split("=")):
        assert piece not in shown
    # doctor compares the local keys by name: the wrapped piece is not taken for one
    values, _fixes, errors = secrets.parse(text.encode())
    assert errors and not any(piece in k for k in values for piece in secret.split("="))
    assert not any(secret in m for m in errors)


def tpuops(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(  # noqa: PLW1510 - the exit code is what these tests check
        [sys.executable, "-m", "tpuops", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


class _ArgvWatch:
    """Samples every process's command line on this machine (the workers' too) while a run goes on."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            for p in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    self.seen.add(p.read_bytes().decode(errors="replace"))
                except OSError:
                    pass
            self._stop.wait(0.02)

    def __enter__(self) -> _ArgvWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_hostile_values_reach_the_worker_and_doctor_exactly_and_appear_nowhere(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    rng = random.Random(19)
    values: dict[str, str] = {}
    while len(values) < 40:  # each value starts with a unique marker, so any leak of it can be found
        value = f"sntl{len(values):02d}q" + _hostile(rng, rng.randint(1, 6))
        if not _mixed(value):
            values[f"K{len(values)}"] = value
    values["ALL"] = "sntl90q" + "".join(a for a in ATOMS if "$" not in a and "`" not in a)  # ' and \\
    values["EXPANDS"] = 'sntl91q pa$$wd${HOME}$(id)`id` #x "q" é'  # $ and `, taken literally
    # The user's file: CRLF line ends and a byte-order mark (fixed and reported), else the canonical form.
    lines = [secrets.serialize({k: v})[:-1] + b"\r\n" for k, v in values.items()]
    (tmp_path / ".env").write_bytes(b"\xef\xbb\xbf" + b"".join(lines))
    (tmp_path / "envcheck.yaml").write_text(ENV_SOP)
    with _ArgvWatch() as argv:
        ran = tpuops("sop", "run", "envcheck.yaml", *sshd_pool.host_args([w]), "--json", cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    sent = json.loads(ran.stdout)["steps"][0]["workers"]["0"]
    assert sent["detail"] == "sent (mode 0600); fixed a byte-order mark and CRLF line endings"
    sourced = json.loads((w.home / "sourced.json").read_text())
    assert {k: sourced.get(k) for k in values} == values  # local = worker-sourced
    doctor = tpuops(
        "doctor", *sshd_pool.host_args([w]), "--remote-env", "~/envcheck.env", "--lockfile", "~/l", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert doctor.returncode == 0, doctor.stderr
    assert json.loads(doctor.stdout)[0]["env_keys"] == dict.fromkeys(
        sorted(values), "match"
    )  # = doctor-parsed
    home = Path(os.environ["TPUOPS_HOME"])
    records = [f.read_text(errors="replace") for f in home.rglob("*") if f.is_file()]
    places = [ran.stdout, ran.stderr, doctor.stdout, doctor.stderr, *records, *argv.seen]
    for value in values.values():
        assert not any(value[:7] in text for text in places), value[:7]


def test_a_named_env_file_that_is_missing_is_bad_input_and_nothing_runs(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    (w,) = sshd_pool.take(1)
    (w.home / "envcheck.env").write_text("OLD='stale'\n")
    (tmp_path / "envcheck.yaml").write_text(ENV_SOP)
    r = tpuops(
        "sop", "run", "envcheck.yaml", *sshd_pool.host_args([w]), "--set", "env_file=/nonexistent/.env",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == ExitCode.USAGE
    assert r.stderr.strip().splitlines()[-1].startswith("error: /nonexistent/.env: file not found")
    assert (w.home / "envcheck.env").read_text() == "OLD='stale'\n"  # validation stopped it before any step


def test_with_no_local_env_the_workers_old_one_is_removed(sshd_pool: SshdPool, tmp_path: Path) -> None:
    (w,) = sshd_pool.take(1)
    (w.home / "envcheck.env").write_text("OLD='stale'\n")
    (tmp_path / "envcheck.yaml").write_text(ENV_SOP.replace(" && . ~/envcheck.env", " && true"))
    r = tpuops("sop", "run", "envcheck.yaml", *sshd_pool.host_args([w]), "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    step = json.loads(r.stdout)["steps"][0]["workers"]["0"]
    assert (step["status"], step["detail"]) == ("changed", "no local .env: removed the worker's old .env")
    assert not (w.home / "envcheck.env").exists()
    again = tpuops("sop", "run", "envcheck.yaml", *sshd_pool.host_args([w]), "--json", cwd=tmp_path)
    assert json.loads(again.stdout)["steps"][0]["workers"]["0"]["detail"] == "no local .env"


def test_doctor_never_calls_a_present_key_missing(sshd_pool: SshdPool, tmp_path: Path) -> None:
    """A worker file python-dotenv cannot read on one line (the old shell-quoted form of `a'b`): that key is
    `unreadable`, not `missing`; the others still compare."""
    (w,) = sshd_pool.take(1)
    (tmp_path / ".env").write_text('X="a\'b"\nY=plain\n')
    (w.home / "remote.env").write_text("X='a'\"'\"'b'\nY='plain'\n")
    r = tpuops(
        "doctor", *sshd_pool.host_args([w]), "--remote-env", "~/remote.env", "--lockfile", "~/l", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1
    assert json.loads(r.stdout)[0]["env_keys"] == {"X": "unreadable", "Y": "match"}
    assert "python-dotenv" not in r.stderr  # no raw library warning


DRIFT_SOP = """name: drift
steps:
  - kind: run
    runs_dir: ~/drift-runs
    source_env_file: ~/drift.env
    command: touch ~/started
"""


def test_env_drift_between_workers_stops_the_run_before_it_starts_with_its_own_exit_code(
    sshd_pool: SshdPool, tmp_path: Path
) -> None:
    """No local .env, no sync_env step: each worker's own .env is hashed before the run; a difference is exit
    11 (`inconsistent`), which a CI job tells apart from the user's code failing (exit 1)."""
    workers = sshd_pool.take(2)
    for w, value in zip(workers, ("zero", "one"), strict=True):
        (w.home / "drift.env").write_text(f"FOO={value}\n")
    (tmp_path / "drift.yaml").write_text(DRIFT_SOP)
    r = tpuops("sop", "run", "drift.yaml", *sshd_pool.host_args(workers), "--json", cwd=tmp_path)
    assert r.returncode == ExitCode.INCONSISTENT == 11, r.stderr
    data = json.loads(r.stdout)
    assert data["error_class"] == "inconsistent"
    assert data["failure"]["step"] == "preflight consistency" and data["failure"]["worker"] == 1
    assert data["failure"]["detail"].startswith("env_sha ")
    people = tpuops("sop", "run", "drift.yaml", *sshd_pool.host_args(workers), cwd=tmp_path)
    assert people.returncode == 11 and "env_sha" in people.stderr
    assert not any((w.home / "started").exists() for w in workers)
    (workers[1].home / "drift.env").write_text("FOO=zero\n")  # the same file everywhere: the run starts
    same = tpuops("sop", "run", "drift.yaml", *sshd_pool.host_args(workers), "--json", cwd=tmp_path)
    assert same.returncode == 0, same.stderr
