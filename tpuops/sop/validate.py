"""A SOP file's checks with their file and line: step kinds, pydantic's errors explained, trainer overrides and
templates checked against the parameters the SOP ends up with (loader.py composes; this says what is wrong where)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import yaml
from pydantic import BaseModel, ValidationError

from tpuops.errors import UsageError
from tpuops.sop.model import BUILTINS, TEMPLATE, TRAINER_KEY, Param, suggest
from tpuops.sop.procedure import STEP_KINDS, Sop

# libyaml's parser where PyYAML was built with it (the wheels are): the same documents and errors as the pure-Python
# SafeLoader at a fraction of the CPU (`tpuops sop list` reads every SOP and fragment; docs/performance.md).
Yaml = dict[str, object]  # a YAML mapping as the safe loader gives it
Loc = list[str | int]  # a path into a YAML document (pydantic's `loc`): keys and list indices
SAFE_LOADER: type[yaml.SafeLoader] | type[yaml.CSafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass
class Where:
    """Which file (and text, for line numbers) declared each parameter and each step, for error messages."""

    texts: dict[Path, str] = field(default_factory=dict)
    params: dict[str, Path] = field(default_factory=dict)
    raw: dict[str, object] = field(default_factory=dict)  # the merged declarations, as YAML gave them
    steps: list[tuple[Path, int]] = field(default_factory=list)  # (file, index in that file's steps)

    def at(self, path: Path, loc: Loc) -> str:
        return f"{path}:{line_of(self.texts[path], loc)}"


def check_kinds(path: Path, text: str, steps: list[object], index: list[int]) -> None:
    for step, i in zip(steps, index, strict=True):
        if isinstance(step, dict) and step.get("kind") in STEP_KINDS:
            continue
        line = line_of(text, ["steps", i])
        if isinstance(step, dict) and "kind" not in step:
            close = next(
                (suggest(str(k), ["kind", "include"]) for k in step if suggest(str(k), ["kind", "include"])),
                "",
            )
            raise UsageError(
                f"{path}:{line}: steps[{i}] needs kind: (a step) or include: (a fragment){close}"
            )
        kind = step.get("kind") if isinstance(step, dict) else None
        if kind not in STEP_KINDS:
            raise UsageError(
                f"{path}:{line}: steps[{i}] has unknown kind {kind!r}{suggest(str(kind), STEP_KINDS)}",
                hint=f"kinds: {', '.join(STEP_KINDS)}",
            )


def explain(
    path: Path, text: str, data: Yaml, err: ValidationError, index: list[int], model: type[BaseModel]
) -> str:
    e = err.errors()[0]
    loc = [p for p in e["loc"] if p not in STEP_KINDS]  # pydantic puts the union tag in the path
    if loc[:1] == ["steps"] and len(loc) > 1 and isinstance(loc[1], int):
        loc[1] = index[loc[1]]  # the entry's index in the file (includes left out before validation)
    line = line_of(text, loc)
    where = ".".join(str(p) for p in loc)
    if e["type"] == "extra_forbidden":
        key = str(loc[-1])
        return (
            f"{path}:{line}: unknown key {key!r} at {where}{suggest(key, _model_at(data, loc[:-1], model))}"
        )
    return f"{path}:{line}: {where}: {e['msg']} (received {e.get('input')!r})"


def _model_at(data: Yaml, loc: Loc, model: type[BaseModel]) -> list[str]:
    if loc[:1] == ["steps"] and len(loc) == 2:
        step = cast(list[Yaml], data["steps"])[cast(int, loc[1])]  # a step of a known kind (check_kinds)
        return list(STEP_KINDS[cast(str, step.get("kind"))].model_fields)
    if loc[:1] == ["params"] and len(loc) == 2:
        return list(Param.model_fields)
    return list(model.model_fields)


def check_overrides(sop: Sop, where: Where) -> None:
    """`overrides:` names a list parameter; `maps_to` names a trainer key (section.key), once, and needs it."""
    main = next(iter(where.texts))
    target = sop.params.get(sop.overrides or "")
    if sop.overrides and (target is None or target.type != "list"):
        raise UsageError(
            f"{where.at(main, ['overrides'])}: overrides: {sop.overrides!r} must name a list parameter"
            f"{suggest(sop.overrides, sop.params)}"
        )
    mapped: dict[str, str] = {}
    for name, p in sop.params.items():
        if p.maps_to is None:
            continue
        at = where.at(where.params[name], ["params", name, "maps_to"])
        if not TRAINER_KEY.fullmatch(p.maps_to):
            raise UsageError(
                f"{at}: params.{name}.maps_to: {p.maps_to!r} is not a trainer key (section.key, e.g. train.steps)"
            )
        if p.type == "list":
            raise UsageError(
                f"{at}: params.{name}.maps_to: a list parameter cannot stand for one trainer key"
            )
        if not sop.overrides:
            raise UsageError(
                f"{at}: params.{name}.maps_to needs `overrides:` naming the list parameter the trainer overrides go in"
            )
        if p.maps_to in mapped:
            raise UsageError(
                f"{at}: params.{name}.maps_to: {p.maps_to} is already the trainer key of {mapped[p.maps_to]!r}"
            )
        mapped[p.maps_to] = name


def check_templates(sop: Sop, where: Where) -> None:
    """Every `{name}` is a declared parameter (or a built-in); a `maps_to` one reaches the trainer only through
    the overrides list, never a template as well (one owner per setting)."""
    main = next(iter(where.texts))
    known = set(sop.params) | set(BUILTINS) | {"local_python"}

    def check(name: str, what: str) -> None:
        if name not in known:
            raise UsageError(
                f"{what} uses {{{name}}}, which is not a parameter{suggest(name, known)}",
                hint="declare it under params:",
            )
        if sop.params.get(name) and sop.params[name].maps_to:
            raise UsageError(
                f"{what} uses {{{name}}}, which maps to {sop.params[name].maps_to}: the trainer gets it through "
                f"{{{sop.overrides}}} (a template must not pass it a second way)"
            )

    for check_ in sop.preflight:
        for word in check_.argv:
            for m in TEMPLATE.finditer(word):
                check(m.group(1), f"{main}: preflight")
    if sop.fit is not None:
        for text in (sop.fit.config, sop.fit.sets or ""):
            for m in TEMPLATE.finditer(text):
                check(m.group(1), f"{main}: fit")
    for step, (path, i) in zip(sop.steps, where.steps, strict=True):
        for fname in step.template_fields:
            for text in _strings(getattr(step, fname)):
                for m in TEMPLATE.finditer(text):
                    check(m.group(1), f"{path}: steps[{i}].{fname}")


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [v for v in value.values() if isinstance(v, str)]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []


def line_of(text: str, loc: Loc) -> int:
    """1-based line of the node at `loc` in the YAML text (the closest ancestor that exists)."""
    node = yaml.compose(text, Loader=SAFE_LOADER)
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
    return node.start_mark.line + 1 if node is not None else 1
