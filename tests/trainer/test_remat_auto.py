"""`train.remat: auto`: the policy that keeps the most activations and still leaves 10% of the device's memory
free (trainer.loop.remat.pick on given numbers), and the update resolving it from real compiles on the CPU."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from trainer import config
from trainer.fit import programs
from trainer.kernels import resolve_impl
from trainer.layout import OnMesh, init_opt_state
from trainer.loop.programs import make_update, optimizer
from trainer.loop.remat import ORDER, AutoUpdate, device_memory, pick, update_program
from trainer.model.qwen2 import Qwen2

GB = 10**9


def test_the_first_policy_that_fits_in_ninety_percent_wins() -> None:
    # 40 GB device: 36 GB usable. none does not fit, dots does: full is never compiled.
    assert pick({"none": 50 * GB}, 40 * GB) is None  # dots still to compile
    choice = pick({"none": 50 * GB, "dots": 30 * GB}, 40 * GB)
    assert choice is not None and choice.policy == "dots"
    assert choice.peaks == {"none": 50 * GB, "dots": 30 * GB}
    assert choice.why == "dots: peak 30.00 GB fits in 36.00 GB (90% of 40.00 GB); none 50.00 GB over it"


def test_none_wins_when_it_fits_and_nothing_else_is_compiled() -> None:
    choice = pick({"none": 10 * GB}, 40 * GB)
    assert choice is not None and (choice.policy, choice.peaks) == ("none", {"none": 10 * GB})


def test_the_headroom_is_ten_percent_to_the_byte() -> None:
    device = 100 * GB
    at = pick({"none": 90 * GB}, device)
    over = pick({"none": 90 * GB + 1}, device)
    assert at is not None and at.policy == "none"
    assert over is None  # one byte over 90%: dots is compiled next


def test_a_candidate_too_big_to_compile_counts_as_not_fitting() -> None:
    choice = pick({"none": None, "dots": None, "mlp_up": 20 * GB}, 32 * GB)
    assert choice is not None and choice.policy == "mlp_up"
    assert "none over the device at compile, dots over the device at compile over it" in choice.why


def test_the_mlp_up_projection_is_kept_before_everything_is_recomputed() -> None:
    # A v6e's 32 GiB a device: mlp_up at 30.72 GB (the seed's update, docs/performance.md) is within 90% of it.
    assert ORDER == ("none", "dots", "mlp_up", "full")
    assert pick({"none": None, "dots": None}, 34_359_738_368) is None  # mlp_up still to compile
    choice = pick({"none": None, "dots": None, "mlp_up": 30_720_138_848}, 34_359_738_368)
    assert choice is not None and choice.policy == "mlp_up" and "full" not in choice.peaks
    over = pick({"none": None, "dots": None, "mlp_up": 31 * GB, "full": 16 * GB}, 34_359_738_368)
    assert over is not None and over.policy == "full"


def test_when_nothing_fits_full_needs_the_least() -> None:
    choice = pick({"none": 80 * GB, "dots": 50 * GB, "mlp_up": 40 * GB, "full": 35 * GB}, 32 * GB)
    assert choice is not None and choice.policy == "full"
    assert choice.why.startswith(
        "full: no policy fits in 28.80 GB (none 80.00 GB, dots 50.00 GB, mlp_up 40.00 GB, full 35.00 GB)"
    )


def test_without_a_known_memory_limit_auto_is_none_and_compiles_nothing() -> None:
    choice = pick({}, None)
    assert choice is not None and (choice.policy, choice.peaks) == ("none", {})
    assert device_memory(jax.devices("cpu")[0]) is None  # the CPU reports no limit


def test_auto_is_a_config_value_and_the_seed_preset_uses_it() -> None:
    assert config.load("tiny", ["train.remat=auto"]).train.remat == "auto"
    assert config.load("qwen2.5-3b-v6e-8-seed").train.remat == "auto"
    with pytest.raises(config.ConfigError):
        config.load("tiny", ["train.remat=most"])


def _tiny_update_args() -> tuple[
    config.Config, object, int, str, tuple[object, object], dict[str, np.ndarray]
]:
    cfg = config.load("tiny", ["train.remat=auto"])
    mconf = programs.model_config(cfg)
    mesh = programs.training_mesh(cfg, jax.devices()[:1])
    ids = jax.numpy.zeros((1, 2), jax.numpy.int32)
    params = jax.jit(lambda: Qwen2(mconf).init(jax.random.key(0), ids, method=Qwen2.init_all)["params"])()
    params = jax.device_put(params, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
    opt_state = init_opt_state(optimizer(cfg), params, mesh)(params)
    N, P_len, C = cfg.sequences_per_step, max(cfg.data.prompt_buckets), cfg.rollout.max_new_tokens
    rng = np.random.default_rng(0)
    mask = np.ones((N, P_len + C), np.int32)
    batch = {
        "ids": rng.integers(0, mconf.vocab_size, (N, P_len + C)).astype(np.int32), "mask": mask,
        "pos": np.cumsum(mask, axis=1).astype(np.int32) - 1,
        "comp": rng.integers(0, mconf.vocab_size, (N, C)).astype(np.int32), "comp_mask": np.ones((N, C), np.int32),
        "old_logp": -rng.random((N, C)).astype(np.float32), "adv": rng.standard_normal(N).astype(np.float32),
    }  # fmt: skip
    return cfg, mconf, P_len, resolve_impl(cfg.train.loss_impl, "cpu"), (params, opt_state), batch


@pytest.mark.slow  # up to four CPU compiles of the tiny update (about 25 s on a 2-core CPU)
@pytest.mark.parametrize(
    ("device_bytes", "policy", "compiled"), [(10**15, "none", ["none"]), (1, "full", list(ORDER))]
)
def test_auto_resolves_from_the_cpu_compile_and_runs_the_winners_executable(
    device_bytes: int, policy: str, compiled: list[str]
) -> None:
    """With a given device memory, the real update compiled on the CPU: ample memory keeps none after one
    compile; a device too small for any compiles all four and keeps full. The step it runs equals the plain
    update's at that policy (same loss and weights)."""
    cfg, mconf, P_len, impl, (params, opt_state), batch = _tiny_update_args()
    said: list[str] = []
    auto = AutoUpdate(
        cfg, mconf, P_len, impl, (params, opt_state), device_bytes=device_bytes, say=said.append
    )
    plain = make_update(
        config.with_sets(cfg, [f"train.remat={policy}"]), mconf, P_len, impl, (params, opt_state)
    )
    copy = jax.tree_util.tree_map(jax.numpy.copy, (params, opt_state))
    steps = np.int32(cfg.train.steps)
    got_params, _, got = auto(params, opt_state, batch, steps)
    want_params, _, want = plain(*copy, batch, steps)
    assert auto.choice is not None and auto.choice.policy == policy
    assert list(auto.choice.peaks) == compiled and all(
        p is not None and p > 0 for p in auto.choice.peaks.values()
    )
    assert said == [f"remat auto: {auto.choice.why}"]
    assert float(got["loss"]) == pytest.approx(float(want["loss"]), rel=1e-5)
    for a, b in zip(
        jax.tree_util.tree_leaves(got_params), jax.tree_util.tree_leaves(want_params), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)


