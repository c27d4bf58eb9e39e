"""YAML -> validated Sop: unknown keys and kinds rejected with file, line and a close-match suggestion;
`extends:` and `- include:` fragments resolved, every parameter and template checked."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from tpuops.errors import UsageError
from tpuops.sop.model import BUILTINS, TEMPLATE, TRAINER_KEY, Param, Step, suggest
from tpuops.sop.procedure import STEP_KINDS, Fragment, Include, Sop, Validate

__all__ = [
    "STEP_KINDS", "Sop", "Validate", "find", "list_sops", "load", "scan_sops", "search_dirs", "sops_dir",
    "user_sops_dir",
]  # fmt: skip

FRAGMENTS = "fragments"  # sops/fragments/: files SOPs include, never listed or run as SOPs
# libyaml's parser where PyYAML was built with it (the wheels are): the same documents and errors as the pure-Python
# SafeLoader at a fraction of the CPU (`tpuops sop list` reads every SOP and fragment; docs/performance.md).
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def sops_dir() -> Path:
    """The built-in SOPs: package data (tpuops/sops/, fragments in tpuops/sops/fragments/), found through
    importlib.resources, so a wheel or a non-editable install has them as a checkout does."""
    root = resources.files("tpuops") / "sops"
    if not isinstance(root, Path):  # the package imported from a zip: no folder to list or include from
        raise UsageError(f"the built-in SOPs are not on the file system ({root}): install tpuops unzipped")
    return root


def user_sops_dir(cwd: Path | None = None) -> Path | None:
    """The user's SOP folder: `sops_dir` in the project's tpuops.toml or the user's own config (relative to the
    file that names it), else `sops/` of the nearest folder from `cwd` up to the repository root (as tpuops.toml
    is found: config.search_up), refused when another user owns or can write it; None when there is neither."""
    from tpuops import config

    cwd = (cwd or Path.cwd()).resolve()
    named = config.load(cwd).sops_dir
    if named:
        namer = next(p for p in reversed(config.config_paths(cwd)) if p.is_file() and _names_sops_dir(p))
        return (namer.parent / Path(named).expanduser()).resolve()
    found = next((d / "sops" for d in config.search_up(cwd) if (d / "sops").is_dir()), None)
    if found is not None:
        config.refuse_untrusted(found, "SOPs")
    return found


def _names_sops_dir(path: Path) -> bool:
    import tomllib

    return "sops_dir" in tomllib.loads(path.read_text())


def search_dirs(cwd: Path | None = None) -> list[Path]:
    """Where SOP names are looked up, first match wins: the user's folder, then the bundled SOPs."""
    user, bundled = user_sops_dir(cwd), sops_dir()
    if user is None or user.resolve() == bundled.resolve():
        return [bundled]
    return [user, bundled]


def find(name: str, search: list[Path] | None = None) -> Path:
    """A SOP by name (in the user's sops/, then the bundled ones: search_dirs) or by path."""
    p = Path(name)
    if p.suffix in {".yaml", ".yml"} and p.exists():
        return p
    dirs = search or search_dirs()
    for d in dirs:
        for ext in (".yaml", ".yml"):
            if (d / f"{name}{ext}").exists():
                return d / f"{name}{ext}"
    known = sorted({f.stem for d in dirs if d.is_dir() for f in d.glob("*.y*ml")})
    raise UsageError(f"no SOP named {name!r}{suggest(name, known)}", hint=f"known: {', '.join(known)}")


def load(path: Path) -> Sop:
    """A SOP file, validated, with what it extends and includes put in."""
    if path.parent.name == FRAGMENTS:
        raise UsageError(
            f"{path}: a fragment (steps and params SOPs include), not a SOP",
            hint="run a SOP that has `- include: " + path.stem + "` among its steps",
        )
    text, data = _read(path, "a SOP file is a mapping with name, description, params and steps")
    if "extends" in data:
        data = _extend(path, data)
    sop, where = _compose(path, text, data, Sop, (path.resolve(),))
    assert isinstance(sop, Sop)
    _check_overrides(sop, where)
    _check_templates(sop, where)
    return sop


