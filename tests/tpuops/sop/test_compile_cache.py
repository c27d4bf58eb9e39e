"""The job's JAX compilation cache (`compile_cache`): what each value exports, run by a real shell, and what the
report says from the log (JAX's cache-hit lines, the trainer's summary)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tpuops.errors import UsageError
from tpuops.logs.scanner import LogScanner
from tpuops.run.logtext import cache_line
from tpuops.sop.compile_cache import export

COMPILE = "WARNING:jax._src.interpreters.pxla:Compiling jit(update) with global shapes and types (f32[4],)."
HIT = (
    "WARNING:jax._src.compiler:Persistent compilation cache hit for 'jit_update' with key "
    "'jit_update-5f0c3e2d9a'"
)


def _cache_dir(value: str, cwd: str, home: Path, env: dict[str, str] | None = None) -> str | None:
    """What JAX would read: the job's JAX_COMPILATION_CACHE_DIR after `export(...)`, in sh with this HOME."""
    base = {k: v for k, v in os.environ.items() if k != "JAX_COMPILATION_CACHE_DIR"}
    script = f'{export(value, cwd)} echo "${{JAX_COMPILATION_CACHE_DIR-<unset>}}"'
    out = subprocess.run(
        ["sh", "-c", script],
        env={**base, "HOME": str(home), **(env or {})},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    text = out.stdout.strip()
    return None if text == "<unset>" else text


def test_auto_is_jax_cache_beside_the_checkout_unless_the_environment_names_one(tmp_path: Path) -> None:
    checkout = "~/tpuops/mllm-jax-313b9b99/checkout"
    assert _cache_dir("auto", checkout, tmp_path) == f"{tmp_path}/tpuops/mllm-jax-313b9b99/jax-cache"
    assert _cache_dir("auto", "", tmp_path) == f"{tmp_path}/tpuops/jax-cache"  # no checkout: one per user
    # The worker's own setting (its login environment, or the .env sourced before) is kept ...
    named = {"JAX_COMPILATION_CACHE_DIR": "gs://team/jax-cache"}
    assert _cache_dir("auto", checkout, tmp_path, named) == "gs://team/jax-cache"
    # ... and an empty one counts as none.
    empty = {"JAX_COMPILATION_CACHE_DIR": ""}
    assert _cache_dir("auto", checkout, tmp_path, empty) == f"{tmp_path}/tpuops/mllm-jax-313b9b99/jax-cache"


def test_a_folder_or_bucket_is_used_as_given_and_off_unsets_it(tmp_path: Path) -> None:
    named = {"JAX_COMPILATION_CACHE_DIR": "/from/the/env"}
    assert _cache_dir("gs://b/cache", "~/x/checkout", tmp_path, named) == "gs://b/cache"
    assert _cache_dir("~/shared cache", "~/x/checkout", tmp_path) == f"{tmp_path}/shared cache"
    assert _cache_dir("off", "~/x/checkout", tmp_path, named) is None
    assert _cache_dir("/tmp/$(touch hacked)", "", tmp_path) == "/tmp/$(touch hacked)"  # a value is data


@pytest.mark.parametrize("bad", ["", "  "])
def test_an_empty_value_is_refused_with_the_choices(bad: str) -> None:
    with pytest.raises(UsageError, match=r"compile_cache must be auto, off, a folder or gs://BUCKET/PATH"):
        export(bad, "")


def _scan(lines: list[str]) -> LogScanner:
    s = LogScanner(warmup=1)
    s.feed_bytes(("\n".join(lines) + "\n").encode())
    return s


def test_jax_cache_hit_lines_are_counted_and_every_compile_still_counts() -> None:
    r = _scan([COMPILE, HIT, "step=0 loss=1 dt=2.0s", COMPILE, HIT, "step=1 loss=1 dt=1.0s"]).close()
    assert r.cache_hits == 2 and r.compile_cache == {"hits": 2, "saved_s": None}
    assert r.compiles["total"] == 2 and r.compiles["after_warmup"] == 1  # a hit is a compile to the check
    assert cache_line(r) == "compile cache: 2 programs from the persistent cache"
    assert _scan([COMPILE, "step=0 dt=1s"]).close().compile_cache is None  # the log does not say
    assert cache_line(_scan([COMPILE, "step=0 dt=1s"]).close()) is None


def test_the_trainers_summary_gives_hits_and_seconds_saved() -> None:
    r = _scan(['summary: {"steps":2,"compile_cache_hits":5,"compile_cache_saved_s":12.34}']).close()
    assert r.compile_cache == {"hits": 5, "saved_s": 12.34}
    assert r.to_dict()["compile_cache"] == {"hits": 5, "saved_s": 12.34}
    assert cache_line(r) == "compile cache: 5 programs from the persistent cache, 12.3s of compiling saved"
    off = _scan(['summary: {"steps":2,"compile_cache":"off"}']).close()
    assert cache_line(off) == "compile cache: off (every program was compiled)"