def test_on_the_cpu_auto_is_the_plain_update_at_none() -> None:
    cfg, mconf, P_len, impl, like, batch = _tiny_update_args()
    update = update_program(cfg, mconf, P_len, impl, like, say=lambda _: None)
    assert isinstance(update, AutoUpdate) and update.device_bytes is None
    params, opt_state = like
    _, _, out = update(params, opt_state, batch, np.int32(cfg.train.steps))
    assert update.choice is not None and update.choice.policy == "none" and update.choice.peaks == {}
    assert np.isfinite(float(out["loss"]))


@pytest.mark.slow  # three CPU compiles of the tiny update
def test_mlp_up_takes_the_same_step_as_none_and_keeps_more_than_full() -> None:
    """What a layer keeps for the backward pass changes what is recomputed, not the step: mlp_up's loss and weights
    equal none's (full's: test_auto_resolves_from_the_cpu_compile_and_runs_the_winners_executable). mlp_up keeps
    the up projection, so its compiled update holds more than full's."""
    cfg, mconf, P_len, impl, (params, opt_state), batch = _tiny_update_args()
    steps, out, temp = np.int32(cfg.train.steps), {}, {}
    for policy in ("none", "mlp_up", "full"):
        update = make_update(
            config.with_sets(cfg, [f"train.remat={policy}"]), mconf, P_len, impl, (params, opt_state)
        )
        copy = jax.tree_util.tree_map(jax.numpy.copy, (params, opt_state))
        compiled = update.lower(*copy, batch, steps).compile()
        temp[policy] = compiled.memory_analysis().temp_size_in_bytes
        if policy != "full":
            got_params, _, got = OnMesh(compiled, update.mesh)(*copy, batch, steps)  # that compile, run
            out[policy] = (float(got["loss"]), got_params)
    assert temp["mlp_up"] > temp["full"]
    assert out["mlp_up"][0] == pytest.approx(out["none"][0], rel=1e-5)
    for a, b in zip(
        jax.tree_util.tree_leaves(out["mlp_up"][1]), jax.tree_util.tree_leaves(out["none"][1]), strict=True
    ):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5, atol=1e-6)
