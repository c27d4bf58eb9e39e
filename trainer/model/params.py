"""The Hugging Face <-> Flax parameter name mapping, as one table apart from the model code.

Each row: HF tensor-name regex, Flax path template ("/"-joined keys of the params dict), and whether the
tensor is transposed on the way (torch Linear stores [out, in]; flax Dense kernels are [in, out]).
Decoder layers are stacked: HF's `model.layers.{i}.<name>` is row i of the Flax leaf `layers/<name>` (one
[L, ...] array per layer parameter, the layer scan's input), so a rule with {i} also gives that index.
"""

from __future__ import annotations

import re
from typing import NamedTuple

from trainer.model.config import Qwen2Config


class Rule(NamedTuple):
    hf: str
    flax: str
    transpose: bool


# {i} is the layer index (the row of the stacked Flax leaf); {p} the projection name.
RULES: tuple[Rule, ...] = (
    Rule(r"model\.embed_tokens\.weight", "embed_tokens/embedding", False),
    Rule(r"model\.layers\.(?P<i>\d+)\.self_attn\.(?P<p>[qkvo]_proj)\.weight", "layers/self_attn/{p}/kernel", True),
    Rule(r"model\.layers\.(?P<i>\d+)\.self_attn\.(?P<p>[qkv]_proj)\.bias", "layers/self_attn/{p}/bias", False),
    Rule(r"model\.layers\.(?P<i>\d+)\.mlp\.(?P<p>gate_proj|up_proj|down_proj)\.weight", "layers/mlp/{p}/kernel", True),
    Rule(r"model\.layers\.(?P<i>\d+)\.(?P<p>input_layernorm|post_attention_layernorm)\.weight", "layers/{p}/scale", False),
    Rule(r"model\.norm\.weight", "norm/scale", False),
    Rule(r"lm_head\.weight", "lm_head/kernel", True),
)  # fmt: skip


def hf_to_flax(name: str) -> tuple[str, int | None, bool] | None:
    """(flax path, layer index or None, transpose) for an HF tensor name, or None for tensors the model does
    not use."""
    for rule in RULES:
        m = re.fullmatch(rule.hf, name)
        if m:
            groups = m.groupdict()
            layer = int(groups.pop("i")) if "i" in groups else None
            return rule.flax.format(**groups), layer, rule.transpose
    return None


def flax_to_hf(path: str, layer: int | None = None) -> tuple[str, bool]:
    """(HF tensor name, transpose) for a "/"-joined flax path (and, for a stacked layer leaf, the layer);
    every path the model has must map."""
    for rule in RULES:
        pattern = re.escape(rule.flax).replace(r"\{p\}", r"(?P<p>[a-z_]+)")
        m = re.fullmatch(pattern, path)
        if m:
            if ("(?P<i>" in rule.hf) != (layer is not None):
                raise KeyError(f"flax parameter {path!r} takes {'a' if layer is None else 'no'} layer index")
            name = rule.hf
            for key, value in {**m.groupdict(), "i": str(layer)}.items():
                name = re.sub(rf"\(\?P<{key}>[^)]*\)", value, name, count=1)
            return name.replace("\\", ""), rule.transpose
    raise KeyError(f"no HF name for flax parameter {path!r}")


def is_stacked(path: str) -> bool:
    """Whether a flax leaf holds every layer's copy of a parameter ([L, ...])."""
    return path.startswith("layers/")


def expected_hf_names(config: Qwen2Config) -> set[str]:
    """Every HF tensor name a checkpoint of this config must hold (lm_head only when untied)."""
    names = {"model.embed_tokens.weight", "model.norm.weight"}
    for i in range(config.num_hidden_layers):
        pre = f"model.layers.{i}."
        names |= {pre + f"self_attn.{p}.weight" for p in ("q_proj", "k_proj", "v_proj", "o_proj")}
        names |= {pre + f"self_attn.{p}.bias" for p in ("q_proj", "k_proj", "v_proj")}
        names |= {pre + f"mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        names |= {pre + "input_layernorm.weight", pre + "post_attention_layernorm.weight"}
    if not config.tie_word_embeddings:
        names.add("lm_head.weight")
    return names
