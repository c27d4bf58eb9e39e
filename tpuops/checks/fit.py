"""`tpuops fit` and the run preflight: the trainer's ahead-of-time fit check (`python -m trainer.fit`), run on
this machine for a TPU type, its verdict cached by everything that can change it.

tpuops and trainer meet at the command line: this module runs the trainer as a subprocess with this
interpreter and reads its JSON. Cache key: config (name, preset file or YAML text), overrides, target, the
jax and libtpu versions and the trainer's source; entries are written to a temporary file and renamed.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tpuops.config import state_home
from tpuops.errors import DoesNotFitError, ExitCode, TpuopsError, UsageError

EXIT_NO_FIT, EXIT_NO_LIBTPU = 3, 4  # trainer.fit's exit codes (docs/contracts.md)
GB = 1e9
# trainer.fit's JSON verdict (docs/contracts.md) with what tpuops adds to it (`cached`, `estimate.calibrated`,
# `cost`): another program's output, read by key here and in the run's fit view; a plain mapping until those
# readers take a typed record.
FitResult = dict[str, Any]


class FitUnavailableError(UsageError):
    """libtpu is not installed here, so nothing can be compiled for a TPU."""

    kind = "fit_unavailable"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"


def _importable(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _trainer_dir(cwd: Path) -> Path:
    """The trainer `python -m trainer.fit` runs from cwd: ./trainer, else the installed one (found, not imported)."""
    if (cwd / "trainer" / "fit").is_dir():
        return cwd / "trainer"
    import importlib.util

    spec = importlib.util.find_spec("trainer")
    return (
        Path(next(iter(spec.submodule_search_locations))) if spec and spec.submodule_search_locations else cwd
    )


def cache_key(config: str, sets: list[str], target: str, cwd: Path) -> str:
    h = hashlib.sha256()
    for part in (config, *sets, target, _version("jax"), _version("libtpu")):
        h.update(part.encode() + b"\0")
    trainer = _trainer_dir(cwd)
    candidates = [cwd / config, trainer / "configs" / f"{config}.yaml"]
    files = [c for c in candidates if c.suffix in (".yaml", ".yml") and c.is_file()]
    files += sorted(trainer.rglob("*.py")) if trainer.is_dir() else []
    for f in files:
        h.update(str(f).encode() + f.read_bytes())
    return h.hexdigest()[:24]


def exit_code(result: FitResult) -> int:
    """0 when the config fits, 12 (DoesNotFitError's code) when it does not."""
    return int(ExitCode.OK if result["fits"] else DoesNotFitError.exit_code)


def check(
    config: str,
    sets: list[str] | None = None,
    *,
    accelerator: str | None = None,
    topology: str | None = None,
    cwd: Path | None = None,
    use_cache: bool = True,
    on_progress: Callable[[str], None] | None = None,
    slices: int = 1,
) -> FitResult:
    """The fit result (JSON of trainer.fit, plus `cached`); FitUnavailableError without libtpu, UsageError for a
    bad config or target. `on_progress` hears trainer.fit's `fit: ...` lines as they come (compiling X)."""
    if accelerator and topology:
        raise UsageError("--accelerator and --topology name the same thing: pass one")
    if not _importable("jax"):  # a base install: the compile needs the tpu extra
        raise FitUnavailableError("jax is not installed here: pip install 'tpuops[tpu]'")
    cwd = cwd or Path.cwd()
    sets = [s.removeprefix("--set=") for s in sets or []]
    if slices < 1:
        raise UsageError(f"--slices must be 1 or more, received {slices}")
    target = f"topology={topology}" if topology else f"accelerator={accelerator or ''}"
    target += f",slices={slices}" if slices > 1 else ""
    entry = state_home() / "fit" / f"{cache_key(config, sets, target, cwd)}.json"
    if use_cache and entry.is_file():
        try:
            return {**json.loads(entry.read_text()), "cached": True, "cached_at": entry.stat().st_mtime}
        except (OSError, ValueError):
            pass  # a damaged entry is recomputed
    argv = [sys.executable, "-m", "trainer.fit", "--config", config, "--json"]
    argv += [f"--set={s}" for s in sets]
    argv += ["--topology", topology] if topology else (["--accelerator", accelerator] if accelerator else [])
    argv += ["--slices", str(slices)] if slices > 1 else []
    r = _run(argv, cwd, on_progress)
    if r.returncode == EXIT_NO_LIBTPU:
        raise FitUnavailableError(json.loads(r.stdout.strip().splitlines()[-1])["message"])
    if r.returncode < 0:  # libtpu's compiler can crash on a pathological program (seen: a stack overflow)
        raise TpuopsError(
            f"fit {config}: the TPU compiler crashed (signal {-r.returncode}) compiling for {accelerator or topology}",
            hint="try other shapes with tpuops fit, or start anyway with --skip-fit",
        )
    if r.returncode not in (0, EXIT_NO_FIT):
        lines = [
            ln
            for ln in (r.stderr or r.stdout).strip().splitlines()
            if ln.strip() and not ln.startswith("fit: ")
        ]
        last = lines[-1].removeprefix("config: ") if lines else f"exit {r.returncode}"
        error = UsageError if r.returncode == 2 else TpuopsError
        raise error(f"fit {config}: {last}")
    result = json.loads(r.stdout.strip().splitlines()[-1])
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(result))
    tmp.replace(entry)
    return {**result, "cached": False}


