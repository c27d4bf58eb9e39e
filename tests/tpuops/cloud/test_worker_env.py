"""What of the host's environment the emulator's sshd workers get (sshd's SetEnv)."""

from __future__ import annotations

import pytest

from tpuops.cloud.emulator import sshd


def test_the_compile_cache_settings_and_the_variables_named_reach_every_worker(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in sshd.SHARED_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "/tmp/cache")
    monkeypatch.setenv(sshd.WORKER_ENV, " FOO_A, FOO_B,,JAX_COMPILATION_CACHE_DIR")
    monkeypatch.setenv("FOO_A", "/a:/b")
    monkeypatch.delenv("FOO_B", raising=False)  # named but unset: not sent
    assert sshd._set_env_line() == "SetEnv JAX_COMPILATION_CACHE_DIR=/tmp/cache FOO_A=/a:/b\n"
    monkeypatch.delenv(sshd.WORKER_ENV)
    assert sshd._set_env_line() == "SetEnv JAX_COMPILATION_CACHE_DIR=/tmp/cache\n"
