"""The one error base and the exit-code table: code, error_class and meaning (README's table is checked against it)."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes (CI jobs branch on them; EXIT_CODES below says what each means)."""

    OK = 0
    FAILED = 1
    USAGE = 2
    CONNECT = 3
    TPU_BUSY = 4
    TIMEOUT = 5
    CLOUD = 6
    RECOMPILE = 7
    PREEMPTED = 8
    HANG = 9
    OOM = 10
    INCONSISTENT = 11
    NO_FIT = 12
    UNVERIFIED = 13
    STOPPED = 14
    RESOURCE = 15
    INTERRUPTED = 130  # 128 + SIGINT, as shells report it
    TERMINATED = 143  # 128 + SIGTERM


# code -> (error_class in --json output, meaning as README.md shows it). The one place both are written:
# README's "Exit codes" table must equal exit_code_table() (tests/tpuops/test_cli.py checks it).
EXIT_CODES: dict[ExitCode, tuple[str, str]] = {
    ExitCode.OK: ("ok", "success"),
    ExitCode.FAILED: (
        "user_code",
        "a remote command or the user's code failed (the report names the worker and the line)",
    ),
    ExitCode.USAGE: (
        "usage",
        "bad input: an option, a SOP file, a `--set` value, the config file, a trainer override, a `.env` that "
        "cannot be sent as it is, a branch or commit the remote does not have",
    ),
    ExitCode.CONNECT: ("connect", "could not connect, log in, or verify a host key"),
    ExitCode.TPU_BUSY: ("tpu_busy", "the TPU is held by another process (rerun with `--force` to stop it)"),
    ExitCode.TIMEOUT: ("timeout", "a command or wait ran past its timeout"),
    ExitCode.CLOUD: (
        "cloud",
        "the TPU API refused or failed (not found, ambiguous, quota, capacity), or a Google API answered 403 "
        "(TPU, OS Login, IAP: the line names the IAM role; `error` is `permission` in the JSON), or answered "
        "something that is not its JSON (an HTML page, JSON cut off) or nothing within its deadline",
    ),
    ExitCode.RECOMPILE: ("recompile", "`recompile-check`: compiles after the warm-up window"),
    ExitCode.PREEMPTED: (
        "preempted",
        "the VM was preempted or lost: every SOP on a VM is watched through the TPU API; `--recover` "
        "recreates it, and exits 8 when its recoveries run out",
    ),
    ExitCode.HANG: ("hang", "a worker stopped making progress (hang)"),
    ExitCode.OOM: (
        "oom",
        "the trainer ran out of device memory (also inside a traceback; the report names "
        "`tpuops fit ... --set train.micro_batch=...`)",
    ),
    ExitCode.INCONSISTENT: (
        "inconsistent",
        "the workers differ (git commit, `.env` hash or Python/JAX versions): the run was not started",
    ),
    ExitCode.NO_FIT: (
        "no_fit",
        "the config does not fit its TPU: `tpuops fit`, or the fit preflight of a run on a VM (nothing was "
        "started)",
    ),
    ExitCode.UNVERIFIED: (
        "unverified",
        "a recompile check could not judge the run: it saw no step line (`--set step_pattern=REGEX`) or no JAX "
        "compile logging (is `JAX_LOG_COMPILES=1` reaching the program?); never ok",
    ),
    ExitCode.STOPPED: (
        "stopped",
        "the run was stopped on purpose (`tpuops stop RUN_ID`, or a `--force` run that took its TPU) and no "
        "worker had failed before: `run`, `attach`, `report` and `runs` say `stopped`",
    ),
    ExitCode.RESOURCE: (
        "resource",
        "a worker ran out of a resource: its disk (no space left on device, or its quota) while a git sync "
        "stashed its local edits; the line names the path and the bytes free, the partial stash is removed and "
        "the checkout is not reset",
    ),
    ExitCode.INTERRUPTED: (
        "interrupted",
        "tpuops itself was interrupted (Ctrl-C, SIGINT); a detached job goes on (`tpuops attach RUN_ID`)",
    ),
    ExitCode.TERMINATED: (
        "terminated",
        "tpuops itself was stopped by SIGTERM; a detached job goes on (`tpuops attach RUN_ID`)",
    ),
}


def error_class(code: int) -> str:
    """The failure class CI jobs branch on, from the exit code; "failed" for a code outside the table."""
    return EXIT_CODES[ExitCode(code)][0] if code in ExitCode._value2member_map_ else "failed"


def exit_code_table() -> str:
    """README.md's "Exit codes" table, as markdown."""
    rows = [f"| {int(c)} | `{cls}` | {meaning} |" for c, (cls, meaning) in EXIT_CODES.items()]
    return "\n".join(["| code | error_class | meaning |", "| ---: | --- | --- |", *rows])


class TpuopsError(Exception):
    """Base of every error tpuops reports: one actionable line, a fixed exit code, never a secret."""

    exit_code: ExitCode = ExitCode.FAILED
    kind: str = "failed"

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def line(self) -> str:
        """The single line shown to the user: what failed, then what to try next."""
        return f"{self.message} ({self.hint})" if self.hint else self.message


class UsageError(TpuopsError):
    exit_code = ExitCode.USAGE
    kind = "usage"


class ConnectError(TpuopsError):
    exit_code = ExitCode.CONNECT
    kind = "connect"


class HostKeyError(ConnectError):
    kind = "host_key"


class CommandTimeoutError(TpuopsError):
    exit_code = ExitCode.TIMEOUT
    kind = "timeout"


class CloudError(TpuopsError):
    exit_code = ExitCode.CLOUD
    kind = "cloud"


class PermissionDeniedError(CloudError):
    """A Google API answered 403: the message names the IAM role that is missing."""

    kind = "permission"


class PreemptedError(CloudError):
    exit_code = ExitCode.PREEMPTED
    kind = "preempted"


class NoSpaceError(TpuopsError):
    """A worker's disk (or its quota) is full where tpuops had to write: the message names the path and the
    bytes free; what was half-written is removed."""

    exit_code = ExitCode.RESOURCE
    kind = "no_space"


class DoesNotFitError(TpuopsError):
    exit_code = ExitCode.NO_FIT
    kind = "no_fit"
