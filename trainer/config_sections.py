"""The config tree's sections (model, data, rollout, loss, train, mesh, checkpoint, log, eval, profile, rewards),
each a frozen dataclass that checks itself with a "received X" message; trainer/config.py composes them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


class ConfigError(ValueError):
    """A bad preset, key or value: one line naming what is wrong and what would be right."""


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ConfigError(message)


@dataclass(frozen=True)
class ModelConfig:
    preset: str = "tiny"  # shapes for `path: tiny` (a seeded tiny checkpoint made on first use)
    path: str = "tiny"  # "tiny", a local Hugging Face folder, or a hub id (downloads on a VM with internet)
    dtype: Literal["float32", "bfloat16"] = "float32"  # compute dtype
    seed: int = 0  # the tiny checkpoint's seed
    # The tokenizer a `path: tiny` checkpoint is made with: `bundled` (trainer/assets/tokenizer, 378 tokens, in
    # the repository: no download), `qwen2.5` (the real 151,665-token vocabulary, which the tiny presets are
    # shaped for: <data.root>/qwen2.5-tokenizer, else the hub) or a folder.
    tokenizer: str = "qwen2.5"


@dataclass(frozen=True)
class DataConfig:
    task: Literal["arith", "gsm8k", "toy"] = "gsm8k"  # trainer/tasks.py TASKS
    # The folder holding gsm8k/ and qwen2.5-tokenizer/; "": <repo>/../shared/data (what a checkout beside the
    # shared data folder has). Whatever is not there comes from the hub (a VM with internet).
    root: str = ""
    path: str = "auto"  # GSM8K JSONL folder; auto: <data.root>/gsm8k, else the hub
    tokenizer: str = "auto"  # tokenizer folder; auto: the model folder
    prompt_buckets: tuple[int, ...] = (128, 256)  # prompt lengths, tokens
    # true: every step pads to the largest bucket (one compile per run); false: to the smallest that fits
    # (less padding, but one compile per bucket seen: `tpuops recompile-check` flags those)
    fixed_bucket: bool = True
    toy_fraction: float = (
        0.25  # toy task: the share of the vocabulary that counts as hits (tasks.toy_targets)
    )


@dataclass(frozen=True)
class RolloutConfig:
    samples_per_prompt: int = 4  # G
    max_new_tokens: int = 32
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    # Decode layout: weights split over `tp` devices by heads/MLP/vocab, sequences over the rest (no FSDP:
    # trainer.sharding.rollout_mesh). 0 = auto: the kv-head count's largest divisor that divides the devices.
    tp: int = 0
    # Decode positions per attention window: the decode loop runs in segments of this many positions, each
    # attending over the cache slots its last position can see (0: every position reads the whole P + C cache).
    # Each segment is one more loop body to compile.
    attention_block: int = 0
    # The decode's layer loop: scan (one layer body over the stacked weights), unrolled (one body per layer over
    # per-layer buffers: XLA:GPU copies a stack's layer slice before each matmul), auto (unrolled on GPU only).
    decode_layers: Literal["auto", "scan", "unrolled"] = "auto"
    # Decode positions between two end-of-sequence checks: the decode loop tests "is every sequence done?" once
    # per this many positions (on a GPU each test copies a flag to the host and waits for it). Positions run
    # after every sequence is done change no token, log-prob or length; 1 = a test after every position.
    eos_check_every: int = 1
    # The decode's attention over its cache: xla (einsums over the window, float32 scores; on a GPU XLA copies the
    # window's slots before its matmuls) | pallas (trainer/model/decode_attention.py: one Pallas GPU kernel per
    # layer reading the slots in place, online softmax; the prompt bucket and the windows' completion slots
    # multiples of 16; a GPU's, refused on a TPU, interpret mode on a CPU).
    attention_impl: Literal["xla", "pallas"] = "xla"

    def __post_init__(self) -> None:
        _check(self.tp >= 0, f"rollout.tp must be >= 0 (0 = auto), received {self.tp}")
        _check(
            self.attention_block >= 0,
            f"rollout.attention_block must be >= 0 (0 = the whole cache), received {self.attention_block}",
        )
        _check(
            self.eos_check_every >= 1,
            f"rollout.eos_check_every must be >= 1 (1 = after every position), received {self.eos_check_every}",
        )
        _check(
            self.samples_per_prompt >= 2,
            f"rollout.samples_per_prompt must be >= 2 (a group), received {self.samples_per_prompt}",
        )
        _check(self.max_new_tokens > 0, f"rollout.max_new_tokens must be > 0, received {self.max_new_tokens}")
        _check(self.temperature > 0, f"rollout.temperature must be > 0, received {self.temperature}")


@dataclass(frozen=True)
class LossConfig:
    """The GRPO objective (see trainer/grpo/loss.py for the formulas)."""

    loss_type: Literal["grpo", "bnpo", "dr_grpo", "dapo"] = "dapo"
    epsilon_low: float = 0.2
    epsilon_high: float = 0.28
    beta: float = 0.0  # KL(policy || reference) weight, k3 estimator; 0 = no reference model
    entropy_coef: float = 0.0  # entropy bonus (entropy is always logged)
    scale_rewards: Literal["group", "none"] = (
        "group"  # group: divide by the group std (+1e-4); none: Dr. GRPO
    )
    max_completion_len: int = 0  # dr_grpo's constant normaliser; 0 = rollout.max_new_tokens

    def __post_init__(self) -> None:
        _check(self.epsilon_low >= 0 and self.epsilon_high >= 0, "loss.epsilon_low/high must be >= 0")
        _check(self.beta >= 0, f"loss.beta must be >= 0, received {self.beta}")


@dataclass(frozen=True)
class TrainConfig:
    steps: int = 20
    prompts_per_step: int = 2
    micro_batch: int = 8  # sequences per micro-batch (global); accumulation = sequences / micro_batch
    ppo_epochs: int = 1
    optimizer: Literal["adamw", "lion"] = "adamw"
    learning_rate: float = 1e-5
    warmup_steps: int = 0
    weight_decay: float = 0.0
    max_grad_norm: float = 1.0
    loss_impl: Literal["reference", "chunked", "pallas", "fused_lm_head", "auto"] = "auto"
    # Self-attention of the update and the rollout's prefill: xla (`[S, S]` float32 scores per layer) | pallas
    # (trainer/model/flash.py, the splash kernel: no scores in HBM; the update's S = bucket + max_new_tokens must
    # be a multiple of 128, a prefill bucket that is not one uses xla) | cudnn (trainer/model/fused.py: cuDNN's fused
    # kernel on a GPU, no scores in HBM; every prompt bucket and max_new_tokens even; refused on a TPU) | auto
    # (pallas on a TPU or a TPU compile target where the length allows, else xla: CPU and GPU runs keep xla).
    attention_impl: Literal["auto", "xla", "pallas", "cudnn"] = "auto"
    # Recompute each decoder layer in the backward pass: none | dots (keep matmul outputs) | mlp_up (keep the MLP's
    # up projection) | full (keep inputs) | auto (the first of none, dots, mlp_up, full whose compiled update leaves
    # 10% of the device's memory free; none where the device reports no memory limit, as the CPU: trainer.loop.remat;
    # `fit` compiles the same candidates)
    remat: Literal["none", "dots", "mlp_up", "full", "auto"] = "none"
    # On a TPU, let XLA split the update's FSDP weight all-gathers into a ring of pieces, each multiplied as it
    # arrives ("collective matmul", libtpu's default): it overlaps the gather with compute, but a matmul whose
    # contracted dim is the split one adds each piece's partial product into its [tokens, mlp] output in HBM
    # (the 3B seed update: 1.8 TB of HBM traffic per step instead of 1.07). false: gather a layer's weight
    # whole, then one matmul (docs/performance.md compares both). TPU compiler option
    # xla_tpu_enable_windowed_einsum_for_all_gather; CPU and GPU compiles ignore this setting.
    collective_matmul: bool = False
    # Run each prompt once for its group of rollout.samples_per_prompt completions in the update's forward and
    # backward (and the reference log-probs): the completions attend over their group's prompt keys
    # (trainer.model.qwen2.forward_hidden_grouped), the same log-probs as whole rows at 1 / G of the prompts'
    # FLOPs. It applies where a micro-batch's rows on a slice are whole groups (with the Pallas attention: the
    # prompt bucket and max_new_tokens multiples of 128); elsewhere, and with false, every row runs its prompt.
    shared_prompt: bool = True
    seed: int = 0
    flip_advantages: bool = False  # a sanity switch: the update should then make rewards fall

    def __post_init__(self) -> None:
        _check(self.steps > 0, f"train.steps must be > 0, received {self.steps}")
        _check(
            self.prompts_per_step > 0, f"train.prompts_per_step must be > 0, received {self.prompts_per_step}"
        )
        _check(self.micro_batch > 0, f"train.micro_batch must be > 0, received {self.micro_batch}")
        _check(self.ppo_epochs > 0, f"train.ppo_epochs must be > 0, received {self.ppo_epochs}")
        _check(self.learning_rate > 0, f"train.learning_rate must be > 0, received {self.learning_rate}")


@dataclass(frozen=True)
class MeshConfig:
    # dp, fsdp and tp are inside one slice; on a multislice (MEGASCALE_NUM_SLICES) the slices are the mesh's
    # own outermost axis `dcn` (data parallelism over DCN: trainer.sharding), so the mesh is slices x dp x fsdp x tp
    dp: int = 1
    fsdp: int = 0  # 0: every remaining device of a slice
    tp: int = 1
    devices: int = 0  # use the first N devices (0: all); tests compare 1 device with 8
    accelerator: str = ""  # the TPU this config is made for (e.g. v6e-8): trainer.fit's default target
    # JAX platforms the run starts (jax_platforms, e.g. "cpu"); "" = this machine's: JAX's own choice where a
    # TPU or GPU device is present, else "cpu" (no libtpu start-up errors where there is no TPU).
    # JAX_PLATFORMS in the environment wins.
    platforms: str = ""


@dataclass(frozen=True)
class CheckpointConfig:
    dir: str = ""  # "" = no checkpoints; a local path or gs://bucket/path
    every: int = 0  # steps between checkpoints (and one at the end); 0 = only at the end
    resume: bool = True  # continue from the latest checkpoint in dir


@dataclass(frozen=True)
class LogConfig:
    wandb: Literal["disabled", "offline", "online"] = "disabled"
    wandb_required: bool = True  # an init failure stops the run (false: warn loudly and go on)
    project: str = "tpuops-grpo"
    log_compiles: bool = False  # jax_log_compiles + jax_explain_cache_misses
    output_dir: str = "~/.cache/tpuops-trainer"  # tiny checkpoints, W&B files
    param_digest: bool = (
        False  # the summary gets a sha256 of the final parameters (gathers them: small models)
    )


@dataclass(frozen=True)
class EvalConfig:
    every: int = 0  # steps between evaluations; 0 = off
    max_examples: int = 0  # 0 = the full test split (1319)
    greedy: bool = True
    batch: int = 8

    def __post_init__(self) -> None:
        _check(self.every >= 0, f"eval.every must be >= 0, received {self.every}")
        _check(
            self.max_examples >= 0, f"eval.max_examples must be >= 0 (0 = all), received {self.max_examples}"
        )
        _check(self.batch > 0, f"eval.batch must be > 0, received {self.batch}")


@dataclass(frozen=True)
class ProfileConfig:
    """JAX's profiler (trainer/profiling.py): a server others capture from, and a trace of chosen steps."""

    # jax.profiler.start_server(port) at start-up (`tpuops profile RUN_ID` captures through it); 0 = none.
    # JAX binds it on every interface: reach it through SSH on the worker's loopback, never open it in a firewall.
    port: int = 0
    steps: str = ""  # "A-B": trace steps A to B (inclusive) into dir; "" = none
    dir: str = ""  # where a steps trace goes (dir/plugins/profile/<time>/<host>.xplane.pb); "" = log.output_dir/profile

    def __post_init__(self) -> None:
        _check(
            0 <= self.port < 65536, f"profile.port must be in 0..65535 (0 = no server), received {self.port}"
        )
        if self.steps:
            first, sep, last = self.steps.partition("-")
            ok = first.strip().isdigit() and (not sep or last.strip().isdigit())
            _check(ok, f"profile.steps must be A-B or N (for example 5-7), received {self.steps!r}")
            _check(
                not sep or int(first) <= int(last),
                f"profile.steps must be A-B with A <= B, received {self.steps!r}",
            )

    @property
    def step_range(self) -> tuple[int, int] | None:
        if not self.steps:
            return None
        first, sep, last = self.steps.partition("-")
        return int(first), int(last) if sep else int(first)


@dataclass(frozen=True)
class RewardConfig:
    number: float = 0.9  # arith: the completion is a bare number (the format)
    exact: float = 0.1  # arith: the completion is the right sum
    correctness: float = 1.0
    format: float = 0.2
    tag_count: float = 0.1
    toy: float = 1.0