def _run(
    argv: list[str], cwd: Path, on_progress: Callable[[str], None] | None
) -> subprocess.CompletedProcess[str]:
    """trainer.fit with its stderr read line by line as it comes (its `fit: ...` progress lines handed on)."""
    proc = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    err: list[str] = []

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err.append(line)
            if on_progress is not None and line.startswith("fit: "):
                on_progress(line.rstrip("\n"))

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    assert proc.stdout is not None
    out = proc.stdout.read()
    code = proc.wait()
    reader.join()
    return subprocess.CompletedProcess(argv, code, out, "".join(err))


class FitProgress:
    """`tpuops fit` at a terminal: which program compiles now and for how long, and what already compiled
    (fed trainer.fit's `fit: compiling X` / `fit: compiled X in N s` lines; the console's live view draws it)."""

    def __init__(self, config: str) -> None:
        import time

        self.config, self.clock = config, time.monotonic
        self.started = self.since = self.clock()
        self.now: str | None = None
        self.trying: str | None = None  # the override being compiled, in a search for one that fits
        self.done: list[str] = []

    def feed(self, line: str) -> None:
        text = line.removeprefix("fit: ")
        if text.startswith("compiling "):
            self.now, self.since = text.removeprefix("compiling "), self.clock()
        elif text.startswith("compiled "):
            name, _, took = text.removeprefix("compiled ").partition(" in ")
            self.done.append(f"{name} {took.replace(' ', '')}")
            self.now = None
        elif text.startswith("trying "):
            self.trying = text.removeprefix("trying ")

    def status(self, now: float | None = None, width: int | None = None) -> str:
        t = self.clock() if now is None else now
        doing = (
            f"compiling {self.now} for the TPU {t - self.since:.0f}s"
            if self.now
            else "tracing the step's programs"
        ) + (f" (trying --set {self.trying})" if self.trying else "")
        done = f" · compiled: {', '.join(self.done)}" if self.done else ""
        line = f"fit {self.config}: {doing} · elapsed {t - self.started:.0f}s{done}"
        return (
            line if width is None or len(line) <= width else line[: width - 1] + "…"
        )  # what compiled: cut last

    def line(self, worker: int, text: str) -> str:
        return text

    def phase(self, worker: int, title: str, kind: str, state: str) -> None:
        return None


