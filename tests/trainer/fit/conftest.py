"""The shipped presets' full-depth TPU compiles start as soon as collection ends, at the lowest CPU priority,
so they run on what the rest of the suite leaves idle (a serial run keeps ~60% of 2 cores busy); the test that
checks their results runs last and waits for them. Run alone, the test takes as long as the compiles do."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]


def covered(preset: str, by: str) -> bool:
    """`by` runs the same model on the same TPU with the same micro-batch and remat, and every sequence shape at
    least as large: whatever `preset` needs per device, `by` needs at least as much, so compiling `by` checks both
    (the half-decode 3B preset beside the seed's 3B workload). Memory per device grows with these shapes."""
    from trainer import config

    a, b = config.load(preset), config.load(by)
    same = (a.model.preset, a.model.dtype, a.mesh, a.train.micro_batch, a.train.remat, a.train.loss_impl,
            a.rollout.tp) == (b.model.preset, b.model.dtype, b.mesh, b.train.micro_batch, b.train.remat,
            b.train.loss_impl, b.rollout.tp)  # fmt: skip
    return (preset != by and same and max(a.data.prompt_buckets) <= max(b.data.prompt_buckets)
            and a.rollout.max_new_tokens <= b.rollout.max_new_tokens
            and a.sequences_per_step <= b.sequences_per_step)  # fmt: skip


PRESETS = sorted(p.stem for p in (REPO / "trainer" / "configs").glob("qwen2.5-*.yaml"))
# Each shipped preset, less those another shipped preset covers (each TPU compile of a 3B step costs minutes of
# the suite's 2 cores); tests/trainer/fit/test_fit.py checks that every preset left out is covered.
SHIPPED = [p for p in PRESETS if not any(covered(p, other) for other in PRESETS)]
TEST_NAME = "test_every_shipped_tpu_config_fits_its_tpu"
KEY = pytest.StashKey["ShippedFits"]()
# Runs the rest of its argv after asking Linux to SIGKILL it when the thread that started it (so pytest) dies,
# even by SIGKILL: no compile outlives the session (prctl PR_SET_PDEATHSIG = 1 survives the exec).
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; parent = int(sys.argv[1]); ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
    "os.getppid() == parent or sys.exit(1); os.execvp(sys.argv[2], sys.argv[2:])"
)


class ShippedFits:
    """`python -m trainer.fit --config PRESET --json --no-fix` for every shipped preset, two at a time (a
    compile uses one core), under `nice -n 19`; each result is a Future of its CompletedProcess."""

    def __init__(self, presets: list[str], env: dict[str, str]) -> None:
        self._env, self._procs, self._stopped = env, [], False
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shipped-fit")
        self.futures: dict[str, Future[subprocess.CompletedProcess[str]]] = {
            p: self._pool.submit(self._fit, p) for p in presets
        }

    def _fit(self, preset: str) -> subprocess.CompletedProcess[str]:
        fit = [sys.executable, "-m", "trainer.fit", "--config", preset, "--json", "--no-fix", "--no-host"]
        argv = [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), "nice", "-n", "19", *fit]
        with self._lock:
            if self._stopped:
                raise RuntimeError("stopped before it started")
            proc = subprocess.Popen(
                argv, cwd=REPO, env=self._env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True,
            )  # fmt: skip
            self._procs.append(proc)
        # Bounded by the CI limit, not tighter: at nice 19 a compile may wait for the whole rest of the suite
        # (or of two suites at once); the waiting test has its own timeout.
        out, err = proc.communicate(timeout=5400)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)

    def stop(self) -> None:
        """Kill what is still compiling (only the processes started here, by their handles)."""
        with self._lock:
            self._stopped = True
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)


@pytest.hookimpl(trylast=True)  # after -k/-m have deselected: only a test that will run starts the compiles
def pytest_collection_modifyitems(
    session: pytest.Session, config: pytest.Config, items: list[pytest.Item]
) -> None:
    chosen = [item for item in items if item.name == TEST_NAME]
    if not chosen or config.option.collectonly:
        return
    for item in chosen:  # last: the compiles get the whole session to finish in the background
        items.remove(item)
        items.append(item)
    # The environment as collection left it, not as a test's monkeypatch may have it when a thread starts.
    config.stash[KEY] = ShippedFits(SHIPPED, dict(os.environ))


def pytest_unconfigure(config: pytest.Config) -> None:
    if KEY in config.stash:
        config.stash[KEY].stop()


@pytest.fixture
def shipped_fits(request: pytest.FixtureRequest) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every shipped preset's `trainer.fit` run, waited for."""
    fits = request.config.stash[KEY]
    return {preset: future.result() for preset, future in fits.futures.items()}
