"""Sharding: partition rules, sharded == unsharded (forward and generate) on a 1x4x2 mesh of 8 CPU
devices, and a 2-process jax.distributed forward that agrees with the single-process one."""

from __future__ import annotations

import functools
import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from tests.data import pythonpath
from trainer import sharding
from trainer.model import layers, qwen2
from trainer.model.loading import load_pretrained
from trainer.sampling.sampler import SamplingConfig, generate

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def mesh() -> jax.sharding.Mesh:
    return sharding.make_mesh(1, 4, 2)


def _positions(mask: np.ndarray) -> np.ndarray:
    return np.maximum(np.cumsum(mask, axis=1) - 1, 0).astype(np.int32)


def test_rules_split_matrices_and_replicate_what_does_not_divide(mesh: jax.sharding.Mesh) -> None:
    assert mesh.shape == {"dcn": 1, "dp": 1, "fsdp": 4, "tp": 2}
    assert sharding.param_spec("embed_tokens/embedding", (151936, 64), mesh) == P("tp", "fsdp")
    # Stacked layer parameters [L, ...]: the layer axis is never split (L = 4 here, as large as fsdp).
    assert sharding.param_spec("layers/self_attn/k_proj/kernel", (4, 64, 32), mesh) == P(None, "fsdp", "tp")
    assert sharding.param_spec("layers/mlp/down_proj/kernel", (4, 128, 64), mesh) == P(None, "tp", "fsdp")
    assert sharding.param_spec("layers/post_attention_layernorm/scale", (4, 64), mesh) == P(None, None)
    assert sharding.param_spec("layers/self_attn/q_proj/kernel", (4, 64, 3), mesh) == P(None, "fsdp", None)
    assert sharding.batch_sharding(mesh, (3, 8)).spec == P(None, None)
    assert sharding.kv_cache_sharding(mesh, (2, 4, 16, 2, 16)).spec == P(
        None, ("dcn", "dp", "fsdp"), None, "tp", None
    )
    assert sharding.kv_cache_sharding(mesh, (2, 2, 16, 3, 16)).spec == P(None, None, None, None, None)
    with pytest.raises(KeyError, match="no partition rule"):
        sharding.param_spec("layers/unknown/kernel", (4, 4, 4), mesh)
    with pytest.raises(ValueError, match="received 2x2x1"):
        sharding.make_mesh(2, 2, 1)


def test_attention_projections_split_over_tp_only_in_whole_heads() -> None:
    """With the model's head counts, a tp that does not divide the kv heads keeps k/v_proj whole on each device
    (the 3B's 2 kv heads at rollout.tp 4: no all-gather of each token's keys and values in every layer), while
    the query side still splits; without them, the shapes alone decide, as before. (The decode's tokens in this
    layout: tests/trainer/sampling/test_sampler.py, tp 4 over 2 kv heads.)"""
    mesh = sharding.make_mesh(2, 1, 4)  # (dcn, dp, fsdp, tp) = (1, 2, 1, 4): the 3B seed's decode layout
    K, H, N = 2, 16, 8
    kv_kernel, kv_bias, q_kernel = (4, 64, K * H), (4, K * H), (4, 64, N * H)
    o_kernel = (4, N * H, 64)
    assert sharding.param_spec("layers/self_attn/k_proj/kernel", kv_kernel, mesh) == P(None, "fsdp", "tp")
    for path, shape in [("k_proj/kernel", kv_kernel), ("v_proj/kernel", kv_kernel), ("k_proj/bias", kv_bias)]:
        spec = sharding.param_spec(f"layers/self_attn/{path}", shape, mesh, heads=(N, K))
        assert "tp" not in spec, (path, spec)
    spec = functools.partial(sharding.param_spec, mesh=mesh, heads=(N, K))
    assert spec("layers/self_attn/q_proj/kernel", q_kernel) == P(None, "fsdp", "tp")
    assert spec("layers/self_attn/o_proj/kernel", o_kernel) == P(None, "tp", "fsdp")
    # Query heads that tp does not divide are kept whole too; the MLP is untouched by head counts.
    assert "tp" not in sharding.param_spec("layers/self_attn/o_proj/kernel", (4, 6 * H, 64), mesh, (6, 2))
    assert spec("layers/mlp/down_proj/kernel", (4, 128, 64)) == P(None, "tp", "fsdp")
    # The decode's KV cache then splits by sequence over tp too (each device: its own sequences, both heads);
    # where tp divides the kv heads it splits by head, as before.
    assert not sharding.heads_split(K, mesh) and sharding.heads_split(4, mesh)
    by_sequence, by_head = (
        (None, ("dcn", "dp", "fsdp", "tp"), None, None, None),
        (None, sharding.BATCH, None, "tp", None),
    )
    assert sharding.kv_cache_sharding(mesh, (4, 16, 32, K, H)).spec == P(*by_sequence)
    assert sharding.kv_cache_sharding(mesh, (4, 16, 32, 4, H)).spec == P(*by_head)


