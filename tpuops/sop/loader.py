"""YAML -> validated Sop: unknown keys and kinds rejected with file, line and a close-match suggestion;
`extends:` and `- include:` fragments resolved, every parameter and template checked."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import cast

import yaml
from pydantic import BaseModel, ValidationError

from tpuops.errors import UsageError
from tpuops.sop.model import Step, suggest
from tpuops.sop.procedure import STEP_KINDS, Fragment, Include, Sop, Validate
from tpuops.sop.validate import (
    SAFE_LOADER,
    Where,
    Yaml,
    check_kinds,
    check_overrides,
    check_templates,
    explain,
    line_of,
)

__all__ = [
    "STEP_KINDS", "Sop", "Validate", "find", "list_sops", "load", "scan_sops", "search_dirs", "sops_dir",
    "user_sops_dir",
]  # fmt: skip

FRAGMENTS = "fragments"  # sops/fragments/: files SOPs include, never listed or run as SOPs


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
    check_overrides(sop, where)
    check_templates(sop, where)
    return sop


def _read(path: Path, shape: str) -> tuple[str, Yaml]:
    text = path.read_text()
    try:
        data = yaml.load(text, Loader=SAFE_LOADER)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise UsageError(f"{path}{line}: invalid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path}: {shape}")
    return text, data


def _extend(path: Path, data: Yaml) -> Yaml:
    """`extends: NAME`: start from that SOP's YAML; params merge by name, other keys replace."""
    name = str(data["extends"])
    # A user SOP may extend the built-in it shadows (sops/recompile-check.yaml: `extends: recompile-check`).
    own = path.stem == name and path.parent.resolve() != sops_dir().resolve()
    base_path = find(name, [sops_dir()] if own else [path.parent, sops_dir()])
    base = yaml.load(base_path.read_text(), Loader=SAFE_LOADER)
    if "extends" in base:
        base = _extend(base_path, base)
    child = {k: v for k, v in data.items() if k != "extends"}
    params = dict(base.get("params") or {})
    overrides = cast(
        dict[str, Yaml], child.pop("params", None) or {}
    )  # a mapping of mappings, as YAML gave it
    for name, override in overrides.items():
        params[name] = {**params.get(name, {}), **override}
    return {**base, **child, "params": params}


def _compose(
    path: Path, text: str, data: Yaml, model: type[BaseModel], stack: tuple[Path, ...]
) -> tuple[BaseModel, Where]:
    """Validate one file (a SOP or a fragment) and splice in its includes: a fragment's params join this
    file's, its steps take the place of the `- include:` entry."""
    where = Where(texts={path: text})
    entries = data.get("steps")
    slots: list[int | tuple[BaseModel, Where]] = []  # per entry: an own step's index, or a fragment
    own: list[object] = []
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
    check_kinds(path, text, own, own_index)
    body = dict(data)
    if isinstance(entries, list):
        body["steps"] = own
    if isinstance(params, dict):  # else pydantic names what is wrong with it
        body["params"] = where.raw
    try:
        result = model.model_validate(body)
    except ValidationError as e:
        raise UsageError(explain(path, text, data, e, own_index, model)) from None
    steps: list[Step] = []
    for slot in slots:
        if isinstance(slot, int):
            steps.append(result.steps[slot])  # type: ignore[attr-defined]
            where.steps.append((path, own_index[slot]))
        else:
            steps.extend(slot[0].steps)  # type: ignore[attr-defined]
            where.steps.extend(slot[1].steps)
    return result.model_copy(update={"steps": steps}), where


def _include(path: Path, text: str, i: int, entry: Yaml, stack: tuple[Path, ...]) -> tuple[BaseModel, Where]:
    """The fragment a `- include: NAME` entry names, loaded (with its own includes) and validated."""
    at = f"{path}:{line_of(text, ['steps', i])}"
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


def _merge_param(where: Where, name: str, decl: object, path: Path, text: str) -> None:
    """A parameter declared by this file or an included fragment. Declared again, it must keep its type;
    the including file may refine the rest (a default, a description), fragments must agree."""
    before = where.raw.get(name)
    if before is None or not isinstance(decl, dict) or not isinstance(before, dict):
        where.raw[name], where.params[name] = decl, path
        return
    first = where.params[name]
    at = f"{path}:{line_of(text, ['params', name])}"
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
