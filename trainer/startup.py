"""A run's start-up, shared by training and eval: JAX settings, the multi-host join, the mesh, the model."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import jax
from jax.sharding import Mesh

from trainer import compile_cache, distributed, metrics
from trainer.config import Config, ConfigError, dumps
from trainer.sharding import make_mesh
from trainer.tokenizer import load_tokenizer


def accelerator_present(dev: Path = Path("/dev")) -> bool:
    """A TPU (/dev/accel*, /dev/vfio/N) or an NVIDIA GPU (/dev/nvidia0) is on this machine."""
    vfio = dev / "vfio"
    numbered = vfio.is_dir() and any(p.name.isdigit() for p in vfio.iterdir())
    return numbered or any(dev.glob("accel*")) or (dev / "nvidia0").exists()


def platforms(
    cfg: Config | None, env: Mapping[str, str] = os.environ, dev: Path = Path("/dev")
) -> str | None:
    """The JAX platforms this run starts with, or None to leave JAX's own choice (JAX_PLATFORMS, set by the
    user, is already JAX's). Without an accelerator, "cpu": JAX would otherwise try libtpu (installed with
    the `tpu` extra) and print its start-up errors; a real TPU's messages are left as they are."""
    if env.get("JAX_PLATFORMS"):
        return None
    if cfg is not None and cfg.mesh.platforms:
        return cfg.mesh.platforms
    return None if accelerator_present(dev) else "cpu"


def start_platforms(cfg: Config | None = None) -> None:
    """Start JAX on `platforms(cfg)`: before anything asks JAX for a backend (gradcheck and microbench call it
    first thing, training and eval through setup_jax)."""
    chosen = platforms(cfg)
    if chosen:
        jax.config.update("jax_platforms", chosen)
        os.environ["JAX_PLATFORMS"] = chosen  # what distributed.init and child processes read


def setup_jax(cfg: Config) -> None:
    start_platforms(cfg)
    compile_cache.watch()  # the summary line says what the persistent cache (JAX_COMPILATION_CACHE_DIR) gave
    if cfg.log.log_compiles:  # the config owns it: no JAX_LOG_COMPILES side door
        jax.config.update("jax_log_compiles", True)
        jax.config.update("jax_explain_cache_misses", True)


def start_up(cfg: Config, emit: metrics.Emitter | None) -> tuple[metrics.Emitter, Mesh, int, int]:
    """Training's and eval's start-up: JAX settings, the multi-host join, the mesh, the `start:` and `config:`
    lines. Returns (emitter, mesh, process_index, process_count); a mesh that does not fit is a ConfigError."""
    setup_jax(cfg)
    process_index, process_count = distributed.init()
    emit = emit or metrics.Emitter(process_index)
    devices = jax.devices()[: cfg.mesh.devices or None]
    # mesh.dp, fsdp and tp are inside one slice; on a multislice the slices are the mesh's dcn axis.
    slices = distributed.num_slices()
    dp = cfg.mesh.dp
    fsdp = cfg.mesh.fsdp or len(devices) // (slices * dp * cfg.mesh.tp)
    try:
        mesh = make_mesh(dp, fsdp, cfg.mesh.tp, devices, slices)
    except ValueError as e:
        raise ConfigError(f"mesh: {e}") from None
    if cfg.train.attention_impl == "cudnn" and jax.default_backend() == "tpu":
        from trainer.model.flash import CUDNN_ON_TPU

        raise ConfigError(CUDNN_ON_TPU)
    if cfg.rollout.attention_impl == "pallas" and jax.default_backend() == "tpu":
        from trainer.sampling.sampler import PALLAS_DECODE_ON_TPU

        raise ConfigError(PALLAS_DECODE_ON_TPU)
    shape = (f"dcn:{slices}," if slices > 1 else "") + f"dp:{dp},fsdp:{fsdp},tp:{cfg.mesh.tp}"
    emit.start(
        backend=jax.default_backend(), process_count=process_count, process_index=process_index,
        device_count=len(devices), mesh=shape,
    )  # fmt: skip
    emit.config(summary(cfg), dumps(cfg), run_dir=os.environ.get("TPUOPS_RUN_DIR"))
    return emit, mesh, process_index, process_count


def summary(cfg: Config) -> dict[str, Any]:
    """What the `config:` line shows: the task, the model, how many steps of what size, the objective, and the
    highest mean reward the task's weighted rewards can reach (`max_reward`: the report's reward axis)."""
    from trainer import tasks

    weights = tasks.get(cfg.data.task).weights(cfg)
    return {
        "task": cfg.data.task, "model": cfg.model.path, "steps": cfg.train.steps, "prompts_per_step": cfg.train.prompts_per_step,
        "samples_per_prompt": cfg.rollout.samples_per_prompt, "max_new_tokens": cfg.rollout.max_new_tokens,
        "learning_rate": f"{cfg.train.learning_rate:g}", "loss": cfg.loss.loss_type, "loss_impl": cfg.train.loss_impl,
        "max_reward": f"{sum(max(w, 0.0) for w in weights.values()):g}",
        "platforms": os.environ.get("JAX_PLATFORMS") or "default",
    }  # fmt: skip


def tiny_folder(cfg: Config, process_index: int) -> Path:
    """Where the `tiny` checkpoint of this config lives under log.output_dir (one folder per process)."""
    from trainer.make_tokenizer import BUNDLED

    tok = cfg.model.tokenizer
    # The bundled tokenizer's content is in the name, so a changed tokenizer.json never meets an old model.
    name = {
        "qwen2.5": "qwen2.5",
        "bundled": "bundled-" + hashlib.sha256((BUNDLED / "tokenizer.json").read_bytes()).hexdigest()[:8],
    }.get(tok) or "tok-" + hashlib.sha256(tok.encode()).hexdigest()[:8]
    return (
        Path(cfg.log.output_dir).expanduser()
        / f"tiny-{cfg.model.preset}-{name}-seed{cfg.model.seed}-p{process_index}"
    )


def model_folder(cfg: Config, process_index: int) -> Path:
    """The local folder of the checkpoint (weights and tokenizer): `tiny` is made (seeded, with
    model.tokenizer) on first use under log.output_dir; a hub id is downloaded (or found in the HF cache); a
    folder is used as it is. A cached tiny folder is trusted only when complete (make_tiny writes it under a
    temporary name and renames it into place); anything else there is rebuilt."""
    if cfg.model.path != "tiny":
        from trainer.model.loading import resolve_path

        return resolve_path(cfg.model.path)
    from trainer.make_tiny import complete, make_tiny

    out = tiny_folder(cfg, process_index)
    if not complete(out):
        make_tiny(
            out, cfg.model.preset, cfg.model.seed, tokenizer=cfg.model.tokenizer, data_root=cfg.data.root
        )
    return out


def load_model(cfg: Config, mesh: Mesh, process_index: int) -> tuple[Any, Any, Any]:
    """(model config, params placed on `mesh`, tokenizer) of the checkpoint cfg.model names."""
    from trainer.model.loading import load_pretrained

    folder = model_folder(cfg, process_index)
    mconf, params = load_pretrained(folder, mesh=mesh, dtype=cfg.model.dtype)
    tokenizer = load_tokenizer(folder if cfg.data.tokenizer == "auto" else Path(cfg.data.tokenizer))
    return mconf, params, tokenizer
