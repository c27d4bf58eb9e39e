"""YAML -> validated Sop: unknown keys and kinds rejected with file, line and a close-match suggestion."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, ValidationError

from tpuops.errors import UsageError
from tpuops.sop.model import BUILTINS, TEMPLATE, Frozen, Param
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


class Fit(Frozen):
    """Before a run on a VM: the trainer config compiled ahead of time for the VM's accelerator type (tpuops fit)."""

    config: str
    sets: str | None = None  # a list parameter of trainer overrides (`--set=k=v` items)


class Sop(Frozen):
    """A procedure: parameters with defaults and an ordered list of typed steps."""

    name: str
    description: str = ""
    params: dict[str, Param] = {}
    # Dotted --set keys (train.lr=1e-5) are collected into this list parameter as `key=value` items.
    overrides: str | None = None
    preflight: list[Validate] = []
    fit: Fit | None = None
    scan: Scan | None = None
    steps: list[AnyStep]

    def resolve(self, sets: dict[str, str], defaults: dict[str, Any] | None = None) -> dict[str, object]:
        """Typed parameter values: --set beats user-config defaults beats the SOP's own defaults."""
        sets = dict(sets)
        if self.overrides:
            dotted = [f"{k}={v}" for k, v in sets.items() if "." in k]
            sets = {k: v for k, v in sets.items() if "." not in k}
            if dotted:
                # `--set=k=v` items: one argv word each, whatever the value holds.
                sets[self.overrides] = [f"--set={d}" for d in dotted]  # type: ignore[assignment]
        for key in sets:
            if key not in self.params:
                hint = _suggest(key, self.params) or f" (parameters: {', '.join(self.params) or 'none'})"
                if self.overrides:
                    hint += "; trainer settings take a dot: --set train.steps=20"
                raise UsageError(f"unknown parameter {key!r} for SOP {self.name}{hint}")
        values: dict[str, object] = {}
        for name, p in self.params.items():
            if name in sets:
                raw = sets[name]
            elif defaults and defaults.get(name) is not None:
                raw = defaults[name]
            elif p.default is not None:
                raw = p.default
            else:
                raise UsageError(
                    f"SOP {self.name} needs parameter {name!r} ({p.description or p.type})",
                    hint=f"pass --set {name}=... or set it in tpuops.toml",
                )
            values[name] = p.coerce(name, raw)
        return values


def sops_dir() -> Path:
    """The bundled SOPs (the repository's sops/ folder, next to the tpuops package)."""
    return Path(__file__).resolve().parents[2] / "sops"


def find(name: str, search: list[Path] | None = None) -> Path:
    """A SOP by name (in ./sops, then the bundled ones) or by path."""
    p = Path(name)
    if p.suffix in {".yaml", ".yml"} and p.exists():
        return p
    dirs = search or [Path.cwd() / "sops", sops_dir()]
    for d in dirs:
        for ext in (".yaml", ".yml"):
            if (d / f"{name}{ext}").exists():
                return d / f"{name}{ext}"
    known = sorted({f.stem for d in dirs if d.is_dir() for f in d.glob("*.y*ml")})
    raise UsageError(f"no SOP named {name!r}{_suggest(name, known)}", hint=f"known: {', '.join(known)}")


def load(path: Path) -> Sop:
    text = path.read_text()
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{path}{where}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: a SOP file is a mapping with name, description, params and steps")
    if "extends" in data:
        data = _extend(path, data)
    _check_kinds(path, text, data)
    try:
        sop = Sop.model_validate(data)
    except ValidationError as e:
        raise UsageError(_explain(path, text, data, e)) from None
    _check_templates(path, sop)
    return sop


def _extend(path: Path, data: dict) -> dict:
    """`extends: NAME`: start from that SOP's YAML; params merge by name, other keys replace."""
    base_path = find(str(data["extends"]), [path.parent, sops_dir()])
    base = yaml.safe_load(base_path.read_text())
    if "extends" in base:
        base = _extend(base_path, base)
    child = {k: v for k, v in data.items() if k != "extends"}
    params = dict(base.get("params") or {})
    for name, override in (child.pop("params", None) or {}).items():
        params[name] = {**params.get(name, {}), **override}
    return {**base, **child, "params": params}


