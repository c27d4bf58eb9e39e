"""`train.attention_impl: cudnn` (trainer/model/fused.py) against the xla attention: outputs and gradients of the
self-attention (left and right padding, grouped-query heads) and of a group's completions over their shared
prompt, and a tiny model's update loss and parameter gradients. On CPU the call runs jax's XLA implementation of
`jax.nn.dot_product_attention` (cuDNN's kernel needs a GPU): what is checked is this trainer's side of the call,
the masks, the grouping and the head layout. Tolerances as tests/trainer/model/test_flash.py's."""

from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer.model.grads import assert_grads_close
from tests.trainer.model.test_flash import TOL, _close, _draw, _value_and_grads
from tests.trainer.model.test_grouped import G, _rows, shared_prompt_case
from trainer import config as trainer_config
from trainer.kernels.logprob.blocks import compile_target
from trainer.loop.programs import make_loss_fn
from trainer.model import attention, flash, fused, qwen2
from trainer.model.config import preset


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_fused_self_attention_matches_attend_with_padding_and_gqa(dtype: Any) -> None:
    """Real queries' outputs; gradients of q, k and v everywhere (padding queries carry no cotangent, and no real
    query sees a padding key); a left-padding query, which sees no real key, stays finite."""
    q, k, v, mask, g = _draw(0, dtype, b=2, t=128)
    causal = qwen2.causal_mask(mask)
    want_out, want_grads = _value_and_grads(lambda q, k, v: attention.attend(q, k, v, causal), q, k, v, g)
    got_out, got_grads = _value_and_grads(lambda q, k, v: fused.attend_fused(q, k, v, causal), q, k, v, g)
    assert fused.backend() == "xla"  # this CPU runs jax's reference of the call; a GPU runs cuDNN's kernel
    assert got_out.dtype == dtype and np.isfinite(np.asarray(got_out, np.float32)).all()
    real = np.asarray(mask, bool)
    _close(got_out, want_out, real, TOL[dtype], "output")
    for name, got, want in zip("qkv", got_grads, want_grads, strict=True):
        _close(got, want, np.ones_like(real), TOL[dtype], f"d{name}")


def test_fused_over_a_shared_prompt_matches_the_reference_with_gradients() -> None:
    """Completions over [their group's prompt, their own keys] under the mask the grouped forward builds, against
    attention.attend_shared_prompt: outputs on real queries; gradients of q, the prompts' k and v (summed over
    their group) and the completions' k and v."""
    (q, kp, vp, kc, vc), _, comp_mask, g, full_mask = shared_prompt_case(16, 12)

    def value_and_grads(attend: Any) -> Any:
        def loss(*args: jax.Array) -> Any:
            out = attend(*args, full_mask)
            return jnp.sum(out * g), out

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(q, kp, vp, kc, vc)

    (_, want), want_grads = value_and_grads(attention.attend_shared_prompt)
    (_, got), got_grads = value_and_grads(fused.attend_fused_shared_prompt)
    real = np.asarray(comp_mask, bool)
    assert np.isfinite(np.asarray(got)).all()
    _close(got, want, real, 1e-5, "output")
    for name, a, b in zip(
        ("q", "k prompt", "v prompt", "k own", "v own"), got_grads, want_grads, strict=True
    ):
        _close(a, b, np.ones(np.shape(b)[:2], bool), 1e-5, f"d{name}")


@pytest.mark.parametrize("shared", [False, True], ids=["whole-rows", "prompt-once"])
def test_update_loss_and_gradients_equal_with_cudnn_and_xla_attention(shared: bool) -> None:
    """The update's loss function (forward through both layers, GRPO objective, backward) with each row's whole
    sequence and with each group's prompt run once: cudnn and xla give the same loss and parameter gradients
    (each leaf within 1e-4 of its largest, as tests/trainer/model/test_grouped.py's)."""
    P, C = 8, 6
    sets = [f"rollout.max_new_tokens={C}", f"data.prompt_buckets=[{P}]", f"rollout.samples_per_prompt={G}",
            f"train.shared_prompt={str(shared).lower()}"]  # fmt: skip
    batch = {k: jnp.asarray(v) for k, v in _rows(6, 1024, P, C).items()}
    tokens = jnp.float32(np.asarray(batch["comp_mask"]).sum())

    def run(impl: str) -> tuple[jax.Array, Any]:
        cfg = trainer_config.load("tiny", [*sets, f"train.attention_impl={impl}"])
        mconf = preset("tiny").replace(vocab_size=1024, dtype="float32", attention=flash.resolve(impl, P + C))
        params = qwen2.init_params(mconf, jax.random.key(0))
        loss_fn = make_loss_fn(cfg, mconf, P, "reference")
        (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch, tokens)
        return loss, grads

    want_loss, want_grads = run("xla")
    got_loss, got_grads = run("cudnn")
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-5)
    assert_grads_close(got_grads, want_grads, 1e-4)


