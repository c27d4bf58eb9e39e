"""The typed config tree: YAML presets in trainer/configs/ plus strict `--set a.b=c` overrides (no JAX here)."""

from __future__ import annotations

import dataclasses
import difflib
import json
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from trainer import tasks
from trainer.config_sections import (
    CheckpointConfig,
    ConfigError,
    DataConfig,
    EvalConfig,
    LogConfig,
    LossConfig,
    MeshConfig,
    ModelConfig,
    ProfileConfig,
    RewardConfig,
    RolloutConfig,
    TrainConfig,
    _check,
)

CONFIGS = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    rewards: RewardConfig = field(default_factory=RewardConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)

    def __post_init__(self) -> None:
        task = tasks.get(self.data.task)
        with_eval = [t.name for t in tasks.TASKS.values() if t.eval_examples is not None]
        _check(
            not (self.eval.every and task.eval_examples is None),
            f"eval.every needs a task with an eval split ({', '.join(with_eval)}): the {task.name} task has "
            "none; set eval.every=0",
        )
        lengths = sorted({p + self.rollout.max_new_tokens for p in self.data.prompt_buckets})
        _check(
            self.train.attention_impl != "pallas" or all(n % 128 == 0 for n in lengths),
            "train.attention_impl=pallas needs every training length (prompt bucket + rollout.max_new_tokens) to "
            f"be a multiple of 128, received {lengths}; set train.attention_impl=auto (xla where it cannot run)",
        )
        parts = sorted({*self.data.prompt_buckets, self.rollout.max_new_tokens})
        _check(
            self.train.attention_impl != "cudnn" or all(n % 2 == 0 for n in parts),
            "train.attention_impl=cudnn needs every prompt bucket and rollout.max_new_tokens even (cuDNN's masked "
            f"attention trains on even lengths), received {parts}; set train.attention_impl=auto",
        )
        _check(
            self.rollout.attention_impl != "pallas" or all(n % 16 == 0 for n in parts),
            "rollout.attention_impl=pallas needs every prompt bucket and rollout.max_new_tokens to be multiples of "
            f"16 (the kernel reads the cache 16 slots at a time or more), received {parts}; set "
            "rollout.attention_impl=xla",
        )

    @property
    def sequences_per_step(self) -> int:
        return self.train.prompts_per_step * self.rollout.samples_per_prompt

    @property
    def accumulation_steps(self) -> int:
        return self.sequences_per_step // self.train.micro_batch

    def check_batch(self, process_count: int = 1, device_count: int = 1) -> None:
        """Impossible batch shapes are rejected here, before any compile."""
        n, mb = self.sequences_per_step, self.train.micro_batch
        _check(
            n % mb == 0, f"train.micro_batch ({mb}) must divide prompts_per_step × samples_per_prompt ({n})"
        )
        _check(
            mb % device_count == 0,
            f"train.micro_batch ({mb}) must be a multiple of the device count ({device_count})",
        )
        _check(
            self.train.prompts_per_step % process_count == 0,
            f"train.prompts_per_step ({self.train.prompts_per_step}) must be a multiple of the process count "
            f"({process_count})",
        )

    def batch_line(self, batch_devices: int | None = None) -> dict[str, int]:
        """The batch arithmetic as printed; per-device figures once the mesh (dp × fsdp devices) is known."""
        line = {
            "prompts_per_step": self.train.prompts_per_step,
            "samples_per_prompt": self.rollout.samples_per_prompt,
            "sequences_per_step": self.sequences_per_step,
            "micro_batch": self.train.micro_batch,
        }
        if batch_devices:
            line["batch_devices"] = batch_devices
            line["micro_batch_per_device"] = self.train.micro_batch // batch_devices
        line["accumulation_steps"] = self.accumulation_steps
        return line


def to_dict(cfg: Any) -> dict[str, Any]:
    return dataclasses.asdict(cfg)


def presets() -> list[str]:
    return sorted(p.stem for p in CONFIGS.glob("*.yaml"))


def load(name_or_path: str, sets: list[str] | None = None) -> Config:
    """A preset by name (trainer/configs/NAME.yaml) or a YAML path, then each `a.b=c` override in order."""
    path = Path(name_or_path)
    if path.suffix in {".yaml", ".yml"} or "/" in name_or_path:  # a path, not a preset name
        _check(
            path.is_file(), f"config file {name_or_path!r}: file not found (presets: {', '.join(presets())})"
        )
    else:
        path = CONFIGS / f"{name_or_path}.yaml"
        if not path.exists():
            close = difflib.get_close_matches(name_or_path, presets(), n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"no config preset {name_or_path!r}{hint} (presets: {', '.join(presets())})")
    data = yaml.safe_load(path.read_text()) or {}
    for item in sets or []:
        key, sep, value = item.partition("=")
        _check(bool(sep and key), f"--set {item!r} is not key=value (for example --set train.steps=20)")
        _assign(data, key.strip(), value)
    return _build(Config, data, "")


