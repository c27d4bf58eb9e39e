"""Each prompt run once for its group of completions (`qwen2.forward_hidden_grouped`, the update's forward): the
hidden states, log-probs and gradients of whole rows [prompt, completion], with XLA's attention and the Pallas
kernel (interpret mode on CPU)."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.trainer.model.grads import assert_grads_close
from trainer import config as trainer_config
from trainer.loop.programs import make_loss_fn, prompt_groups
from trainer.model import attention, flash, qwen2
from trainer.model.config import preset

# U prompts, G samples each (B = U x G rows), P prompt tokens, C completion tokens.
U, G = 2, 3


def _rows(seed: int, vocab: int, P: int, C: int) -> dict[str, np.ndarray]:
    """Left-padded prompts repeated G times (as the rollout's np.repeat), completions that end at different
    lengths (one at its first token)."""
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((U, P), np.int32)
    prompt_mask[0, : P // 2 + 3] = 0
    prompt_mask[1, :1] = 0
    comp_mask = np.ones((U * G, C), np.int32)
    for row, end in enumerate([C, C // 2, 1, C - 3, 5, C]):
        comp_mask[row, end:] = 0
    prompt_ids = rng.integers(0, vocab, (U, P)).astype(np.int32)
    ids = np.concatenate([np.repeat(prompt_ids, G, axis=0), rng.integers(0, vocab, (U * G, C))], axis=1)
    mask = np.concatenate([np.repeat(prompt_mask, G, axis=0), comp_mask], axis=1)
    return {
        "ids": ids.astype(np.int32), "mask": mask, "pos": np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32),
        "comp": ids[:, P:].astype(np.int32), "comp_mask": comp_mask,
        "old_logp": rng.normal(-7.0, 0.5, (U * G, C)).astype(np.float32),  # ratios outside the clip range too
        "adv": np.array([1.3, -0.7, 0.4, -1.1, 0.9, -0.2], np.float32),  # both signs
    }  # fmt: skip


@pytest.mark.parametrize(("attention_impl", "P", "C"), [("xla", 8, 6), ("pallas", 128, 128)])
def test_grouped_forward_gives_the_hidden_states_of_whole_rows(attention_impl: str, P: int, C: int) -> None:
    """Every real prompt position (of each group's first row) and every completion position (padding included:
    its queries see the same keys either way) against forward_hidden of the whole rows."""
    mconf = preset("tiny").replace(vocab_size=1024, dtype="float32", attention=attention_impl)
    params = qwen2.init_params(mconf, jax.random.key(2))
    b = {k: jnp.asarray(v) for k, v in _rows(3, mconf.vocab_size, P, C).items()}
    want = np.asarray(qwen2.forward_hidden(params, mconf, b["ids"], b["pos"], b["mask"]))
    h_UPD, h_BCD = qwen2.forward_hidden_grouped(
        params,
        mconf,
        *(b[k][::G, :P] for k in ("ids", "pos", "mask")),
        *(b[k][:, P:] for k in ("ids", "pos", "mask")),
    )
    assert h_UPD.shape == (U, P, mconf.hidden_size) and h_BCD.shape == (U * G, C, mconf.hidden_size)
    real = np.asarray(b["mask"][::G, :P], bool)
    scale = np.abs(want).max()
    assert np.abs(np.asarray(h_UPD)[real] - want[::G, :P][real]).max() <= 1e-5 * scale
    assert np.abs(np.asarray(h_BCD) - want[:, P:]).max() <= 1e-5 * scale


def shared_prompt_case(
    P: int, C: int
) -> tuple[tuple[jax.Array, ...], jax.Array, jax.Array, jax.Array, jax.Array]:
    """Completions over their group's shared prompt, float32: (q [B, C, N, H], the prompts' k and v [U, P, K, H],
    the completions' k and v [B, C, K, H]), the prompts' [U, P] and completions' [B, C] attention masks, a
    cotangent on real queries only, and the [B, C, P + C] mask the grouped XLA forward builds."""
    K, N, H = 2, 4, 32
    rng = np.random.default_rng(4)
    q = jnp.asarray(rng.normal(0, 1, (U * G, C, N, H)), jnp.float32)
    kp, vp = (jnp.asarray(rng.normal(0, 1, (U, P, K, H)), jnp.float32) for _ in range(2))
    kc, vc = (jnp.asarray(rng.normal(0, 1, (U * G, C, K, H)), jnp.float32) for _ in range(2))
    rows = _rows(5, 16, P, C)
    prompt_mask, comp_mask = jnp.asarray(rows["mask"][::G, :P]), jnp.asarray(rows["comp_mask"])
    g = jnp.asarray(rng.normal(0, 1, q.shape) * rows["comp_mask"][:, :, None, None], jnp.float32)
    over_prompt = jnp.broadcast_to(jnp.repeat(prompt_mask.astype(bool), G, axis=0)[:, None, :], (U * G, C, P))
    full_mask = jnp.concatenate([over_prompt, qwen2.causal_mask(comp_mask)], axis=-1)
    return (q, kp, vp, kc, vc), prompt_mask, comp_mask, g, full_mask


def test_pallas_after_prompt_matches_the_shared_prompt_reference_with_gradients() -> None:
    """The kernel over [group's prompt, own keys] against attention.attend_shared_prompt over the mask the grouped
    XLA forward builds: outputs on real queries, and the gradients of q, both prompts' k and v (summed over their
    group) and the completions' k and v."""
    (q, kp, vp, kc, vc), prompt_mask, comp_mask, g, full_mask = shared_prompt_case(128, 128)

    def value_and_grads(attend: Any) -> Any:
        def loss(q: jax.Array, kp: jax.Array, vp: jax.Array, kc: jax.Array, vc: jax.Array) -> Any:
            out = attend(q, kp, vp, kc, vc)
            return jnp.sum(out * g), out

        return jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3, 4), has_aux=True))(q, kp, vp, kc, vc)

    (_, want), want_grads = value_and_grads(
        lambda q, kp, vp, kc, vc: attention.attend_shared_prompt(q, kp, vp, kc, vc, full_mask)
    )
    (_, got), got_grads = value_and_grads(
        lambda q, kp, vp, kc, vc: flash.attend_flash_after_prompt(q, kp, vp, kc, vc, prompt_mask, comp_mask)
    )
    real = np.asarray(comp_mask, bool)
    assert np.isfinite(np.asarray(got)).all(), "padding queries must stay finite"
    scale = np.abs(np.asarray(want)[real]).max()
    assert np.abs(np.asarray(got)[real] - np.asarray(want)[real]).max() <= 1e-5 * scale
    for name, a, b in zip(
        ("q", "k prompt", "v prompt", "k own", "v own"), got_grads, want_grads, strict=True
    ):
        err = np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max()
        assert err <= 1e-5, f"d{name}: error {err:.2e}"