def test_cudnn_is_refused_on_a_tpu_and_with_odd_lengths() -> None:
    assert flash.resolve("cudnn", 14, on_tpu=False) == "cudnn"
    with pytest.raises(
        ValueError, match=r"cuDNN's fused attention for GPUs; on a TPU set train\.attention_impl=auto"
    ):
        flash.resolve("cudnn", 1536, on_tpu=True)
    with pytest.raises(
        ValueError, match=r"needs every prompt bucket and rollout.max_new_tokens even.*\[7, 8\]"
    ):
        trainer_config.load(
            "tiny", ["train.attention_impl=cudnn", "data.prompt_buckets=[8]", "rollout.max_new_tokens=7"]
        )
    cfg = trainer_config.load(
        "tiny", ["train.attention_impl=cudnn", "data.prompt_buckets=[8]", "rollout.max_new_tokens=6"]
    )
    assert cfg.train.attention_impl == "cudnn"


def test_a_tpu_compile_of_cudnn_attention_is_one_config_line(capsys: pytest.CaptureFixture[str]) -> None:
    from trainer.fit.__main__ import EXIT_CONFIG, main

    assert (
        main(["--config", "tiny", "--accelerator", "v6e-8", "--set", "train.attention_impl=cudnn"])
        == EXIT_CONFIG
    )
    err = capsys.readouterr().err.strip()
    assert err == f"config: {flash.CUDNN_ON_TPU}" and "\n" not in err


@pytest.mark.parametrize("shared", [False, True], ids=["whole-rows", "prompt-once"])
def test_the_update_lowered_for_a_gpu_runs_cudnn_flash_attention_and_writes_no_float32_scores(
    shared: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tiny model's update (forward, GRPO loss, backward) lowered for CUDA as a GPU would compile it: with
    cudnn, every attention is cuDNN's flash-attention custom call, forward and backward, and no [T, S] float32
    scores are left; the xla lowering of the same update has them (what the test would miss otherwise). No
    cuDNN here: its version query answers 9.10 (jax's shape checks run on that and the shapes); the kernels are
    built for a GPU compile target, as bench/device_aot.py builds them."""
    import jax._src.cudnn.fused_attention_stablehlo as cudnn_attention

    monkeypatch.setattr(cudnn_attention, "cuda_versions", type("V", (), {"cudnn_get_version": lambda: 91000}))
    P, C = 16, 8
    sets = [f"rollout.max_new_tokens={C}", f"data.prompt_buckets=[{P}]", f"rollout.samples_per_prompt={G}",
            f"train.shared_prompt={str(shared).lower()}"]  # fmt: skip
    batch = {k: jnp.asarray(v) for k, v in _rows(6, 1024, P, C).items()}
    tokens = jnp.float32(np.asarray(batch["comp_mask"]).sum())
    # the scores' [T, S]: each row's whole sequence; or a prompt over itself and completions over prompt + own
    scores = re.compile(r"x(24x24|16x16|8x24)xf32>")

    def lowered(impl: str) -> str:
        cfg = trainer_config.load("tiny", [*sets, f"train.attention_impl={impl}"])
        mconf = preset("tiny").replace(
            vocab_size=1024, dtype="bfloat16", attention=flash.resolve(impl, P + C)
        )
        params = qwen2.init_params(mconf, jax.random.key(0))
        loss_fn = make_loss_fn(cfg, mconf, P, "reference")
        traced = jax.jit(jax.value_and_grad(loss_fn, has_aux=True)).trace(params, batch, tokens)
        return str(traced.lower(lowering_platforms=("cuda",)).as_text())

    with compile_target("gpu NVIDIA H200"):
        assert fused.backend() == "cudnn"
        xla, cudnn = lowered("xla"), lowered("cudnn")
    assert "__cudnn$fmha" not in xla and scores.search(xla)
    calls = set(re.findall(r"custom_call @(__cudnn\$fmha\w+)", cudnn))
    assert calls == {"__cudnn$fmhaScaleBiasSoftmax", "__cudnn$fmhaScaleBiasSoftmaxBackward"}
    assert not scores.search(cudnn)
