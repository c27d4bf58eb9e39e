"""What the user asked for: tpuops.toml (project, then ~/.config/tpuops/config.toml), the target options
they default (TargetSpec), and the state home with its atomic writes."""

from __future__ import annotations

import difflib
import os
import re
import tempfile
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

from tpuops.errors import UsageError


class TargetSettings(BaseModel):
    """The target settings tpuops.toml and the CLI's target options share, one name each. None means "not
    given": a flag given either way (`--internal-ip` / `--no-internal-ip`) wins over the file, the file over
    the default. Strict: a file's `internal_ip = "no"` is an error, not a true string."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)

    vm: str | None = None
    zone: str | None = None
    project: str | None = None
    user: str | None = None
    identity: str | None = None
    api_endpoint: str | None = None
    internal_ip: bool | None = None  # connect to the workers' internal IPs
    tunnel_through_iap: bool | None = None
    key_push: bool | None = None  # False: never change a VM's ssh-keys metadata (default True)
    key_ttl: float | None = Field(default=None, gt=0)  # OS Login: the imported key expires after this (s)


class UserConfig(TargetSettings):
    """tpuops.toml (the project's over the user's): target defaults, and `params`, SOP parameter defaults
    (repo_url, branch, ...), so short commands work."""

    parallel: int = Field(default=16, ge=1)
    unreachable_s: float = Field(
        default=300.0, gt=0
    )  # a VM none of whose workers answers on SSH this long is lost
    sops_dir: str | None = None  # the user's SOP folder, relative to the tpuops.toml that names it
    api: Literal["tpu", "compute"] | None = None  # `vm create`'s API for v5e/v5p/v6e (TPU7x: always compute)
    params: dict[str, Any] = Field(default_factory=dict)
    # Where each `params` key was set, `file:line` (the file that won): what a [params] error points at.
    _params_at: dict[str, str] = PrivateAttr(default_factory=dict)

    def param_at(self, key: str) -> str:
        """`file:line` of a [params] key (`tpuops.toml` when the config was not read from a file)."""
        return self._params_at.get(key, "tpuops.toml")


def state_home() -> Path:
    """Where tpuops keeps known_hosts, local run copies and the local transport's scratch root."""
    return Path(os.environ.get("TPUOPS_HOME") or Path.home() / ".tpuops")


def untrusted(path: Path) -> str | None:
    """Why settings or SOPs at `path` must not be taken unasked, or None when they may: as git's
    safe.directory, only what this user (or root) owns and no other user can write."""
    try:
        st = path.stat()
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if st.st_uid not in (os.geteuid(), 0):
        import pwd

        try:
            owner = pwd.getpwuid(st.st_uid).pw_name
        except KeyError:
            owner = f"uid {st.st_uid}"
        return f"owned by {owner}"
    if st.st_mode & 0o002:
        return "writable by every user"
    return None


def search_up(cwd: Path) -> list[Path]:
    """Where tpuops.toml and sops/ are looked for, nearest first: `cwd` and the folders above it up to the
    repository's root (the nearest folder with a .git), never into a folder another user owns or can write (a
    shared /tmp, another user's project): what they hold was not put there by this user."""
    found: list[Path] = []
    for d in [cwd, *cwd.parents]:
        if untrusted(d) is not None:
            break
        found.append(d)
        if (d / ".git").exists():
            break
    return found


def refuse_untrusted(path: Path, what: str) -> None:
    """Exit 2 when `path`, found on the way up, is another user's or writable by every user."""
    why = untrusted(path)
    if why is not None:
        trust = "tpuops --config PATH" if what == "settings" else "sops_dir in your own tpuops.toml"
        raise UsageError(
            f"{path}: {why}: tpuops takes {what} only from files this user owns",
            hint=f"to use it anyway, name it yourself ({trust}), or make it yours (chown, chmod o-w)",
        )