@pytest.mark.parametrize(
    ("attention_impl", "P", "C"),
    [("xla", 8, 6), pytest.param("pallas", 128, 128, marks=pytest.mark.slow)],
)
def test_update_loss_and_gradients_equal_with_each_prompt_once(attention_impl: str, P: int, C: int) -> None:
    """The update's loss function (forward, GRPO objective, backward through both layers) with train.shared_prompt
    on and off: the same loss and parameter gradients (each leaf within 1e-4 of its largest: float32 summation
    order, amplified through two layers and the log-softmax); the prompts' gradients arrive from every sample."""
    mconf = preset("tiny").replace(vocab_size=1024, dtype="float32", attention=attention_impl)
    params = qwen2.init_params(mconf, jax.random.key(0))
    sets = [f"rollout.max_new_tokens={C}", f"data.prompt_buckets=[{P}]", f"rollout.samples_per_prompt={G}"]
    rows = _rows(6, mconf.vocab_size, P, C)
    batch = {k: jnp.asarray(v) for k, v in rows.items()}
    tokens = jnp.float32(rows["comp_mask"].sum())

    def run(shared: bool) -> tuple[jax.Array, Any]:
        cfg = trainer_config.load("tiny", [*sets, f"train.shared_prompt={str(shared).lower()}"])
        assert prompt_groups(cfg, U * G, P, attention_impl) == (G if shared else 1)
        loss_fn = make_loss_fn(cfg, mconf, P, "reference")
        (loss, _), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, batch, tokens)
        return loss, grads

    want_loss, want_grads = run(False)
    got_loss, got_grads = run(True)
    np.testing.assert_allclose(float(got_loss), float(want_loss), rtol=1e-5)
    assert_grads_close(got_grads, want_grads, 1e-4)


def test_prompts_run_once_only_for_whole_groups() -> None:
    """A micro-batch (on a slice) of whole groups: G; rows that split a group, the setting off, or the Pallas
    attention over a completion that is not a multiple of 128 tokens: every row its own prompt."""
    cfg = trainer_config.load("tiny", ["rollout.samples_per_prompt=4", "rollout.max_new_tokens=128"])
    assert prompt_groups(cfg, 8, 128, "pallas") == 4
    assert prompt_groups(cfg, 8, 8, "xla") == 4
    assert prompt_groups(cfg, 6, 8, "xla") == 1
    assert prompt_groups(cfg, 8, 100, "pallas") == 1
    off = trainer_config.load("tiny", ["rollout.samples_per_prompt=4", "train.shared_prompt=false"])
    assert prompt_groups(off, 8, 8, "xla") == 1


def test_after_prompt_kernel_refuses_shapes_it_cannot_run() -> None:
    """Rows that the prompts do not divide into groups, and a completion that is not a multiple of 128 tokens, are
    refused with the shapes received, before the kernel."""
    q, kp = jnp.ones((6, 128, 4, 32)), jnp.ones((4, 128, 2, 32))
    kc, masks = jnp.ones((6, 128, 2, 32)), (jnp.ones((4, 128), jnp.int32), jnp.ones((6, 128), jnp.int32))
    with pytest.raises(ValueError, match=r"U dividing B, received \(6, 128, 4, 32\), \(4, 128, 2, 32\)"):
        flash.attend_flash_after_prompt(q, kp, kp, kc, kc, *masks)
    q, kp, kc = q[:, :100], kp[:3], kc[:, :100]
    with pytest.raises(ValueError, match=r"multiple of 128 .*received 100"):
        flash.attend_flash_after_prompt(q, kp, kp, kc, kc, masks[0][:3], masks[1][:, :100])
