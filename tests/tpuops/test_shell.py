"""Quoting, remote paths, env over stdin and redaction, checked by running a real /bin/sh."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tpuops import shell
from tpuops.transport.local import LocalTransport

HOSTILE = ["x; touch /tmp/pwned", "$(reboot)", "`id`", "a'b\"c", "line\nbreak", "*", "-rf"]


def sh(cmd: str, **env: str) -> str:
    return subprocess.run(
        ["/bin/sh", "-c", cmd], capture_output=True, text=True, check=True, env=env or None
    ).stdout


def test_quoted_values_come_back_verbatim() -> None:
    for value in HOSTILE:
        assert sh(f"printf %s {shell.quote(value)}") == value


def test_path_keeps_home_and_quotes_the_rest() -> None:
    assert sh(f"printf %s {shell.path('~/a b/$(x)')}", HOME="/h") == "/h/a b/$(x)"
    assert sh(f"printf %s {shell.path('/tmp/x;y')}") == "/tmp/x;y"


def test_env_over_stdin_round_trips_every_value(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path)
    env = {f"V{i}": v for i, v in enumerate(HOSTILE)}
    script = "; ".join(f'printf "%s\\0" "$V{i}"' for i in range(len(HOSTILE)))
    r = t.run(0, script, env=env)
    assert r.ok, r.stderr
    assert r.stdout.split("\0")[:-1] == HOSTILE


def test_redactor_hides_every_occurrence() -> None:
    red = shell.Redactor(["s3cr3t-value", "ab"])
    assert red("key=s3cr3t-value and s3cr3t-value; ab stays") == "key=*** and ***; ab stays"


def test_local_transport_timeout_kills_the_process_group(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path)
    r = t.run(0, "sleep 31.7 & sleep 31.7; echo never", timeout=0.3)
    assert r.timed_out and r.exit_code == 124 and "never" not in r.stdout

    def left() -> bool:  # SIGKILLed processes may take a moment to leave the table on a loaded machine
        ps = subprocess.run(["ps", "-eo", "stat,args"], capture_output=True, text=True, check=True).stdout
        return any("sleep 31.7" in ln and not ln.startswith("Z") for ln in ps.splitlines())

    deadline = time.monotonic() + 10
    while left() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not left(), "a child of the timed-out command outlived it"


def test_local_put_sets_mode_before_content(tmp_path: Path) -> None:
    t = LocalTransport(tmp_path)
    t.put_bytes(0, b"A=1\n", "~/x/.env")
    f = tmp_path / "w0/x/.env"
    assert f.read_bytes() == b"A=1\n" and f.stat().st_mode & 0o777 == 0o600
    assert t.read_from(0, "~/x/.env", 2) == b"1\n"
    assert t.read_from(0, "~/x/missing", 0) is None


def test_a_value_known_only_by_its_keyed_hashes_is_still_redacted_in_every_form() -> None:
    import json
    import os
    from urllib.parse import quote

    from tpuops.shell import Redactor, secret_digest, secret_forms

    key, old = os.urandom(16), 'old "secret"\nsecond-line'
    digests = [(len(f), secret_digest(key, f)) for f in secret_forms(old)]
    redact = Redactor(["a-new-value"])
    redact.add_hashed(key, digests)
    assert redact.unknown_hashed == len(digests)
    text = f"a {old} b {json.dumps(old)} c {quote(old, safe='')} d a-new-value e second-line f"
    assert redact(text) == 'a *** b "***" c *** d *** e *** f'
    known = Redactor([old])
    known.add_hashed(
        key, digests
    )  # every hashed form is one of a known value's: nothing left to search by hash
    assert known.unknown_hashed == 0