def test_a_decode_group_wider_than_the_kv_heads_splits_them_by_head_and_by_sequence() -> None:
    """rollout.tp 4 over 2 kv heads (the 3B presets): the decode mesh's tp group is (tps 2, tp 2). The attention
    and the KV cache split by kv head over tp and by sequence over tps; the MLP, the vocabulary and their weights
    over the whole group, their rows whole within it; the batch splits over dp and tps. (Tokens in this layout:
    tests/trainer/sampling/test_sampler.py, tp 4.)"""
    rmesh = sharding.rollout_mesh(sharding.make_mesh(1, 8, 1), 4, kv_heads=2)
    assert dict(rmesh.shape) == {"dcn": 1, "dp": 2, "fsdp": 1, "tps": 2, "tp": 2}
    plain = sharding.rollout_mesh(sharding.make_mesh(1, 8, 1), 2, kv_heads=2)
    assert dict(plain.shape) == {"dcn": 1, "dp": 4, "fsdp": 1, "tp": 2}

    def same(got: P, *want: object) -> bool:  # size-1 axes (fsdp here) split nothing
        ndim = max(len(got), len(want))
        return NamedSharding(rmesh, got).is_equivalent_to(NamedSharding(rmesh, P(*want)), ndim)

    K, H, N, D, F, V = 2, 16, 8, 64, 128, 151936
    spec = functools.partial(sharding.param_spec, mesh=rmesh, heads=(N, K))
    group, batch = ("tps", "tp"), ("dp", "tps")
    assert same(
        spec("layers/self_attn/k_proj/kernel", (4, D, K * H)), None, None, "tp"
    )  # one kv head a device
    assert same(
        spec("layers/self_attn/q_proj/kernel", (4, D, N * H)), None, None, "tp"
    )  # and its query heads
    assert same(spec("layers/self_attn/o_proj/kernel", (4, N * H, D)), None, "tp", None)
    assert same(spec("layers/mlp/gate_proj/kernel", (4, D, F)), None, None, group)
    assert same(spec("layers/mlp/down_proj/kernel", (4, F, D)), None, group, None)
    assert same(spec("embed_tokens/embedding", (V, D)), group, None)
    assert same(sharding.kv_cache_sharding(rmesh, (4, 16, 32, K, H)).spec, None, batch, None, "tp", None)
    assert same(
        sharding.logical_spec(("batch", "length", "heads", None), (16, 1, N, H), rmesh), batch, None, "tp"
    )
    # A dim over the whole group takes tps from the batch: the MLP's and the logits' rows are whole within it.
    assert same(sharding.logical_spec(("batch", "length", "mlp"), (16, 1, F), rmesh), "dp", None, group)
    assert same(sharding.logical_spec(("group_rows", "length", "embed"), (16, 1, D), rmesh), "dp")
    assert sharding.vocab_ways(V, rmesh) == 4 and sharding.batch_devices(rmesh) == 4
    # The residual stream's rows over the whole group (sequence parallel: partial sums reduce-scattered).
    with jax.set_mesh(rmesh):
        assert layers.residual_rows() == layers.RTD
    assert same(sharding.logical_spec(layers.RTD, (16, 1, D), rmesh), (*batch, "tp"))
    # The fused q|k|v [L, D, K, G + 2, H] and gate|up [L, D, 2, F]: split along the kv heads / the MLP columns,
    # never along their part axis, so each device holds its kv head's q, k and v, and matching gate and up columns.
    G = N // K
    assert same(spec("layers/self_attn/qkv_proj/kernel", (4, D, K, G + 2, H)), None, None, "tp", None, None)
    assert same(spec("layers/self_attn/qkv_proj/bias", (4, K, G + 2, H)), None, "tp", None, None)
    assert same(spec("layers/mlp/gate_up_proj/kernel", (4, D, 2, F)), None, None, None, group)
    # Meshes without tps are as before: the training mesh's rules do not name it.
    mesh = sharding.make_mesh(1, 4, 2)
    assert sharding.param_spec("layers/mlp/gate_proj/kernel", (4, D, F), mesh) == P(None, "fsdp", "tp")
    assert sharding.logical_spec(("batch", "length", "mlp"), (16, 1, F), mesh) == P(
        sharding.BATCH, None, "tp"
    )
    assert sharding.batch_axes(mesh) == sharding.BATCH and sharding.vocab_ways(V, mesh) == 2
    with jax.set_mesh(mesh):  # the training mesh's residual stream is the batch's
        assert layers.residual_rows() == layers.BTD
    with jax.set_mesh(plain):  # and so is a decode mesh whose tp splits the kv heads whole
        assert layers.residual_rows() == layers.BTD
    assert layers.residual_rows() == layers.BTD  # no mesh