def _check_kinds(path: Path, text: str, data: dict) -> None:
    for i, step in enumerate(data.get("steps") or []):
        kind = step.get("kind") if isinstance(step, dict) else None
        if kind not in STEP_KINDS:
            line = _line(text, ["steps", i])
            raise UsageError(
                f"{path}:{line}: steps[{i}] has unknown kind {kind!r}{_suggest(str(kind), STEP_KINDS)}",
                hint=f"kinds: {', '.join(STEP_KINDS)}",
            )


def _explain(path: Path, text: str, data: dict, err: ValidationError) -> str:
    e = err.errors()[0]
    loc = [p for p in e["loc"] if p not in STEP_KINDS]  # pydantic puts the union tag in the path
    line = _line(text, loc)
    where = ".".join(str(p) for p in loc)
    if e["type"] == "extra_forbidden":
        key = str(loc[-1])
        model = _model_at(data, loc[:-1])
        return f"{path}:{line}: unknown key {key!r} at {where}{_suggest(key, model)}"
    return f"{path}:{line}: {where}: {e['msg']} (received {e.get('input')!r})"


def _model_at(data: dict, loc: list) -> list[str]:
    if loc[:1] == ["steps"] and len(loc) == 2:
        kind = data["steps"][loc[1]].get("kind")
        return list(STEP_KINDS[kind].model_fields)
    if loc[:1] == ["params"] and len(loc) == 2:
        return list(Param.model_fields)
    return list(Sop.model_fields)


def _check_templates(path: Path, sop: Sop) -> None:
    known = set(sop.params) | set(BUILTINS) | {"local_python"}
    for check in sop.preflight:
        for word in check.argv:
            for m in TEMPLATE.finditer(word):
                if m.group(1) not in known:
                    raise UsageError(f"{path}: preflight uses {{{m.group(1)}}}, which is not a parameter")
    for i, step in enumerate(sop.steps):
        for fname in step.template_fields:
            for text in _strings(getattr(step, fname)):
                for m in TEMPLATE.finditer(text):
                    if m.group(1) not in known:
                        raise UsageError(
                            f"{path}: steps[{i}].{fname} uses {{{m.group(1)}}}, which is not a parameter"
                            f"{_suggest(m.group(1), known)}",
                            hint="declare it under params:",
                        )


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, str)]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def _line(text: str, loc: list) -> int:
    """1-based line of the node at `loc` in the YAML text (the closest ancestor that exists)."""
    node = yaml.compose(text)
    for i, part in enumerate(loc):
        if isinstance(node, yaml.MappingNode):
            pair = next(((k, v) for k, v in node.value if k.value == part), None)
            if pair is None:
                break
            node = pair[0] if i == len(loc) - 1 else pair[1]  # an unknown key: point at the key itself
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
        else:
            break
    return node.start_mark.line + 1


def _suggest(word: str, options: Any) -> str:
    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""


def list_sops() -> list[tuple[str, str, str]]:
    """(name, description, path) of every valid SOP in ./sops and the bundled sops/ (the first of a name wins)."""
    return scan_sops()[0]


def scan_sops() -> tuple[list[tuple[str, str, str]], list[tuple[str, str]]]:
    """The valid SOPs as list_sops() gives them, and (path, error line) of each file that does not load."""
    rows: dict[str, tuple[str, str, str]] = {}
    broken: list[tuple[str, str]] = []
    for d in [Path.cwd() / "sops", sops_dir()]:
        for f in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            if f.stem in rows:
                continue
            try:
                sop = load(f)
            except UsageError as e:
                broken.append((str(f), e.line()))
                continue
            rows[f.stem] = (
                f.stem,
                sop.description.strip().splitlines()[0] if sop.description else "",
                str(f),
            )
    return sorted(rows.values()), broken
