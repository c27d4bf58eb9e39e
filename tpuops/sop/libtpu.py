"""libtpu settings a job gets: on a multislice, megascale's abort on a hang or an unrecoverable DCN error.

Without it a multislice job whose collectives wait on a lost or stuck peer logs `HANG_DETECTED` and waits on; with
it libtpu's error reporter ends every worker's process, so the job exits and tpuops reports it (and `--recover`
can act). The flags are axlearn's (`axlearn/common/compiler_options.py`, `num_slices > 1`); they go first in
`LIBTPU_INIT_ARGS`, so a job's own `LIBTPU_INIT_ARGS` (its `.env`) can still turn either off.
"""

from __future__ import annotations

from tpuops.sop.model import PlanContext

HANG_ABORT_FLAGS = (
    "--megascale_error_reporter_abort_on_hang=true",
    "--megascale_error_reporter_abort_on_error=true",
)


def on(value: str) -> bool:
    """The `megascale_abort` setting: true/false (1/0, on/off)."""
    v = value.strip().lower()
    if v in ("true", "1", "on", "yes"):
        return True
    if v in ("false", "0", "off", "no"):
        return False
    raise ValueError(f"megascale_abort must be true or false, received {value!r}")


def export(ctx: PlanContext, setting: str | None) -> str:
    """The job's shell, after its `.env` is read: the hang-abort flags put before its own LIBTPU_INIT_ARGS, on a
    multislice with the setting on; nothing on one slice or with it off."""
    if setting is None or ctx.num_slices < 2 or not on(ctx.raw(setting)):
        return ""
    flags = " ".join(HANG_ABORT_FLAGS)
    return f'LIBTPU_INIT_ARGS="{flags}${{LIBTPU_INIT_ARGS:+ $LIBTPU_INIT_ARGS}}"; export LIBTPU_INIT_ARGS;'
