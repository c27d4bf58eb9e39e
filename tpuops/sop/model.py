"""The SOP data model: typed parameters, template substitution, the step base, and the plan context."""

from __future__ import annotations

import difflib
import math
import re
import shlex
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict

from tpuops import shell
from tpuops.errors import UsageError
from tpuops.sop.actions import Action
from tpuops.sop.status import Status
from tpuops.transport.base import CmdResult, Kind

# `{name}` with a lower-case name is a parameter; `${NAME}` and `{{` stay shell text.
TEMPLATE = re.compile(r"(?<![$\{])\{([a-z_][a-z0-9_]*)\}(?!\})")
# Values every step can use without declaring them.
BUILTINS = ("worker", "num_workers", "run_id", "coordinator_host")
Values = dict[str, object]  # a SOP's parameter values, typed (Sop.resolve)

# A trainer config key a parameter may stand for (`maps_to: train.steps`): section.key, lower case.
TRAINER_KEY = re.compile(r"[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+")

# `list` holds strings; in a command template each item becomes its own quoted word.
ParamType = Literal["str", "int", "float", "bool", "path", "list"]
_PY_TYPES: dict[str, type] = {"str": str, "int": int, "float": float, "bool": bool, "path": str, "list": list}


class Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Param(Frozen):
    """One SOP parameter: a type, a default (None = required), an optional list of choices.

    With `maps_to: section.key` the parameter stands for that trainer setting: given a value (by the user, or
    a default the SOP declares), it goes to the trainer as `--set=section.key=value` in the SOP's overrides
    list; without one nothing is passed and the trainer config's own value stands (it is then not required).
    """

    type: ParamType = "str"
    default: object = None  # a YAML value of the parameter's type
    description: str = ""
    choices: list[object] | None = None
    maps_to: str | None = None

    @property
    def shown_default(self) -> str:
        """The default as `sop show` prints it."""
        if self.default is not None:
            return str(self.default)
        return f"(the trainer's {self.maps_to})" if self.maps_to else "(required)"

    def coerce(self, name: str, raw: object) -> object:
        """Parse a `--set` string (or a YAML/config value) into this parameter's type."""
        want = _PY_TYPES[self.type]
        if want is list:
            if isinstance(raw, list):
                items = [str(item) for item in raw]
            elif self.choices is not None:  # names from a fixed set: `--set impl=chunked,pallas`
                items = [item.strip() for item in str(raw).split(",") if item.strip()]
            else:  # words as a shell splits them: `--set cmd='python -u "my script.py"'` is three
                try:
                    items = shlex.split(str(raw))
                except ValueError as e:
                    raise UsageError(
                        f"parameter {name} is a list of words, received {raw!r}: {e}",
                        hint=f"quote each word once, for example --set {name}='a \"b c\"'",
                    ) from None
            if self.choices is not None and (not items or any(i not in self.choices for i in items)):
                bad = ", ".join(repr(i) for i in items if i not in self.choices) or "nothing"
                choices = ", ".join(map(str, self.choices))
                raise UsageError(f"parameter {name} takes one or more of {choices}; received {bad}")
            return items
        if isinstance(raw, want) and not (want is int and isinstance(raw, bool)):
            value: object = raw
        else:
            text = str(raw).strip()
            try:
                if want is bool:
                    if text.lower() not in {"true", "false", "1", "0", "yes", "no"}:
                        raise ValueError
                    value = text.lower() in {"true", "1", "yes"}
                else:
                    value = want(text)
            except ValueError:
                raise UsageError(
                    f"parameter {name} must be {self.type}, received {raw!r}",
                    hint=f"for example --set {name}={self._example()}",
                ) from None
        if isinstance(value, float) and not math.isfinite(value):  # float("nan") parses; no setting means it
            raise UsageError(
                f"parameter {name} must be a finite number, received {raw!r}",
                hint=f"for example --set {name}={self._example()}",
            )
        if self.choices is not None and value not in self.choices:
            raise UsageError(f"parameter {name} must be one of {self.choices}, received {raw!r}")
        return value

    def _example(self) -> str:
        return {"int": "3", "float": "0.5", "bool": "true"}.get(self.type, "value")