def _read(path: Path, shape: str) -> tuple[str, dict]:
    text = path.read_text()
    try:
        data = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{path}{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: {shape}")
    return text, data


def _extend(path: Path, data: dict) -> dict:
    """`extends: NAME`: start from that SOP's YAML; params merge by name, other keys replace."""
    name = str(data["extends"])
    # A user SOP may extend the built-in it shadows (sops/recompile-check.yaml: `extends: recompile-check`).
    own = path.stem == name and path.parent.resolve() != sops_dir().resolve()
    base_path = find(name, [sops_dir()] if own else [path.parent, sops_dir()])
    base = yaml.load(base_path.read_text(), Loader=_SAFE_LOADER)
    if "extends" in base:
        base = _extend(base_path, base)
    child = {k: v for k, v in data.items() if k != "extends"}
    params = dict(base.get("params") or {})
    for name, override in (child.pop("params", None) or {}).items():
        params[name] = {**params.get(name, {}), **override}
    return {**base, **child, "params": params}


@dataclass
class _Where:
    """Which file (and text, for line numbers) declared each parameter and each step, for error messages."""

    texts: dict[Path, str] = field(default_factory=dict)
    params: dict[str, Path] = field(default_factory=dict)
    raw: dict[str, dict] = field(default_factory=dict)  # the merged declarations, as YAML gave them
    steps: list[tuple[Path, int]] = field(default_factory=list)  # (file, index in that file's steps)

    def at(self, path: Path, loc: list) -> str:
        return f"{path}:{_line(self.texts[path], loc)}"


def _compose(
    path: Path, text: str, data: dict, model: type[BaseModel], stack: tuple[Path, ...]
) -> tuple[BaseModel, _Where]:
    """Validate one file (a SOP or a fragment) and splice in its includes: a fragment's params join this
    file's, its steps take the place of the `- include:` entry."""
    where = _Where(texts={path: text})
    entries = data.get("steps")
    slots: list[int | tuple[BaseModel, _Where]] = []  # per entry: an own step's index, or a fragment
    own: list[Any] = []
    own_index: list[int] = []  # own step -> its index among the file's entries
    for i, entry in enumerate(entries if isinstance(entries, list) else []):
        if isinstance(entry, dict) and "include" in entry and "kind" not in entry:
            frag, inner = _include(path, text, i, entry, stack)
            for name, decl in inner.raw.items():
                _merge_param(where, name, decl, inner.params[name], inner.texts[inner.params[name]])
            where.texts.update(inner.texts)
            slots.append((frag, inner))
        else:
            slots.append(len(own))
            own.append(entry)
            own_index.append(i)
    params = data.get("params") or {}
    for name, decl in params.items() if isinstance(params, dict) else []:
        _merge_param(where, name, decl, path, text)
    _check_kinds(path, text, own, own_index)
    body = dict(data)
    if isinstance(entries, list):
        body["steps"] = own
    if isinstance(params, dict):  # else pydantic names what is wrong with it
        body["params"] = where.raw
    try:
        result = model.model_validate(body)
    except ValidationError as e:
        raise UsageError(_explain(path, text, data, e, own_index, model)) from None
    steps: list[Step] = []
    for slot in slots:
        if isinstance(slot, int):
            steps.append(result.steps[slot])  # type: ignore[attr-defined]
            where.steps.append((path, own_index[slot]))
        else:
            steps.extend(slot[0].steps)  # type: ignore[attr-defined]
            where.steps.extend(slot[1].steps)
    return result.model_copy(update={"steps": steps}), where


def _include(path: Path, text: str, i: int, entry: dict, stack: tuple[Path, ...]) -> tuple[BaseModel, _Where]:
    """The fragment a `- include: NAME` entry names, loaded (with its own includes) and validated."""
    at = f"{path}:{_line(text, ['steps', i])}"
    for key in entry:
        if key not in Include.model_fields:
            raise UsageError(f"{at}: unknown key {key!r} at steps.{i}.{key}{suggest(str(key), ['include'])}")
    name = entry["include"]
    if not isinstance(name, str) or not name:
        raise UsageError(f"{at}: steps.{i}.include: a fragment name, received {name!r}")
    frag_path = _find_fragment(path, name, at)
    if frag_path.resolve() in stack:
        cycle = " -> ".join(p.name for p in (*stack, frag_path.resolve()))
        raise UsageError(f"{at}: include cycle: {cycle}")
    frag_text, frag_data = _read(frag_path, "a fragment is a mapping with params and steps")
    return _compose(frag_path, frag_text, frag_data, Fragment, (*stack, frag_path.resolve()))


def _find_fragment(path: Path, name: str, at: str) -> Path:
    """NAME: fragments/NAME.yaml beside the including SOP (or beside the including fragment), then the
    bundled sops/fragments/; a name ending in .yaml is a path relative to the including file."""
    if name.endswith((".yaml", ".yml")):
        found = path.parent / name
        if found.is_file():
            return found
        raise UsageError(f"{at}: include {name!r}: file not found ({found})")
    dirs = [path.parent / FRAGMENTS, *([path.parent] if path.parent.name == FRAGMENTS else [])]
    dirs.append(sops_dir() / FRAGMENTS)
    for d in dirs:
        if (d / f"{name}.yaml").is_file():
            return d / f"{name}.yaml"
    known = sorted({f.stem for d in dirs if d.is_dir() for f in d.glob("*.yaml")})
    raise UsageError(
        f"{at}: no fragment named {name!r}{suggest(name, known)}",
        hint=f"fragments: {', '.join(known) or 'none'} (in {dirs[0]} or {dirs[-1]})",
    )


def _merge_param(where: _Where, name: str, decl: Any, path: Path, text: str) -> None:
    """A parameter declared by this file or an included fragment. Declared again, it must keep its type;
    the including file may refine the rest (a default, a description), fragments must agree."""
    before = where.raw.get(name)
    if before is None or not isinstance(decl, dict) or not isinstance(before, dict):
        where.raw[name], where.params[name] = decl, path
        return
    first = where.params[name]
    at = f"{path}:{_line(text, ['params', name])}"
    if "type" in decl and decl["type"] != before.get("type", "str"):
        raise UsageError(
            f"{at}: parameter {name!r} is declared as {decl['type']} here and as "
            f"{before.get('type', 'str')} in {first}"
        )
    own = path == next(iter(where.texts))  # the including file itself, not one more fragment
    if not own and decl.get("default") != before.get("default"):
        raise UsageError(
            f"{at}: parameter {name!r} has default {decl.get('default')!r} here and "
            f"{before.get('default')!r} in {first}",
            hint="declare it in one fragment only, or give both the same default",
        )
    where.raw[name] = {**before, **decl}
    if own:
        where.params[name] = path


def _check_kinds(path: Path, text: str, steps: list, index: list[int]) -> None:
    for step, i in zip(steps, index, strict=True):
        if isinstance(step, dict) and step.get("kind") in STEP_KINDS:
            continue
        line = _line(text, ["steps", i])
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


def _explain(path: Path, text: str, data: dict, err: ValidationError, index: list[int], model: type) -> str:
    e = err.errors()[0]
    loc = [p for p in e["loc"] if p not in STEP_KINDS]  # pydantic puts the union tag in the path
    if loc[:1] == ["steps"] and len(loc) > 1 and isinstance(loc[1], int):
        loc[1] = index[loc[1]]  # the entry's index in the file (includes left out before validation)
    line = _line(text, loc)
    where = ".".join(str(p) for p in loc)
    if e["type"] == "extra_forbidden":
        key = str(loc[-1])
        return (
            f"{path}:{line}: unknown key {key!r} at {where}{suggest(key, _model_at(data, loc[:-1], model))}"
        )
    return f"{path}:{line}: {where}: {e['msg']} (received {e.get('input')!r})"


def _model_at(data: dict, loc: list, model: type[BaseModel]) -> list[str]:
    if loc[:1] == ["steps"] and len(loc) == 2:
        kind = data["steps"][loc[1]].get("kind")
        return list(STEP_KINDS[kind].model_fields)
    if loc[:1] == ["params"] and len(loc) == 2:
        return list(Param.model_fields)
    return list(model.model_fields)


def _check_overrides(sop: Sop, where: _Where) -> None:
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


def _check_templates(sop: Sop, where: _Where) -> None:
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


def _line(text: str, loc: list) -> int:
    """1-based line of the node at `loc` in the YAML text (the closest ancestor that exists)."""
    node = yaml.compose(text, Loader=_SAFE_LOADER)
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


def list_sops() -> list[tuple[str, str, str, str]]:
    """(name, description, path, origin) of every valid SOP: the user's sops/, then the bundled ones (the first
    of a name wins)."""
    return scan_sops()[0]


def scan_sops(
    cwd: Path | None = None,
) -> tuple[list[tuple[str, str, str, str]], list[tuple[str, str]], int]:
    """The valid SOPs as list_sops() gives them, (path, error line) of each file that does not load, and the
    exit code of `tpuops sop list` (2 when a file is broken: bad input). `origin` is `user`, `user (shadows
    the built-in)` or `built-in`."""
    rows: dict[str, tuple[str, str, str, str]] = {}
    broken: list[tuple[str, str]] = []
    dirs = search_dirs(cwd)
    for d in dirs:
        builtin = d == dirs[-1]
        for f in sorted(d.glob("*.yaml")) if d.is_dir() else []:
            if f.stem in rows:
                name, desc, path, _ = rows[f.stem]
                if builtin:  # a user SOP of this name wins; say so
                    rows[f.stem] = (name, desc, path, "user (shadows the built-in)")
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
                "built-in" if builtin else "user",
            )
    return sorted(rows.values()), broken, 2 if broken else 0
