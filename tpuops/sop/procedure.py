"""The validated SOP and fragment models (top-level keys, the step union) and how parameter values resolve."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Literal

from pydantic import Field

from tpuops.errors import UsageError
from tpuops.sop.model import Frozen, Param, suggest, trainer_override
from tpuops.sop.pyenv import PythonEnv
from tpuops.sop.runs import FetchLog, FollowStep, Run
from tpuops.sop.steps import ClearLockfile, GitSync, Shell, SyncEnv

_KINDS = (GitSync, PythonEnv, ClearLockfile, SyncEnv, Shell, Run, FollowStep, FetchLog)
STEP_KINDS = {cls.model_fields["kind"].default: cls for cls in _KINDS}
AnyStep = Annotated[
    GitSync | PythonEnv | ClearLockfile | SyncEnv | Shell | Run | FollowStep | FetchLog,
    Field(discriminator="kind"),
]


class Validate(Frozen):
    """A local command that must succeed before anything runs remotely (e.g. the trainer checking --set)."""

    argv: list[str]
    what: str = "validation"


class Scan(Frozen):
    """After the steps: read the fetched logs (or the steps' stdout) with logscan and judge the run."""

    source: Literal["log", "stdout"] = "log"
    warmup: int = 1
    fail_on_recompile: bool = False
    # The user's step-line regex (group `step`, optional `dt`) instead of the forms the scanner knows
    # (docs/logs.md "Step lines"); `--set step_pattern=...` overrides it.
    step_pattern: str | None = None


class Fit(Frozen):
    """Before a run on a VM: the trainer config compiled ahead of time for the VM's accelerator type (tpuops fit)."""

    config: str
    sets: str | None = None  # a list parameter of trainer overrides (`--set=k=v` items)


class Include(Frozen):
    """A step entry `- include: NAME`: the fragment's steps go here, its params join the SOP's."""

    include: str


class Fragment(Frozen):
    """A fragment file (sops/fragments/NAME.yaml): parameters and steps that SOPs include; never run alone."""

    description: str = ""
    params: dict[str, Param] = {}
    steps: list[AnyStep]


class Sop(Frozen):
    """A procedure: parameters with defaults and an ordered list of typed steps."""

    name: str
    description: str = ""
    # Runs the trainer bundled with tpuops: with no repository named and none here that holds `trainer/`, the
    # installed trainer is what the workers sync (tpuops/run/bundled.py).
    trainer: bool = False
    params: dict[str, Param] = {}
    # Dotted --set keys (train.lr=1e-5) and parameters with `maps_to` go into this list parameter as
    # `--set=key=value` items: the one list of trainer overrides a SOP splices into its commands.
    overrides: str | None = None
    preflight: list[Validate] = []
    fit: Fit | None = None
    scan: Scan | None = None
    steps: list[AnyStep]

    def resolve(
        self, sets: dict[str, str], defaults: Mapping[str, object] | None = None
    ) -> dict[str, object]:
        """Typed parameter values: --set beats user-config defaults beats the SOP's own defaults.

        A `maps_to` parameter with none of these has no value (the trainer config's own stands); one with a
        value is added to the overrides list ahead of the dotted --set items, so an explicit
        `--set train.steps=N` still has the last word."""
        sets = dict(sets)
        if self.overrides:
            dotted = [trainer_override(k, v) for k, v in sets.items() if "." in k]
            sets = {k: v for k, v in sets.items() if "." not in k}
            if dotted:
                # `--set=k=v` items: one argv word each, whatever the value holds.
                sets[self.overrides] = dotted  # type: ignore[assignment]
        for key in sets:
            if key not in self.params:
                hint = suggest(key, self.params) or f" (parameters: {', '.join(self.params) or 'none'})"
                if self.overrides:
                    hint += "; trainer settings take a dot: --set train.steps=20"
                raise UsageError(f"unknown parameter {key!r} for SOP {self.name}{hint}")
        values: dict[str, object] = {}
        for name, p in self.params.items():
            if name in sets:
                raw: object = sets[name]
            elif defaults and defaults.get(name) is not None:
                raw = defaults[name]
            elif p.default is not None:
                raw = p.default
            elif p.maps_to:
                continue  # nobody set it: the trainer config's own value stands
            else:
                raise UsageError(
                    f"SOP {self.name} needs parameter {name!r} ({p.description or p.type})",
                    hint=f"pass --set {name}=... or set it in tpuops.toml",
                )
            values[name] = p.coerce(name, raw)
        if self.overrides:
            mapped = [
                trainer_override(p.maps_to, values[name])
                for name, p in self.params.items()
                if p.maps_to and name in values
            ]
            values[self.overrides] = [*mapped, *values[self.overrides]]  # type: ignore[misc]
        return values