# The megascale coordinator's port: Ray's default (ray-project/ray python/ray/util/tpu.py
# get_tpu_coordinator_env_vars); xpk opens 8080 "for megascale" on GKE. Not libtpu's documented default.
MEGASCALE_PORT = 8081


@dataclass(frozen=True)
class PlanContext:
    """Everything a pure plan() may look at. Per worker; no network, no clock."""

    worker: int
    num_workers: int
    run_id: str
    values: dict[str, object]
    force: bool = False
    local_dir: Path = field(default_factory=Path.cwd)
    paths: frozenset[str] = frozenset()  # parameters of type path: `~/` keeps meaning the worker's home
    coordinator_host: str = "127.0.0.1"  # worker 0's address as the other workers see it
    slice_id: int = 0  # this worker's slice on a multislice VM
    num_slices: int = 1

    def megascale_env(self) -> dict[str, str]:
        """On a multislice: the variables libtpu's megascale (DCN) transport reads, as Cloud TPU's `tpu-env` and
        xpk set them; the coordinator is slice 0's worker 0 (also jax.distributed's). Empty on one slice."""
        if self.num_slices < 2:
            return {}
        return {
            "MEGASCALE_COORDINATOR_ADDRESS": self.coordinator_host,
            "MEGASCALE_NUM_SLICES": str(self.num_slices),
            "MEGASCALE_SLICE_ID": str(self.slice_id),
            "MEGASCALE_PORT": str(MEGASCALE_PORT),
        }

    def builtins(self) -> dict[str, object]:
        return {
            "worker": self.worker,
            "num_workers": self.num_workers,
            "run_id": self.run_id,
            "coordinator_host": self.coordinator_host,
        }

    def raw(self, template: str) -> str:
        """Substitute parameters verbatim (for typed fields the step quotes itself)."""
        return fill(template, {**self.values, **self.builtins()})

    def number(self, value: float | str | None, field_name: str) -> float | None:
        """A numeric step field, or its template (`"{timeout}"`) checked once the parameters are in: finite and
        not negative; a timeout above 0 (`timeout=-1` would run the command and then call it timed out)."""
        if value is None:
            return None
        text = self.raw(value) if isinstance(value, str) else str(value)
        where = f" (from {value!r})" if isinstance(value, str) and text != value else ""
        try:
            number = float(text)
        except ValueError:
            number = math.nan
        positive = field_name == "timeout"
        if not math.isfinite(number) or number < 0 or (positive and number == 0):
            raise UsageError(
                f"step field {field_name} must be a number of seconds {'> 0' if positive else '>= 0'}, "
                f"received {text!r}{where}",
                hint=f"for example {field_name}: 600, or a float parameter such as {{{field_name}}}",
            )
        return number

    def command(self, template: str) -> str:
        """Substitute parameters into shell text, each value quoted: a value is data, never code."""
        return fill(template, {**self.values, **self.builtins()}, shell_words=True, paths=self.paths)


@dataclass(frozen=True)
class Outcome:
    """One step's result on one worker."""

    status: Status | str  # a Status value (a plain string compares equal to its member)
    detail: str = ""
    data: dict[str, object] = field(default_factory=dict)


