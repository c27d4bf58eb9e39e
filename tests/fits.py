"""The shipped presets' full-depth TPU compiles, started once per session as soon as collection ends, at the
lowest CPU priority, so they run on what the rest of the suite leaves idle; the test that checks their results
(tests/trainer/fit/test_fit.py) runs last and waits for them. Under pytest-xdist the controller starts them (one
set, not one per worker) and every process reads the results from files in a folder the session shares."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_NAME = "test_every_shipped_tpu_config_fits_its_tpu"
# Runs the rest of its argv after asking Linux to SIGKILL it when the thread that started it (so pytest) dies,
# even by SIGKILL: no compile outlives the session (prctl PR_SET_PDEATHSIG = 1 survives the exec).
DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; parent = int(sys.argv[1]); ctypes.CDLL(None).prctl(1, signal.SIGKILL); "
    "os.getppid() == parent or sys.exit(1); os.execvp(sys.argv[2], sys.argv[2:])"
)


def presets() -> list[str]:
    return sorted(p.stem for p in (REPO / "trainer" / "configs").glob("qwen2.5-*.yaml"))


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


def shipped() -> list[str]:
    """Each shipped preset, less those another shipped preset covers (each TPU compile of a 3B step costs minutes
    of the suite's 2 cores); the test checks that every preset left out is covered. Largest model first: the
    longest compiles start first, so the suite does not end waiting on one long compile alone."""
    every = presets()
    kept = [p for p in every if not any(covered(p, other) for other in every)]
    return sorted(kept, key=lambda p: -_billions(p))


def _billions(preset: str) -> float:
    """The model size a preset's name carries (qwen2.5-7b-... -> 7.0; 0 when it names none)."""
    m = re.match(r"qwen[\d.]*-(\d+(?:\.\d+)?)b-", preset)
    return float(m[1]) if m else 0.0


class ShippedFits:
    """`python -m trainer.fit --config PRESET --json --no-fix` for every shipped preset, two at a time (a compile
    uses one core), under `nice -n 19`; each writes PRESET.out, PRESET.err and then PRESET.json (its exit code)
    into `folder`."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self._env, self._folder, self._procs, self._stopped = env, folder, [], False
        self._lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="shipped-fit")
        for p in shipped():
            self._pool.submit(self._fit, p)

    def _fit(self, preset: str) -> None:
        fit = [sys.executable, "-m", "trainer.fit", "--config", preset, "--json", "--no-fix", "--no-host"]
        argv = [sys.executable, "-c", DIE_WITH_PARENT, str(os.getpid()), "nice", "-n", "19", *fit]
        out, err = self._folder / f"{preset}.out", self._folder / f"{preset}.err"
        with self._lock:
            if self._stopped:
                return
            with out.open("w") as o, err.open("w") as e:
                proc = subprocess.Popen(
                    argv, cwd=REPO, env=self._env, stdin=subprocess.DEVNULL, stdout=o, stderr=e
                )
            self._procs.append(proc)
        # Bounded by the CI limit, not tighter: at nice 19 a compile may wait for the whole rest of the suite
        # (or of two suites at once); the waiting test has its own timeout.
        code = proc.wait(timeout=5400)
        tmp = self._folder / f".{preset}.json"
        tmp.write_text(json.dumps({"returncode": code}))
        tmp.replace(self._folder / f"{preset}.json")

    def stop(self) -> None:
        """Kill what is still compiling (only the processes started here, by their handles)."""
        with self._lock:
            self._stopped = True
            for proc in self._procs:
                if proc.poll() is None:
                    proc.kill()
        self._pool.shutdown(wait=True, cancel_futures=True)


def results(folder: Path, timeout: float) -> dict[str, subprocess.CompletedProcess[str]]:
    """Every shipped preset's `trainer.fit` run, waited for (from whichever process started them)."""
    want, deadline, done = shipped(), time.monotonic() + timeout, {}
    while len(done) < len(want) and time.monotonic() < deadline:
        for p in want:
            end = folder / f"{p}.json"
            if p not in done and end.exists():
                code = json.loads(end.read_text())["returncode"]
                out, err = (folder / f"{p}.out").read_text(), (folder / f"{p}.err").read_text()
                done[p] = subprocess.CompletedProcess(["trainer.fit", p], code, out, err)
        time.sleep(1)
    missing = sorted(set(want) - set(done))
    assert not missing, f"the shipped presets' compiles did not end within {timeout:.0f} s: {missing}"
    return done