def summary(result: FitResult) -> str:
    """One line: the verdict, the tightest phase and, when it does not fit, the cheapest fix found."""
    tight = result["phases"][result["tightest_phase"]]
    where = f"{result['config']} on {result['accelerator']}"
    auto = result.get("remat_auto")  # train.remat auto: the policy chosen and why (trainer/fit/remat.py)
    chose = f"; remat auto: {auto['why']}" if isinstance(auto, dict) and "why" in auto else ""
    if result["fits"]:
        return (f"{where} fits: tightest phase {result['tightest_phase']} peaks at {tight['peak_bytes'] / GB:.1f} GB "
                f"of {result['hbm_bytes_per_device'] / GB:.1f} GB per device ({result['headroom']:.0%} headroom); "
                f"estimated step >= {result['estimate']['step_s']:.2f} s{chose}")  # fmt: skip
    line = (f"{where} does not fit: {result['tightest_phase']} peak {tight['peak_bytes'] / GB:.1f} GB > "
            f"{result['usable_bytes_per_device'] / GB:.1f} GB usable per device")  # fmt: skip
    fix = result.get("fix")
    skipped = "".join(
        f"; skipped {' '.join(f'--set {s}' for s in k['set'])}: {k['why']}"
        for k in result.get("fix_skipped", [])
    )
    if fix:
        sets = " ".join(f"--set {s}" for s in fix["set"])
        return f"{line}: {sets} fits (peak {fix['peak_bytes'] / GB:.1f} GB){skipped}{chose}"
    return (
        f"{line}: lower train.micro_batch, set train.remat=full, or pick a larger TPU (tpuops fit --accelerator)"
        f"{skipped}{chose}"
    )


def cached_words(result: FitResult, accelerator: str | None) -> str:
    """After the verdict line: where it came from when no compile ran (the cache is per config, overrides, TPU
    type and trainer source), and how to compile again; '' for a fresh verdict."""
    if not result.get("cached"):
        return ""
    import time

    when = result.get("cached_at")
    at = f", compiled {time.strftime('%Y-%m-%d %H:%M', time.localtime(when))}" if when else ""
    return (f" (cached verdict for this config and {accelerator or result.get('accelerator', 'this TPU')}{at}; "
            "`tpuops fit --no-cache` compiles again)")  # fmt: skip


def step_seconds(result: FitResult) -> tuple[float, str]:
    """The step time a cost is made from: the midpoint of the range at this trainer's measured efficiency
    (tpuops.checks.calibrate), else of the published-efficiency range, else the bound (older verdicts)."""
    est = result["estimate"]
    if cal := est.get("calibrated"):
        return float(cal["expected_mid_s"]), "calibrated_mid_s"
    if est.get("expected_mid_s") is not None:
        return float(est["expected_mid_s"]), "expected_mid_s"
    return float(est["step_s"]), "bound_s"


def with_cost(result: FitResult, region: str | None, endpoint: str | None = None) -> FitResult:
    """The fit result with `cost`: dollars per step and per run (train.steps), on demand and Spot, for its
    accelerator in `region` (tpuops/cloud/pricing: the billing catalog, else the shipped table). When the type has
    no price there, `cost` is None and `unpriced` says why and names the nearest regions that offer it. Never
    cached with the verdict: prices move, the compile does not."""
    from tpuops.cloud import pricing

    price = pricing.lookup(result["accelerator"], region, endpoint)
    if isinstance(price, pricing.Unpriced):
        return {**result, "cost": None, "unpriced": price.to_dict()}
    step_s, basis = step_seconds(result)
    steps = result.get("steps")
    return {**result, "cost": pricing.cost(step_s, steps if isinstance(steps, int) else None,
                                           result["accelerator"], price, basis, result.get("slices", 1))}  # fmt: skip


def require_fit(result: FitResult) -> None:
    if not result["fits"]:
        raise DoesNotFitError(summary(result))
