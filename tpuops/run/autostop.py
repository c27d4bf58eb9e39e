"""A VM's autostop put to work: the setting written to its metadata and its watcher started (or turned off) on
worker 0 over SSH (`vm create --autostop`, `vm autostop`), and started again at each run's start, so a VM that was
recreated or started again is watched as soon as it runs something."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from tpuops.cloud import autostop
from tpuops.cloud.tpu_api import VmInfo
from tpuops.config import TargetSpec
from tpuops.config import load as load_config
from tpuops.errors import ConnectError, TpuopsError
from tpuops.run.target import Target, open_transport, resolve
from tpuops.shell import Redactor
from tpuops.sop import autostop as script
from tpuops.transport.base import Transport

POLL_ENV = "TPUOPS_AUTOSTOP_POLL_S"  # how often the watcher looks (tests: a second); default POLL_S
POLL_S = 30.0
RUNS = "~/tpuops/runs"  # where the SOPs' jobs keep their pid and exit files (sop/runs.py's default runs_dir)


@dataclass(frozen=True)
class Applied:
    """What `vm autostop` / `vm create --autostop` did: the VM, its new setting (None: off) and worker 0's word."""

    vm: VmInfo
    setting: autostop.Autostop | None
    watcher: str  # "watching", "off", or why no watcher runs

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.vm.name,
            "zone": self.vm.zone,
            "autostop": self.setting.value if self.setting else "off",
            "watcher": self.watcher,
        }


def apply(spec: TargetSpec, setting: autostop.Autostop | None, *, cwd: Path) -> Applied:
    """The setting into the VM's metadata (`off` when None), then worker 0's watcher started with it or turned off.
    A VM that cannot do the action to itself is refused before anything changes (exit 2)."""
    target = resolve(spec, load_config(cwd))
    vm, api = target.vm, target.api
    if vm is None or api is None:
        from tpuops.errors import UsageError

        raise UsageError("autostop is a VM's setting", hint="name a VM (tpuops vm autostop NAME 30m)")
    if setting is not None:
        autostop.check(vm, setting)
    from tpuops.cloud.vm_state import update_metadata

    if autostop.of(vm) != setting:
        update_metadata(api, vm, {autostop.KEY: setting.value if setting else "off"})
    transport = open_transport(target, Redactor())
    try:
        transport.connect(0)
        watcher = _on_worker0(transport, target, setting)
    finally:
        transport.close()
    return Applied(vm, setting, watcher)


def ensure(transport: Transport, target: Target) -> str | None:
    """At a run's start: worker 0's watcher (re)started when the VM has autostop on (a recreated or restarted VM
    has none running). Never fails the run: a failure is returned in words for a note."""
    vm = target.vm
    if vm is None or target.api is None or (setting := autostop.of(vm)) is None:
        return None
    try:
        word = _on_worker0(transport, target, setting)
    except TpuopsError as e:
        return f"autostop watcher not started on w0: {e.message}"
    return None if word == "watching" else f"autostop watcher on w0: {word}"


def _on_worker0(transport: Transport, target: Target, setting: autostop.Autostop | None) -> str:
    assert target.vm is not None and target.api is not None
    if setting is None:
        command = script.off_script()
    else:
        poll = float(os.environ.get(POLL_ENV) or POLL_S)
        config = autostop.watch_config(target.api, target.vm, setting, poll)
        command = script.install_script({**config, "runs": [RUNS]})
    result = transport.run(0, command, timeout=60)
    said = result.stdout.strip().splitlines()[-1:] if result.stdout.strip() else []
    if not result.ok:
        raise (ConnectError if result.interrupted else TpuopsError)(
            f"{target.vm.name} w0: the autostop watcher could not be set up: {result.error or result.stderr.strip()}",
            hint="check `tpuops doctor --vm NAME`, then run `tpuops vm autostop NAME DURATION` again",
        )
    word = {script.WATCHING: "watching", script.OFF: "off", script.NO_PYTHON: "no python3 on w0: no watcher"}
    return word.get(said[0] if said else "", "no answer from w0")
