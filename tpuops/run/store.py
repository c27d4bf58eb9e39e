"""Runs on this machine: their records (run.json, result.json, follow offsets), written and read here.

What is done with a run started earlier (attach, logs, stop, states) is run/detached.py."""

from __future__ import annotations

import dataclasses
import json
import secrets as _secrets
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NotRequired, TypedDict

from tpuops import config as user_config
from tpuops import jsonout
from tpuops.config import TargetSpec, write_atomic
from tpuops.errors import ExitCode, UsageError
from tpuops.run.estimate import Estimate
from tpuops.shell import Redactor
from tpuops.sop.runs import run_dir


class WorkerRoute(TypedDict):
    """One worker as the run logged in to it (transport/base.Worker's fields)."""

    index: int
    host: str
    port: int
    user: str | None
    hostkey: str | None  # the pinned fingerprint it presented
    internal_host: str | None
    slice_index: int
    peer_host: str | None


class RouteRecord(TypedDict):
    """How a VM run reached its workers, written once its connections were up (run/target.keep_route): attach,
    logs, stop and report log in the same way with no cloud API call, and resolve the VM again only when it fails."""

    via: str  # the VM's route: external, internal or iap
    workers: list[WorkerRoute]  # iap: the workers' own addresses (the tunnels are opened again)
    identity: str | None  # the SSH key the run logged in with
    vm: dict[str, object]  # the VM as the run resolved it (VmInfo.to_dict): what the VM watch compares with
    instances: list[str]  # iap: each worker's instance (what a tunnel goes to)


class SecretDigests(TypedDict):
    """The run's .env values as keyed hashes of each printed form (`secret_digests`), and where the workers
    keep the .env files that were sent."""

    key: str  # hex
    forms: list[tuple[int, str]]  # (length, keyed digest); JSON keeps each as a two-item list
    worker_files: NotRequired[list[str]]


class ScanRecord(TypedDict, total=False):
    """How the run's logs are judged (the SOP's `scan:`, the step pattern the run used): attach judges the same."""

    source: Literal["log", "stdout"]
    warmup: int
    fail_on_recompile: bool
    step_pattern: str | None


HANG_KEYS: tuple[Literal["hang_factor", "hang_min_s", "hang_warmup", "on_hang", "poll_s"], ...] = (
    "hang_factor", "hang_min_s", "hang_warmup", "on_hang", "poll_s"
)  # fmt: skip


class HangWatch(TypedDict, total=False):
    """The run's follow step's hang watch (logs/actions.Follow's fields): attach watches for a hang the same."""

    hang_factor: float
    hang_min_s: float
    hang_warmup: int
    on_hang: str
    poll_s: float


class WatchRecord(TypedDict, total=False):
    """How the run is watched: its VM (a VM run's `unreachable_s`, `watch_s`, whether it recovers) and its hang."""

    unreachable_s: float
    watch_s: float
    recover: bool
    follow: HangWatch | None


class ResultRecord(TypedDict, total=False):
    """result.json, as `tpuops runs`, attach and report read it: RunResult.to_dict() of a followed run (its
    steps, log report and recoveries besides), or the short record attach and `tpuops stop` save."""

    run_id: str
    sop: str
    ok: bool
    exit_code: int
    exit_codes: dict[str, int | None]
    stopped: bool
    interrupted: str | bool
    hint: str | None
    estimate: Estimate | None
    finished: float


class RunJson(TypedDict):
    """run.json, as `record_start` writes it (older records may lack the later keys: `load` reads them so)."""

    run_id: str
    sop: str
    target: dict[str, object]  # TargetSpec's fields (tuples as lists)
    workers: list[int]
    values: dict[str, object]
    started: float
    argv: list[str]
    secret_files: list[str]
    secret_digests: SecretDigests
    runs_dir: str
    scan: ScanRecord | None
    estimate: Estimate | None
    watch: WatchRecord | None
    route: NotRequired[RouteRecord]


