"""Qwen2Config: the model's shape and numerics, HF config.json conversion, and named presets.

Presets hold the real Qwen2.5-*-Instruct shapes (from ../shared/data/qwen2.5-configs) and two tiny CPU
variants that keep the real tokenizer's vocabulary (151,936 rows) so real token ids are valid:
`tiny` (tied embeddings) and `tiny-untied`.
"""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass
from typing import Any

_DTYPES = ("float32", "bfloat16", "float16")
_ROPE_TYPES = ("default", "linear")
_REMATS = ("none", "dots", "mlp_up", "full")
_ATTENTIONS = ("xla", "pallas", "cudnn")
DECODE_ATTENTIONS = ("xla", "pallas")  # the decode's attention over its cache (rollout.attention_impl)


@dataclass(frozen=True)
class Qwen2Config:
    """Shapes plus numerics: `dtype` is the compute dtype, `param_dtype` the master-parameter dtype."""

    vocab_size: int = 151936
    hidden_size: int = 64
    intermediate_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    rope_theta: float = 1_000_000.0
    # None or a hashable tuple of (key, value) pairs, e.g. (("factor", 2.0), ("rope_type", "linear")).
    rope_scaling: tuple[tuple[str, Any], ...] | None = None
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    max_position_embeddings: int = 32768
    initializer_range: float = 0.02
    dtype: str = "bfloat16"
    param_dtype: str = "float32"
    # Per decoder layer in the backward pass: none | dots (save matmuls) | mlp_up (save the MLP's up projection,
    # recompute the rest) | full (save the layer's input only): trainer/model/qwen2.REMAT_POLICIES.
    remat: str = "none"
    # Self-attention without a cache (training, prefill): xla (`qwen2.attend`, [T, T] scores) | pallas (the splash
    # kernel, trainer/model/flash.py: no [T, T] scores in HBM; T a multiple of 128) | cudnn (cuDNN's fused kernel
    # through jax.nn.dot_product_attention, trainer/model/fused.py).
    attention: str = "xla"
    # The decode's attention over its cache (one position a row): xla (attention.attend) | pallas (one Pallas GPU
    # kernel a layer, trainer/model/decode_attention.py); the sampler sets it from its SamplingConfig.
    decode_attention: str = "xla"

    def __post_init__(self) -> None:
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers"):
            if getattr(self, name) <= 0:
                raise ValueError(f"Qwen2Config.{name} must be positive, received {getattr(self, name)}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size must be divisible by num_attention_heads, received "
                f"{self.hidden_size} and {self.num_attention_heads}"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_attention_heads must be a multiple of num_key_value_heads, received "
                f"{self.num_attention_heads} and {self.num_key_value_heads}"
            )
        for name in ("dtype", "param_dtype"):
            if getattr(self, name) not in _DTYPES:
                raise ValueError(
                    f"Qwen2Config.{name} must be one of {_DTYPES}, received {getattr(self, name)!r}"
                )
        if self.remat not in _REMATS:
            raise ValueError(f"remat must be one of {_REMATS}, received {self.remat!r}")
        if self.attention not in _ATTENTIONS:
            raise ValueError(f"attention must be one of {_ATTENTIONS}, received {self.attention!r}")
        if self.decode_attention not in DECODE_ATTENTIONS:
            raise ValueError(
                f"decode_attention must be one of {DECODE_ATTENTIONS}, received {self.decode_attention!r}"
            )
        if self.rope_type not in _ROPE_TYPES:
            raise ValueError(f"rope_scaling type must be one of {_ROPE_TYPES}, received {self.rope_type!r}")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def rope_type(self) -> str:
        scaling = dict(self.rope_scaling or ())
        return str(scaling.get("rope_type", scaling.get("type", "default")))

    @property
    def rope_factor(self) -> float:
        return float(dict(self.rope_scaling or ()).get("factor", 1.0))

    @classmethod
    def from_hf(cls, hf: dict[str, Any], **overrides: Any) -> Qwen2Config:
        """Build from a Hugging Face `config.json` dict (transformers 4.x or 5.x key layout)."""
        rope = hf.get("rope_parameters") or {}
        scaling = hf.get("rope_scaling") or {k: v for k, v in rope.items() if k != "rope_theta"}
        if scaling and str(scaling.get("rope_type", scaling.get("type"))) == "default":
            scaling = None
        kwargs: dict[str, Any] = {
            "vocab_size": hf["vocab_size"],
            "hidden_size": hf["hidden_size"],
            "intermediate_size": hf["intermediate_size"],
            "num_hidden_layers": hf["num_hidden_layers"],
            "num_attention_heads": hf["num_attention_heads"],
            "num_key_value_heads": hf.get("num_key_value_heads", hf["num_attention_heads"]),
            "rope_theta": float(hf.get("rope_theta", rope.get("rope_theta", 10000.0))),
            "rope_scaling": tuple(sorted(scaling.items())) if scaling else None,
            "rms_norm_eps": float(hf.get("rms_norm_eps", 1e-6)),
            "tie_word_embeddings": bool(hf.get("tie_word_embeddings", False)),
            "max_position_embeddings": hf.get("max_position_embeddings", 32768),
            "initializer_range": float(hf.get("initializer_range", 0.02)),
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    def to_hf(self) -> dict[str, Any]:
        """A `config.json` dict that transformers' Qwen2ForCausalLM loads."""
        return {
            "architectures": ["Qwen2ForCausalLM"],
            "model_type": "qwen2",
            "hidden_act": "silu",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "rope_theta": self.rope_theta,
            "rope_scaling": dict(self.rope_scaling) if self.rope_scaling else None,
            "rms_norm_eps": self.rms_norm_eps,
            "tie_word_embeddings": self.tie_word_embeddings,
            "max_position_embeddings": self.max_position_embeddings,
            "initializer_range": self.initializer_range,
            "attention_dropout": 0.0,
            "use_sliding_window": False,
            "use_cache": True,
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "torch_dtype": self.param_dtype,
        }

    def replace(self, **changes: Any) -> Qwen2Config:
        return dataclasses.replace(self, **changes)


def _real(hidden: int, inter: int, layers: int, heads: int, kv: int, tied: bool, vocab: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv,
        tie_word_embeddings=tied,
    )


PRESETS: dict[str, Qwen2Config] = {
    # A wider init than the real 0.02 so a random tiny model has peaked, non-uniform next-token logits.
    "tiny": Qwen2Config(initializer_range=0.1),
    "tiny-untied": Qwen2Config(initializer_range=0.1, tie_word_embeddings=False),
    "qwen2.5-0.5b": _real(896, 4864, 24, 14, 2, True, 151936),
    "qwen2.5-1.5b": _real(1536, 8960, 28, 12, 2, True, 151936),
    "qwen2.5-3b": _real(2048, 11008, 36, 16, 2, True, 151936),
    "qwen2.5-7b": _real(3584, 18944, 28, 28, 4, False, 152064),
}


def preset(name: str) -> Qwen2Config:
    """The preset called `name`; an unknown name is an error that names the closest presets."""
    if name in PRESETS:
        return PRESETS[name]
    close = difflib.get_close_matches(name, PRESETS, n=3, cutoff=0.3)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise ValueError(f"unknown model preset {name!r}{hint} (known: {', '.join(PRESETS)})")