def test_sharded_forward_and_generate_equal_unsharded(
    mesh: jax.sharding.Mesh, tiny_model_dir: Path, tiny_f32: tuple, prompts: tuple
) -> None:
    config, params = tiny_f32
    _, sharded = load_pretrained(tiny_model_dir, mesh=mesh, dtype="float32")
    emb = sharded["embed_tokens"]["embedding"]
    assert emb.sharding.spec == P("tp", "fsdp") and len(emb.addressable_shards) == 8
    assert emb.addressable_shards[0].data.shape == (151936 // 2, 64 // 4)
    placed = sharding.shard_params(params, mesh)
    assert jax.tree.map(lambda a, b: a.sharding == b.sharding, placed, sharded) == jax.tree.map(
        lambda _: True, params
    )

    ids, mask = prompts
    batch = sharding.batch_sharding(mesh, ids.shape)
    ids_s, mask_s = jax.device_put(jnp.asarray(ids), batch), jax.device_put(jnp.asarray(mask), batch)
    pos_s = jax.device_put(jnp.asarray(_positions(mask)), batch)
    got = qwen2.forward_logits(sharded, config, ids_s, pos_s, mask_s)
    want = qwen2.forward_logits(
        params, config, jnp.asarray(ids), jnp.asarray(_positions(mask)), jnp.asarray(mask)
    )
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=0)

    sampling = SamplingConfig(6, greedy=True)
    out_s = generate(sharded, config, ids_s, mask_s, jax.random.key(0), sampling, (-1,), 151_643, mesh=mesh)
    out = generate(params, config, ids, mask, jax.random.key(0), sampling, (-1,), 151_643)
    np.testing.assert_array_equal(np.asarray(out_s.completion_ids_BC), np.asarray(out.completion_ids_BC))
    np.testing.assert_allclose(np.asarray(out_s.logprobs_BC), np.asarray(out.logprobs_BC), atol=1e-5)
    # Sampled with the vocabulary left split over tp (sampler.sample_split: no logits all-gather) and read in
    # attention windows: the unsharded masked path's draws.
    hot = SamplingConfig(6, temperature=0.8, block=2)
    out_s = generate(sharded, config, ids_s, mask_s, jax.random.key(3), hot, (-1,), 151_643, mesh=mesh)
    out = generate(params, config, ids, mask, jax.random.key(3), SamplingConfig(6, 0.8), (-1,), 151_643)
    np.testing.assert_array_equal(np.asarray(out_s.completion_ids_BC), np.asarray(out.completion_ids_BC))
    np.testing.assert_allclose(np.asarray(out_s.logprobs_BC), np.asarray(out.logprobs_BC), atol=1e-5)


WORKER = textwrap.dedent(
    """
    import sys
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from trainer import sharding
    from trainer.model import qwen2
    from trainer.model.loading import load_pretrained

    port, pid, model_dir, inputs, out = sys.argv[1:6]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(pid))
    assert jax.device_count() == 4 and jax.local_device_count() == 2
    mesh = sharding.make_mesh(1, 2, 2)
    config, params = load_pretrained(model_dir, mesh=mesh, dtype="float32")
    emb = params["embed_tokens"]["embedding"]
    assert not emb.is_fully_addressable and len(emb.addressable_shards) == 2
    data = np.load(inputs)
    arrays = [
        jax.make_array_from_callback(a.shape, sharding.batch_sharding(mesh, a.shape), lambda i, a=a: a[i])
        for a in (data["ids"], data["pos"], data["mask"])
    ]
    logits = qwen2.forward_logits(params, config, *arrays)
    full = multihost_utils.process_allgather(logits, tiled=True)
    if jax.process_index() == 0:
        np.save(out, np.asarray(full))
    jax.distributed.shutdown()
    """
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_agree_with_one(
    tiny_model_dir: Path, tiny_f32: tuple, prompts: tuple, tmp_path: Path
) -> None:
    config, params = tiny_f32
    ids, mask = prompts
    np.savez(tmp_path / "inputs.npz", ids=ids, pos=_positions(mask), mask=mask)
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "XLA_FLAGS": "--xla_force_host_platform_device_count=2",
        "PYTHONPATH": pythonpath(REPO),
    }
    port = str(_free_port())
    argv = [str(tiny_model_dir), str(tmp_path / "inputs.npz"), str(tmp_path / "logits.npy")]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, port, str(i), *argv],
            env=env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for i in range(2)
    ]
    outputs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], "\n---\n".join(o[-3000:] for o in outputs)
    want = qwen2.forward_logits(
        params, config, jnp.asarray(ids), jnp.asarray(_positions(mask)), jnp.asarray(mask)
    )
    np.testing.assert_allclose(np.load(tmp_path / "logits.npy"), np.asarray(want), atol=1e-5, rtol=0)
