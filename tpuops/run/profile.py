"""`tpuops profile RUN_ID`: a JAX profile of a running job from its workers' profiler servers, brought into the
run folder (`profile/<time>/w<k>/`) and summarised; also the summary of a trace a run wrote itself
(`--profile-steps`). A capture only reads: whatever fails, the job goes on untouched."""

from __future__ import annotations

import os
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tpuops import config as user_config
from tpuops import shell
from tpuops.errors import ConnectError, TpuopsError, UsageError
from tpuops.logs import trace, xplane
from tpuops.run.store import RunRecord, load
from tpuops.run.target import open_transport, resolve, select_workers
from tpuops.sop.executor import SopReport
from tpuops.sop.runs import run_dir
from tpuops.transport import profiler
from tpuops.transport.base import Transport

PORT_PARAM = "profile_port"  # the SOP parameter a run records its profiler port in (worker k: port + k)
START_LINE = "jax.profiler.start_server(int(os.environ['TPUOPS_PROFILE_PORT']))"


class ProfileError(TpuopsError):
    """A capture that could not be made (no server, port closed, worker unreachable): exit 1, the job untouched."""


@dataclass(frozen=True)
class WorkerTrace:
    worker: int
    folder: Path  # profile/<time>/w<k>
    xplane_bytes: int
    summary: trace.TraceSummary


@dataclass(frozen=True)
class Profiled:
    run_id: str
    folder: Path
    traces: dict[int, WorkerTrace]
    errors: dict[int, str] = field(default_factory=dict)
    steps: tuple[int, int] | None = None

    @property
    def code(self) -> int:
        return 1 if self.errors or not self.traces else 0

    def open_commands(self) -> list[str]:
        first = next(iter(self.traces.values()), None)
        where = first.folder / "trace.json.gz" if first else self.folder
        return [
            f"Perfetto: open https://ui.perfetto.dev and drop {where} on it",
            f"XProf: xprof --logdir {self.folder}",
        ]

    def to_dict(self, top: int = 10) -> dict[str, object]:
        return {
            "ok": self.code == 0,
            "run_id": self.run_id,
            "folder": str(self.folder),
            "steps": list(self.steps) if self.steps else None,
            "workers": {
                str(w): {"folder": str(t.folder), "xplane_bytes": t.xplane_bytes, **t.summary.to_dict(top)}
                for w, t in sorted(self.traces.items())
            },
            "errors": {str(w): e for w, e in sorted(self.errors.items())},
            "open": self.open_commands(),
        }


def port_of(rec: RunRecord) -> int:
    """The run's profiler port (worker k listens on it + k); a ProfileError when the run recorded none."""
    port = rec.values.get(PORT_PARAM)
    if not isinstance(port, int) or port <= 0:
        raise ProfileError(
            f"run {rec.run_id} has no profiler port ({PORT_PARAM} was off or its SOP has none)",
            hint=f"start the run with --set {PORT_PARAM}=9012 (the bundled trainer serves on it; your own "
            f"program: {START_LINE})",
        )
    return port


def keep(folder: Path, worker: int, stamp: str, raw: bytes, steps: tuple[int, int] | None) -> WorkerTrace:
    """Write one worker's trace under `folder/w<k>/`, as XProf reads it and as trace-event JSON for Perfetto."""
    planes = xplane.read(raw)
    here = folder / f"w{worker}"
    _write(here / "plugins" / "profile" / stamp / f"w{worker}.xplane.pb", raw)
    _write(here / "trace.json.gz", trace.trace_json(planes))
    return WorkerTrace(worker, here, len(raw), trace.summarise(planes, steps))


def _write(path: Path, data: bytes) -> None:
    """`data` at `path` whole or not at all, readable by this user only (as every file of a run folder)."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        Path(tmp).replace(path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def profile(
    run_id: str, *, seconds: float = 3.0, worker: str = "all", steps: tuple[int, int] | None = None
) -> Profiled:
    """Capture `seconds` of every chosen worker at once; each trace lands in the run folder, summarised (narrowed
    to `steps` when the capture saw them). A worker that cannot be captured is in `errors`, the others kept."""
    if not 0 < seconds <= 600:
        raise UsageError(f"--seconds must be in (0, 600], received {seconds:g}")
    rec = load(run_id)
    if rec.result is not None:
        raise ProfileError(
            f"run {run_id} has ended: there is no job to profile",
            hint="profile a running job, or trace chosen steps as a run goes: tpuops run ... --profile-steps 5-7",
        )
    port = port_of(rec)
    chosen = select_workers(worker, max(rec.workers) + 1)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = rec.local_dir / "profile" / stamp
    transport = open_transport(resolve(rec.spec()), rec.redactor())
    try:
        with ThreadPoolExecutor(max_workers=max(1, min(len(chosen), 32))) as pool:
            got = dict(
                zip(
                    chosen,
                    pool.map(lambda w: _one(transport, rec, w, port + w, seconds, stamp), chosen),
                    strict=True,
                )
            )
    finally:
        transport.close()
    traces, errors = {}, {}
    for w, out in got.items():
        if isinstance(out, str):
            errors[w] = out
            continue
        try:
            traces[w] = keep(folder, w, stamp, out, steps)
        except xplane.XPlaneError as e:
            errors[w] = f"worker {w}: the trace it wrote is unreadable ({e})"
    result = Profiled(run_id, folder, traces, errors, steps)
    if traces:
        from tpuops import jsonout

        _write(folder / "summary.json", jsonout.dumps(result.to_dict()).encode())
    return result


def _one(transport: Transport, rec: RunRecord, w: int, port: int, seconds: float, stamp: str) -> bytes | str:
    """One worker's capture: the xplane bytes, or why there are none (one line)."""
    import grpc

    open_tcp = getattr(transport, "open_tcp", None)
    if open_tcp is None:
        return f"worker {w}: the {transport.name} transport cannot reach a port"
    where = f"{rec.remote_dir}/profile/{stamp}"
    try:
        made = transport.run(w, f"mkdir -p {shell.path(where)} && cd {shell.path(where)} && pwd", timeout=60)
        if not made.ok or not made.stdout.strip().startswith("/"):
            return f"worker {w}: cannot make {where} ({made.error or made.stderr.strip() or made.kind})"
        root = made.stdout.strip().splitlines()[-1]
        request = profiler.profile_request(int(seconds * 1000), root, f"w{w}", f"w{w}")
        with profiler.tunnel(lambda p: open_tcp(w, p), port) as local_port:
            profiler.capture(local_port, request, timeout_s=seconds + 120)
        raw = transport.read_from(w, f"{root}/w{w}/w{w}.xplane.pb", 0)
    except profiler.ProfilerUnreachableError:
        return (
            f"worker {w}: no profiler server on its port {port} (closed); the bundled trainer starts one unless "
            f"{PORT_PARAM}=0, your own program needs: {START_LINE}"
        )
    except ConnectError as e:
        return f"worker {w}: unreachable ({e.message})"
    except grpc.RpcError as e:
        detail = e.details() if hasattr(e, "details") else str(e)
        return f"worker {w}: the profiler server on port {port} refused the capture ({detail})"
    if not raw:
        return f"worker {w}: the server wrote no trace under {root}"
    return raw