def with_sets(cfg: Config, sets: list[str]) -> Config:
    """`cfg` with more `a.b=c` overrides applied (validated like load's)."""
    data = to_dict(cfg)
    for item in sets:
        key, _, value = item.partition("=")
        _assign(data, key.strip(), value)
    return _build(Config, data, "")


def _assign(data: dict[str, Any], dotted: str, value: str) -> None:
    """Put a raw string at a dotted key; it is type-checked by _build against the field's type."""
    cls: Any = Config
    node = data
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            prefix = ".".join(parts[:i])
            valid = [f"{prefix}.{n}" if prefix else n for n in names]
            close = difflib.get_close_matches(dotted, _all_keys(Config), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else f" (valid here: {', '.join(valid)})"
            raise ConfigError(f"unknown config key {dotted!r}{hint}")
        ftype = _field_types(cls)[part]
        if i == len(parts) - 1:
            _check(not dataclasses.is_dataclass(ftype), f"{dotted!r} is a section; set one of its keys")
            node[part] = _RawStr(value)
        else:
            _check(dataclasses.is_dataclass(ftype), f"{'.'.join(parts[: i + 1])!r} is not a section")
            node = node.setdefault(part, {}) if isinstance(node.get(part, {}), dict) else node
            cls = ftype


class _RawStr(str):
    """A value that came from the command line: parsed per the field's type (YAML values are typed already)."""


def _all_keys(cls: Any, prefix: str = "") -> list[str]:
    out = []
    for name, ftype in _field_types(cls).items():
        key = f"{prefix}{name}"
        out += _all_keys(ftype, key + ".") if dataclasses.is_dataclass(ftype) else [key]
    return out


def _field_types(cls: Any) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: Any, data: Any, where: str) -> Any:
    if data is None:
        data = {}
    _check(isinstance(data, dict), f"{where or 'config'} must be a mapping, received {data!r}")
    types_ = _field_types(cls)
    for key in data:
        if key not in types_:
            full = f"{where}.{key}" if where else key
            close = difflib.get_close_matches(full, _all_keys(Config), n=1, cutoff=0.5)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(f"unknown config key {full!r}{hint}")
    kwargs = {}
    for name, ftype in types_.items():
        if name not in data:
            continue
        full = f"{where}.{name}" if where else name
        if dataclasses.is_dataclass(ftype):
            kwargs[name] = _build(ftype, data[name], full)
        else:
            kwargs[name] = _coerce(full, ftype, data[name])
    try:
        return cls(**kwargs)
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:
        raise ConfigError(f"{where or 'config'}: {e}") from None


def _coerce(key: str, ftype: Any, value: Any) -> Any:
    origin = typing.get_origin(ftype)
    raw = isinstance(value, _RawStr)
    if origin is Literal:
        choices = typing.get_args(ftype)
        _check(value in choices, f"{key} must be one of {list(choices)}, received {value!r}")
        return str(value)
    if origin is tuple:
        items = value.strip("[]() ").split(",") if raw else value  # a.b=64,128 or a.b=[64,128]
        _check(isinstance(items, list | tuple), f"{key} must be a list, received {value!r}")
        inner = typing.get_args(ftype)[0]
        return tuple(_coerce(key, inner, _RawStr(i.strip()) if raw else i) for i in items)
    if ftype is bool:
        if raw:
            _check(
                value.lower() in {"true", "false", "1", "0"},
                f"{key} must be true or false, received {value!r}",
            )
            return value.lower() in {"true", "1"}
        _check(isinstance(value, bool), f"{key} must be true or false, received {value!r}")
        return value
    if ftype in (int, float, str):
        try:
            out = ftype(value) if raw or ftype is not int or not isinstance(value, float) else None
        except ValueError:
            out = None
        _check(
            out is not None and not (ftype is int and isinstance(value, bool)),
            f"{key} must be {ftype.__name__}, received {value!r}",
        )
        return out
    if isinstance(ftype, types.UnionType):
        return value
    raise ConfigError(f"{key}: unsupported type {ftype}")


def dumps(cfg: Config) -> str:
    return json.dumps(to_dict(cfg), separators=(",", ":"), default=list)