def project_file(cwd: Path | None = None) -> Path | None:
    """The project's tpuops.toml: the one `tpuops --config PATH` named (TPUOPS_CONFIG), else the nearest one
    on the way up from `cwd` to the repository root (search_up), refused when another user owns or can write it."""
    named = os.environ.get("TPUOPS_CONFIG")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            raise UsageError(f"--config {named}: no such file", hint="name an existing tpuops.toml")
        return path
    cwd = (cwd or Path.cwd()).resolve()
    found = next((d / "tpuops.toml" for d in search_up(cwd) if (d / "tpuops.toml").is_file()), None)
    if found is not None:
        refuse_untrusted(found, "settings")
    return found


def config_paths(cwd: Path | None = None) -> list[Path]:
    """The files read, lowest precedence first: the user file, then the nearest project tpuops.toml."""
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    paths = [xdg / "tpuops" / "config.toml"]
    project = project_file(cwd)
    return [*paths, project] if project else paths


def load(cwd: Path | None = None) -> UserConfig:
    """The project file over the user file, each checked against UserConfig where it is read: an unknown key
    or a value of the wrong type is exit 2 naming the file, the line, the key and what it expects."""
    merged: dict[str, Any] = {"params": {}}
    params_at: dict[str, str] = {}
    for path in config_paths(cwd):
        if not path.is_file():
            continue
        text = _read_text(path)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{path}: invalid TOML: {e}") from None
        _spellings(path, text, data)
        _check(path, text, data)
        params = {**merged["params"], **data.get("params", {})}
        params_at.update({k: f"{path}:{_param_line(text, k)}" for k in data.get("params", {})})
        merged.update(data)
        merged["params"] = params
    cfg = UserConfig(**merged)
    cfg._params_at = params_at
    return cfg


def _read_text(path: Path) -> str:
    """A TOML file's text: UTF-8, as TOML defines it (a UTF-8 byte-order mark is dropped). Any other encoding
    (UTF-16 from an editor on Windows, a Latin-1 byte) or an unreadable file is exit 2 naming the file."""
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UsageError(f"{path}: cannot be read ({e.strerror or e})") from None
    bom = data[:2] in (b"\xff\xfe", b"\xfe\xff")
    if bom or b"\x00" in data:  # UTF-16: its byte-order mark, or the NUL bytes of its ASCII characters
        raise UsageError(
            f"{path}: is UTF-16 text{'' if bom else ' (it holds NUL bytes)'}; a TOML file is UTF-8",
            hint=f"save it as UTF-8 (e.g. iconv -f UTF-16 -t UTF-8 {path.name} > {path.name}.new)",
        )
    try:
        return data.removeprefix(b"\xef\xbb\xbf").decode()
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise UsageError(
            f"{path}:{line}: byte {e.start} (0x{data[e.start]:02x}) is not UTF-8; a TOML file is UTF-8",
            hint=f"save it as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 {path.name} > {path.name}.new)",
        ) from None


def _spellings(path: Path, text: str, data: dict[str, Any]) -> None:
    """`key_ttl` as the --key-ttl flag takes it (seconds, or `30m`, `12h`, `7d`); `key_ttl_s`, its older name,
    still read (in seconds)."""
    if "key_ttl_s" in data:
        if "key_ttl" in data:
            raise UsageError(
                f"{path}:{_line(text, 'key_ttl_s')}: key_ttl_s is the older name of key_ttl: keep one"
            )
        data["key_ttl"] = data.pop("key_ttl_s")
    if isinstance(data.get("key_ttl"), str):
        data["key_ttl"] = float(parse_duration(f"{path}:{_line(text, 'key_ttl')}: key_ttl", data["key_ttl"]))


_TYPES = {
    "bool": "true or false",
    "int": "a whole number",
    "float": "a number",
    "str": "a quoted string",
    "dict": "a table",
}