@dataclass(frozen=True)
class RunRecord:
    """A run's record on this machine: its run.json, and its result.json once it ended."""

    run_id: str
    sop: str
    target: dict[str, object]  # TargetSpec's fields as written (`spec()` makes the TargetSpec)
    workers: list[int]
    values: dict[str, object]
    started: float
    result: ResultRecord | None = None  # the JSON report once the SOP finished
    secret_files: tuple[str, ...] = ()  # the local .env files whose values the run's logs must not show
    runs_dir: str | None = None  # the run step's runs_dir on the workers (older records: the parameter)
    secret_digests: SecretDigests | None = (
        None  # keyed hashes of the .env values sent (launch._secret_digests)
    )
    scan: ScanRecord | None = None  # the SOP's scan settings (warmup, fail_on_recompile, step_pattern)
    watch: WatchRecord | None = None  # a VM run's watch (unreachable_s, watch_s): attach watches it the same
    estimate: Estimate | None = None  # the fit's estimate (config, accelerator): a verdict's hint names them
    route: RouteRecord | None = (
        None  # how a VM run logged in to its workers (None: not recorded, resolve the VM)
    )
    argv: tuple[str, ...] = ()  # the command that started it

    def redactor(self) -> Redactor:
        """Redacts from what the workers' logs say the values of the run's .env files as they are now, and the
        values that were sent with the run (kept as keyed hashes) even after the local files changed."""
        from tpuops.config import secrets

        files = [Path(f) for f in self.secret_files if Path(f).is_file()]
        # Read leniently: redaction must work even if a file was since edited into one tpuops would not send.
        redact = Redactor(v for f in files for v in secrets.parse(f.read_bytes())[0].values())
        if self.secret_digests:
            redact.add_hashed(bytes.fromhex(self.secret_digests["key"]), self.secret_digests["forms"])
        return redact

    @property
    def local_dir(self) -> Path:
        return user_config.state_home() / "runs" / self.run_id

    @property
    def remote_dir(self) -> str:
        return run_dir(self.runs_dir or str(self.values.get("runs_dir", "~/tpuops/runs")), self.run_id)

    def spec(self) -> TargetSpec:
        """The recorded target; keys a record of another tpuops version has and this one does not are left out."""
        known = {f.name for f in dataclasses.fields(TargetSpec)}
        t = {k: tuple(v) if isinstance(v, list) else v for k, v in self.target.items() if k in known}
        return TargetSpec(**t)  # type: ignore[arg-type]  # the fields record_start wrote from a TargetSpec


def load(run_id: str) -> RunRecord:
    d = user_config.state_home() / "runs" / run_id
    if not (d / "run.json").exists():
        known = [r.run_id for r in list_runs()[:5]]
        raise UsageError(f"no run {run_id!r} in {d.parent}", hint=f"recent: {', '.join(known) or 'none'}")
    try:
        data: RunJson = json.loads((d / "run.json").read_text())
        result: ResultRecord | None = (
            json.loads((d / "result.json").read_text()) if (d / "result.json").exists() else None
        )
    except ValueError:  # written before records were atomic, and cut short
        raise UsageError(
            f"run record {d} is unreadable (an interrupted write)", hint="remove that folder"
        ) from None
    return RunRecord(
        data["run_id"],
        data["sop"],
        data["target"],
        data["workers"],
        data["values"],
        data["started"],
        result=result,
        secret_files=tuple(data.get("secret_files", ())),
        runs_dir=data.get("runs_dir"),
        secret_digests=data.get("secret_digests"),
        scan=data.get("scan"),
        watch=data.get("watch"),
        estimate=data.get("estimate"),
        route=data.get("route"),
        argv=tuple(data.get("argv", ())),
    )


def list_runs() -> list[RunRecord]:
    root = user_config.state_home() / "runs"
    ids = sorted((p.parent.name for p in root.glob("*/run.json")), reverse=True) if root.exists() else []
    out = []
    for i in ids:
        try:
            out.append(load(i))
        except UsageError:
            continue  # an unreadable record is not a run to list (`tpuops logs ID` says what is wrong)
    return out


def offsets_path(run_id: str) -> Path:
    return user_config.state_home() / "runs" / run_id / "follow.json"


class OffsetWriter:
    """Persists how far each worker's log was shown, so `attach` resumes exactly there."""

    def __init__(self, run_id: str) -> None:
        self.path = offsets_path(run_id)
        self.lock = threading.Lock()

    def __call__(self, offsets: dict[int, int]) -> None:
        with self.lock:
            write_atomic(self.path, json.dumps({str(k): v for k, v in offsets.items()}))