STEPS_PARAM = (
    "profile_steps"  # the SOP parameter of `--profile-steps A-B`: those steps traced by the job itself
)
STEPS_DIR = "profile/steps"  # where they land: <run folder>/profile/steps/w<k>/, on the workers and here


def asked_steps(values: dict[str, object]) -> tuple[int, int] | None:
    """The steps a run traces itself (`--profile-steps A-B`), None when none; a ValueError names the form."""
    given = values.get(STEPS_PARAM)
    return trace.parse_steps(str(given)) if given not in (None, "") else None


def check_steps(sop: str, params: set[str], sets: dict[str, object]) -> None:
    """`--profile-steps` (the `profile_steps` value) before anything runs: a SOP that traces steps, A-B."""
    if sets.get(STEPS_PARAM) in (None, ""):
        return
    if STEPS_PARAM not in params:
        raise UsageError(
            f"SOP {sop} does not trace steps (it has no {STEPS_PARAM} parameter)",
            hint="--profile-steps works with `tpuops run grpo` and `tpuops run job`; a running job: tpuops profile RUN_ID",
        )
    try:
        asked_steps(sets)
    except ValueError as e:
        raise UsageError(f"--profile-steps: {e}") from None


def after_run(
    transport: Transport, report: SopReport, values: dict[str, object], runs_dir: str, workers: list[int]
) -> Profiled | None:
    """A finished run that asked for `--profile-steps`: its workers' traces of those steps, summarised; None
    when none were asked or the job goes on (detached: `tpuops profile` then captures it live)."""
    steps = asked_steps(values)
    if steps is None or report.interrupted == "detached" or not any(s.kind == "run" for s in report.steps):
        return None
    local_run = user_config.state_home() / "runs" / report.run_id
    return fetch_steps(transport, run_dir(runs_dir, report.run_id), workers, local_run, steps)


def fetch_steps(
    transport: Transport, remote_run: str, workers: list[int], local_run: Path, steps: tuple[int, int]
) -> Profiled:
    """After the job: each worker's trace of `steps` (the newest `.xplane.pb` under `<run>/profile/steps/w<k>/`),
    brought into the local run folder and summarised over those steps. A worker with none is in `errors` (the
    job never reached those steps, or did not trace them): the run's verdict does not change."""
    folder = local_run / STEPS_DIR
    traces, errors = {}, {}
    for w in workers:
        where = f"{remote_run}/{STEPS_DIR}/w{w}"
        try:
            found = transport.run(w, f"find {shell.path(where)} -name '*.xplane.pb' -type f", timeout=60)
            files = sorted(
                ln.strip() for ln in found.stdout.splitlines() if ln.strip().endswith(".xplane.pb")
            )
            raw = transport.read_from(w, files[-1], 0) if files else None
        except TpuopsError as e:
            errors[w] = (
                f"worker {w}: its trace of steps {steps[0]}-{steps[1]} could not be read ({e.message})"
            )
            continue
        if not raw:
            errors[w] = (
                f"worker {w}: no trace of steps {steps[0]}-{steps[1]} under {where} (did the job reach them? "
                f"your own program traces them itself: see TPUOPS_PROFILE_STEPS in docs/performance.md)"
            )
            continue
        stamp = files[-1].rsplit("/", 2)[-2]  # plugins/profile/<stamp>/<host>.xplane.pb
        try:
            traces[w] = keep(folder, w, stamp, raw, steps)
        except xplane.XPlaneError as e:
            errors[w] = f"worker {w}: the trace of steps {steps[0]}-{steps[1]} is unreadable ({e})"
    return Profiled(local_run.name, folder, traces, errors, steps)


def summarise_folder(folder: Path, steps: tuple[int, int] | None = None) -> dict[int, trace.TraceSummary]:
    """The summaries of the traces a run fetched into `folder` (`w<k>/.../*.xplane.pb`), by worker."""
    out = {}
    for d in sorted(folder.glob("w[0-9]*")):
        files = sorted(d.glob("**/*.xplane.pb"))
        if d.is_dir() and d.name[1:].isdigit() and files:
            try:
                out[int(d.name[1:])] = trace.summarise(xplane.read(files[-1].read_bytes()), steps)
            except xplane.XPlaneError:
                continue
    return out
