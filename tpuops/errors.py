"""The one error base and the fixed exit codes the CLI maps errors to."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Exit codes (documented in README.md; CI jobs branch on them)."""

    OK = 0
    FAILED = 1  # the user's code or a remote command failed
    USAGE = 2  # bad input: options, SOP file, --set value, config
    CONNECT = 3  # could not connect / authenticate / verify a host key
    TPU_BUSY = 4  # another process holds the TPU
    TIMEOUT = 5  # a command or wait ran past its limit
    CLOUD = 6  # the TPU API refused or failed (not found, quota, capacity)
    RECOMPILE = 7  # recompile-check found compiles after warm-up
    PREEMPTED = 8  # the VM was preempted
    HANG = 9  # a worker stopped making progress
    OOM = 10  # the trainer ran out of device memory
    INCONSISTENT = 11  # workers differ in code, .env or versions: the run was not started
    NO_FIT = 12  # the config does not fit its TPU (tpuops fit, and the preflight of a run on a VM)


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


class RemoteCommandError(TpuopsError):
    exit_code = ExitCode.FAILED
    kind = "remote_command"


class TpuBusyError(TpuopsError):
    exit_code = ExitCode.TPU_BUSY
    kind = "tpu_busy"


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


class DoesNotFitError(TpuopsError):
    exit_code = ExitCode.NO_FIT
    kind = "no_fit"