def _check(path: Path, text: str, data: dict[str, Any]) -> None:
    valid = list(UserConfig.model_fields)
    for key in data:
        if key not in valid:
            close = difflib.get_close_matches(key, valid, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UsageError(
                f"{path}:{_line(text, key)}: unknown key {key!r}{hint}",
                hint=f"valid keys: {', '.join(valid)}",
            )
    _check_values(path, text, data)
    try:
        UserConfig(**data)
    except ValidationError as e:
        first = e.errors()[0]
        key = ".".join(str(p) for p in first["loc"][:1])
        field = UserConfig.model_fields[key]
        expected = " or ".join(
            _TYPES.get(t, t) for t in re.findall(r"\b(bool|int|float|str|dict)\b", str(field.annotation))
        )
        raise UsageError(
            f"{path}:{_line(text, key)}: {key} = {data[key]!r}: {first['msg'].lower()}",
            hint=f"{key} takes {expected or first['type']}",
        ) from None


def _line(text: str, key: str) -> int:
    """The line where a top-level key is set (1 when it cannot be told: a dotted or inline form)."""
    head = re.compile(rf"^\s*(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')\s*=")
    table = re.compile(rf"^\s*\[\s*{re.escape(key)}\s*\]")
    in_table = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("["):
            if table.match(line):
                return n
            in_table = True
        elif not in_table and head.match(line):
            return n
    return 1


def _param_line(text: str, key: str) -> int:
    """The line where a [params] key is set: under `[params]`, or dotted (`params.key = ...`); 1 when it cannot
    be told (an inline table)."""
    name = rf"(?:{re.escape(key)}|\"{re.escape(key)}\"|'{re.escape(key)}')"
    inside, dotted = re.compile(rf"^\s*{name}\s*="), re.compile(rf"^\s*params\s*\.\s*{name}\s*=")
    in_params = False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("["):
            in_params = re.match(r"^\s*\[\s*params\s*\]", line) is not None
        elif (in_params and inside.match(line)) or (not in_params and dotted.match(line)):
            return n
    return 1


def _given(*values: bool | None, default: bool) -> bool:
    """The first value that was given (not None), else the default."""
    return next((v for v in values if v is not None), default)


def _check_values(path: Path, text: str, data: dict[str, Any]) -> None:
    """Names by the API's rules, numbers by sign and finiteness (tpuops.validators), before anything runs."""
    from tpuops import validators

    def where(key: str) -> str:
        return f"{path}:{_line(text, key)}: {key}"

    for kind in ("vm", "zone", "project"):
        if kind in data:
            validators.name(kind, data[kind], where(kind))
    if "parallel" in data:
        validators.number(data["parallel"], where("parallel"), minimum=1, above=False, integer=True)
    if "unreachable_s" in data:
        validators.number(data["unreachable_s"], where("unreachable_s"), minimum=1, above=False)
    if "key_ttl" in data:
        validators.number(data["key_ttl"], where("key_ttl"))


@dataclass(frozen=True)
class TargetSpec:
    """Where to run. Exactly one of: local (default), hosts, vm. The shared settings (TargetSettings) are None
    when not given; `with_defaults` fills them from the config and the defaults."""

    local: bool = False
    local_workers: int = 1
    hosts: tuple[str, ...] = ()
    hostkey: tuple[str, ...] = ()  # --hostkey, one fingerprint per host
    user: str | None = None
    identity: str | None = None
    vm: str | None = None
    zone: str | None = None
    project: str | None = None
    internal_ip: bool | None = None
    api_endpoint: str | None = None
    connect_timeout: float = 10.0
    tunnel_through_iap: bool | None = None
    key_push: bool | None = (
        None  # False: never change a VM's ssh-keys metadata (fail when the key is missing)
    )
    key_ttl: float | None = None  # OS Login: the imported key expires after this long

    @property
    def kind(self) -> str:
        if self.vm:
            return "vm"
        return "ssh" if self.hosts else "local"

    def with_defaults(self, cfg: UserConfig) -> TargetSpec:
        """Fill what the user left out from the config file (an explicit --local or --host wins; a flag given
        either way wins over the file)."""
        vm = self.vm or (None if self.local or self.hosts else cfg.vm)
        return TargetSpec(
            local=self.local,
            local_workers=self.local_workers,
            hosts=self.hosts,
            hostkey=self.hostkey,
            user=self.user or cfg.user,
            identity=self.identity or cfg.identity,
            vm=vm,
            zone=self.zone or cfg.zone,
            project=self.project or cfg.project,
            internal_ip=_given(self.internal_ip, cfg.internal_ip, default=False),
            api_endpoint=self.api_endpoint or cfg.api_endpoint,
            connect_timeout=self.connect_timeout,
            tunnel_through_iap=_given(self.tunnel_through_iap, cfg.tunnel_through_iap, default=False),
            key_push=_given(self.key_push, cfg.key_push, default=True),
            key_ttl=self.key_ttl or cfg.key_ttl,
        )


def private_dir(path: Path) -> Path:
    """A folder only its owner can read (0700), made with its parents; an existing one is narrowed to 0700."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.chmod(0o700)
    return path


def run_folder(run_id: str) -> Path:
    """`<state home>/runs/<run_id>`, both folders 0700: run records and log copies may quote a worker's output."""
    private_dir(state_home() / "runs")
    return private_dir(state_home() / "runs" / run_id)


def open_private(path: Path) -> BinaryIO:
    """A file opened for writing that is 0600 from its first byte (no window in which another user could open it)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # an existing file keeps its mode through O_CREAT
    return os.fdopen(fd, "wb")


def write_private(path: Path, data: bytes) -> None:
    with open_private(path) as f:
        f.write(data)


def write_atomic(path: str | Path, text: str) -> None:
    """Replace `path` with `text` whole or not at all: a unique temporary name in the same folder, fsync, then
    rename. A reader never sees half a run record or cache file, whatever kills the writer (a temporary file is
    left behind at worst, under a name no reader looks at); two writers never share a temporary name."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        Path(tmp).replace(target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def target_from_options(
    *,
    vm: str | None = None,
    zone: str | None = None,
    project: str | None = None,
    host: list[str] | None = None,
    hostkey: list[str] | None = None,
    user: str | None = None,
    identity: str | None = None,
    local: bool = False,
    local_workers: int = 1,
    internal_ip: bool | None = None,
    api_endpoint: str | None = None,
    tunnel_through_iap: bool | None = None,
    key_push: bool | None = None,
    key_ttl: str | None = None,
) -> TargetSpec:
    """The target options as typed (`--vm`, `--host`, `--key-ttl 12h`, ...) -> a checked TargetSpec."""
    chosen = [name for name, on in (("--vm", vm), ("--host", host), ("--local", local)) if on]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} were both given: choose one target")
    if hostkey and not (host or vm):
        raise UsageError("--hostkey needs --host or --vm (with --vm it overrides the guest-attribute keys)")
    return TargetSpec(
        local=local,
        local_workers=local_workers,
        hosts=tuple(host or ()),
        hostkey=tuple(hostkey or ()),
        user=user,
        identity=identity,
        vm=vm,
        zone=zone,
        project=project,
        internal_ip=internal_ip,
        api_endpoint=api_endpoint,
        tunnel_through_iap=tunnel_through_iap,
        key_push=key_push,
        key_ttl=parse_duration("--key-ttl", key_ttl) if key_ttl else None,
    )


def parse_sets(sets: list[str] | None) -> dict[str, str]:
    """`key=value` strings -> dict; the value is kept verbatim (it is quoted wherever it is used)."""
    out: dict[str, str] = {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set {item!r} is not key=value", hint="for example --set steps=20")
        out[key.strip()] = value
    return out


def parse_duration(option: str, text: str) -> float:
    """`90`, `30m`, `12h`, `7d` -> seconds."""
    m = re.fullmatch(r"(\d+)([smhd]?)", text.strip())
    if not m or int(m.group(1)) == 0:
        raise UsageError(f"{option} {text!r} is not a duration", hint="for example 3600, 30m, 12h or 7d")
    return int(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