def saved_offsets(run_id: str) -> dict[int, int]:
    p = offsets_path(run_id)
    return {int(k): v for k, v in json.loads(p.read_text()).items()} if p.exists() else {}


def record_end(run_id: str, exit_codes: dict[int, int | None], code: int) -> None:
    """After an attach: once every worker has an exit code, or the job was judged hung (its run saves that
    verdict too: the job may go on), remember how the run ended (`tpuops runs`; `tpuops report RUN_ID` judges a
    hang by it, as no log says so).

    The follower that started the run saved a fuller result if it saw the end; that one is kept (as is the
    one `tpuops stop` saved).
    """
    rec = load(run_id)
    ended = all(exit_codes.get(w) is not None for w in rec.workers)
    if rec.result is None and (ended or code == ExitCode.HANG):
        codes = {str(w): exit_codes.get(w) for w in rec.workers}
        end: ResultRecord = {
            "run_id": run_id,
            "sop": rec.sop,
            "ok": code == 0,
            "exit_code": code,
            "exit_codes": codes,
        }
        if code == ExitCode.STOPPED:
            end["stopped"] = True
        save_result(run_id, end)


def record_route(run_id: str, route: RouteRecord) -> None:
    """Add to a run's record how it logged in to its workers (after its first connections)."""
    path = user_config.state_home() / "runs" / run_id / "run.json"
    data: RunJson = json.loads(path.read_text())
    write_atomic(path, jsonout.dumps({**data, "route": route}, indent=1))


def save_result(run_id: str, data: Mapping[str, object]) -> None:
    """The run's result.json: a RunResult's `to_dict()`, or a ResultRecord (attach's and stop's short one)."""
    d = user_config.state_home() / "runs" / run_id
    write_atomic(d / "result.json", jsonout.dumps({**data, "finished": time.time()}))


def env_values(secret_files: list[str]) -> list[str]:
    """The values of the run's local .env files (read leniently: these are only for redaction)."""
    from tpuops.config import secrets

    return [
        v for f in map(Path, secret_files) if f.is_file() for v in secrets.parse(f.read_bytes())[0].values()
    ]


def secret_digests(secret_files: list[str]) -> SecretDigests:
    """What the run's .env values were, kept as keyed hashes of each printed form (never a value): `attach` and
    `logs` still redact them after the local .env changed (shell.Redactor.add_hashed)."""
    from tpuops.shell import secret_digest, secret_forms

    key = _secrets.token_bytes(16)
    forms = sorted(
        {(len(s), secret_digest(key, s)) for v in env_values(secret_files) for s in secret_forms(v)}
    )
    return {"key": key.hex(), "forms": forms}  # written as two-item lists, as before


def record_start(
    run_id: str,
    sop: str,
    target: TargetSpec,
    workers: list[int],
    values: Mapping[str, object],
    secret_files: list[str],
    runs_dir: str,
    worker_env_files: list[str],
    scan: ScanRecord | None = None,
    estimate: Estimate | None = None,
    watch: WatchRecord | None = None,
) -> None:
    """Remember how to reach a run again (`tpuops runs`, attach, logs); holds no secret (only where they are)."""
    d = user_config.run_folder(run_id)
    record: RunJson = {
        "run_id": run_id,
        "sop": sop,
        "target": dict(target.__dict__),
        "workers": workers,
        "values": dict(values),
        "started": time.time(),
        # The command that started it (the report page shows it); secrets are never on it (.env only).
        "argv": ["tpuops", *sys.argv[1:]],
        "secret_files": secret_files,
        "secret_digests": {**secret_digests(secret_files), "worker_files": worker_env_files},
        "runs_dir": runs_dir,
        "scan": scan,  # how the run's logs are judged (attach judges them the same way)
        "estimate": estimate,  # the fit's cost and predicted peak HBM: `tpuops report RUN_ID` sets the run beside it
        "watch": watch,  # how the run is watched (its VM, its hang): `tpuops attach` watches it the same way
    }
    write_atomic(d / "run.json", jsonout.dumps(record, indent=1))  # never half a record