class Step(Frozen):
    """Base of every step kind: a small frozen model with a pure plan()."""

    kind: str
    name: str | None = None
    always: bool = False  # run even after an earlier step failed (e.g. fetch the logs of a failed run)
    template_fields: ClassVar[tuple[str, ...]] = ()
    # How a dry run names what preview() found, and says it found nothing.
    preview_words: ClassVar[tuple[str, str]] = ("found", "nothing found")

    @property
    def title(self) -> str:
        return self.name or self.kind

    def plan(self, ctx: PlanContext) -> list[Action]:
        raise NotImplementedError

    def check(self, ctx: PlanContext) -> list[Action]:
        """Read-only commands that must pass on every worker before any step changes one (the executor runs
        every step's checks first: a refused start leaves each worker as it was). None by default."""
        return []

    def preview(self, ctx: PlanContext) -> list[Action]:
        """Read-only commands a dry run may send to see what this step would change on a worker beyond what
        its plan says (git sync: the local edits it would discard). None by default."""
        return []

    def previewed(self, results: list[CmdResult]) -> list[str]:
        """What the preview found, a line per item (git sync: `git status --porcelain` lines)."""
        return []

    def check_outcome(self, results: list[CmdResult]) -> Outcome:
        """A check's verdict on one worker: a failure status refuses the start."""
        return self.outcome(results)

    def outcome(self, results: list[CmdResult]) -> Outcome:
        """Turn this worker's command results into an outcome (steps parse their `tpuops:` lines)."""
        last = results[-1] if results else None
        if last is None:
            return Outcome("ok")
        if last.interrupted:
            status = (
                "timeout"
                if last.kind is Kind.TIMEOUT
                else "cancelled"
                if last.kind is Kind.CANCELLED
                else "failed"
            )
            return Outcome(status, last.error or str(last.kind))
        if not last.ok:
            why = last.error or _last_line(last.stderr or last.stdout) or f"exit {last.exit_code}"
            return Outcome("failed", why)
        return Outcome("ok", _last_line(last.stdout))


def markers(stdout: str) -> list[dict[str, str]]:
    """Parse `tpuops: key=value ...` lines a step script printed."""
    found = []
    for line in stdout.splitlines():
        if line.startswith("tpuops: "):
            fields = dict(part.split("=", 1) for part in line[8:].split() if "=" in part)
            fields["_"] = line[8:]
            found.append(fields)
    return found


def suggest(word: str, options: Iterable[str]) -> str:
    """`; did you mean 'x'?` for the closest of `options`, or nothing."""
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def fill(
    template: str, scope: Mapping[str, object], *, shell_words: bool = False, paths: Collection[str] = ()
) -> str:
    """The one renderer of parameter values (`--set`, tpuops.toml, defaults) into a template's `{name}`s.

    `shell_words`: into shell text, each value one quoted word (a list: one quoted word per item; a name in
    `paths`: a remote path, `~/` kept as the remote home), so a value is data, never code; otherwise verbatim
    (a list: its items joined by spaces). A `{name}` the scope lacks is exit 2 naming it."""

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name not in scope:
            raise UsageError(
                f"{{{name}}} in {template!r} is not a parameter",
                hint=f"parameters here: {', '.join(sorted(scope)) or 'none'}",
            )
        value = scope[name]
        if not shell_words:
            return " ".join(map(str, value)) if isinstance(value, list) else str(value)
        if isinstance(value, list):
            return " ".join(shell.quote(v) for v in value)
        return shell.path(str(value)) if name in paths else shell.quote(value)

    return TEMPLATE.sub(sub, template)


def fill_argv(words: Sequence[str], scope: Mapping[str, object]) -> list[str]:
    """An argv with the values in (`fill`, verbatim): a word that is just a list parameter (the trainer
    overrides) splices in as that many words, so a local check sees exactly the words the workers get."""
    argv: list[str] = []
    for word in words:
        whole = TEMPLATE.fullmatch(word)
        value = scope.get(whole.group(1)) if whole else None
        if isinstance(value, list):
            argv.extend(map(str, value))
        else:
            argv.append(fill(word, scope))
    return argv


# A trainer key that names a credential: its value belongs in the workers' .env, never on a command line.
SECRET_KEY = re.compile(r"(^|[._])(token|secret|password|passwd|api_key|apikey|credentials?)($|[._])", re.I)


def trainer_override(key: str, value: object) -> str:
    """One trainer setting as the one argv word the trainer's strict `--set` parses (`--set=train.steps=20`,
    booleans lower case): whatever the value holds, it stays one word. A key naming a credential is exit 2:
    secrets travel in .env files, never on a command line (where `ps` and the run record would show them)."""
    if SECRET_KEY.search(key):
        raise UsageError(
            f"--set {key}=... names a secret: secrets never go on the trainer's command line",
            hint=f"put it in the .env file the SOP sends (`tpuops env`), not in --set {key}",
        )
    text = str(value).lower() if isinstance(value, bool) else str(value)
    return f"--set={key}={text}"


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""
