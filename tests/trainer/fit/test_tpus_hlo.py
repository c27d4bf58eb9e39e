"""The accelerator table and the HLO readers: loop counts, collectives and matmul FLOPs (synthetic
texts, and one small compile for a v6e-8 with libtpu)."""

from __future__ import annotations

import pytest

from trainer.fit import flops, hlo, tpus, traffic
from trainer.fit.__main__ import _quiet_libtpu


@pytest.mark.parametrize(
    ("accelerator", "topology", "chips"),
    [("v6e-8", "v6e:2x4", 8), ("v6e-16", "v6e:4x4", 16), ("v4-8", "v4:2x2x1", 4), ("v5litepod-8", "v5e:2x4", 8),
     ("v5p-8", "v5p:2x2x1", 4), ("v5e-1", "v5e:1x1", 1), ("tpu7x-8", "tpu7x:2x2x1", 4),
     ("tpu7x-16", "tpu7x:2x2x2", 8)],
)  # fmt: skip
def test_accelerator_maps_to_topology(accelerator: str, topology: str, chips: int) -> None:
    t = tpus.from_accelerator(accelerator)
    assert (t.topology, t.chips) == (topology, chips)
    assert tpus.from_topology(topology).chips == chips


def test_per_device_figures_split_a_chip_between_its_devices() -> None:
    v4 = tpus.from_accelerator("v4-8")  # JAX shows 8 TensorCores for 4 chips
    assert v4.per_device(8)["hbm_bytes"] == 16 * tpus.GIB
    v6e = tpus.from_accelerator("v6e-8")
    assert v6e.per_device(8) == {
        "hbm_bytes": 32 * tpus.GIB,
        "flops": 918e12,
        "hbm_bw": 1638e9,
        "ici_bw": 400e9,
        "link_bw": 100e9,
        "hop_latency_s": 1e-6,
    }


def test_tpu7x_figures_are_per_chip_split_over_its_two_devices() -> None:
    """TPU7x (Ironwood): 192 GiB HBM, 2307 TFLOP/s bf16 per chip, no megacore: JAX shows 2 devices per chip."""
    t = tpus.from_accelerator("tpu7x-8")
    assert (t.topology, t.chips, t.chip.hbm_bytes) == ("tpu7x:2x2x1", 4, 192 * tpus.GIB)
    per = t.per_device(8)
    assert {k: per[k] for k in ("hbm_bytes", "flops", "hbm_bw", "ici_bw")} == {
        "hbm_bytes": 96 * tpus.GIB, "flops": 2307e12 / 2, "hbm_bw": 7370e9 / 2, "ici_bw": 600e9 / 2,
    }  # fmt: skip


@pytest.mark.parametrize("bad", ["v6e", "v9-8", "v6e-3", "tpu"])
def test_unknown_accelerator_names_the_known_forms(bad: str) -> None:
    with pytest.raises(tpus.UnknownAcceleratorError, match="v6e"):
        tpus.from_accelerator(bad)


HLO = """
  %all-gather.1 = bf16[1024,2048]{1,0} all-gather(bf16[128,2048]{1,0} %p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %rs = f32[256,64]{1,0} reduce-scatter(f32[2048,64]{1,0} %g), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %ar = f32[] all-reduce(f32[] %x), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %ags = (bf16[16,8]{1,0}, bf16[64,8]{1,0}) all-gather-start(bf16[16,8]{1,0} %q), replica_groups=[2,4]<=[8], dimensions={0}
  %cps = (bf16[224,512]{1,0}, bf16[224,512]{1,0}, u32[], u32[]) collective-permute-start(%w), source_target_pairs={{0,1},{1,0}}
  %add.7 = f32[8]{0} add(f32[8]{0} %a, f32[8]{0} %b)
"""


def test_collectives_read_result_bytes_group_sizes_and_async_starts() -> None:
    got = hlo.collectives(HLO, devices=8)
    assert got["all-gather"] == 1024 * 2048 * 2 + 64 * 8 * 2  # the async start's result, not its operand
    assert got["reduce-scatter"] == 256 * 64 * 4
    assert got["all-reduce"] == 4
    # libtpu's permute start is (operand, result, u32[] contexts): the result's bytes, not the contexts'
    assert got["collective-permute"] == 224 * 512 * 2
    moved = 1024 * 2048 * 2 * 7 / 8 + 256 * 64 * 4 * 7 + 2 * 4 * 1 / 2 + 64 * 8 * 2 * 3 / 4 + 224 * 512 * 2
    assert got["moved"] == int(moved)


def test_collective_groups_over_named_mesh_axes() -> None:
    """libtpu's newer form: the groups span the axes in braces (here 4 of the 8 devices)."""
    line = (
        "  %ag = bf16[1,512,512]{2,1,0} all-gather(%w), channel_id=14, "
        "replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}, dimensions={1}, use_global_device_ids=true"
    )
    got = hlo.collectives(line, devices=8)
    assert (got["all-gather"], got["moved"]) == (512 * 512 * 2, 512 * 512 * 2 * 3 // 4)


# A decode-like program as libtpu compiles it: a weight prefetched into VMEM (S(1)) and read there by a matmul
# fusion whose body holds a no-op bitcast fusion, an embedding row gather inside a fusion, an in-place cache
# update in a loop body, and an all-gather.
NESTED_HLO = """
%fused_matmul (p0: bf16[32,256], p1: bf16[256,256]) -> bf16[32,256] {
  %p0 = bf16[32,256]{1,0} parameter(0)
  %p1 = bf16[256,256]{1,0} parameter(1)
  ROOT %conv = bf16[32,256]{1,0} convolution(%p0, %p1), dim_labels=bf_io->bf
}

%layer_body (lp: (s32[], bf16[32,256], bf16[3,64,256])) -> (s32[], bf16[32,256], bf16[3,64,256]) {
  %lp = (s32[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) parameter(0)
  %i = s32[] get-tuple-element(%lp), index=0
  %i.copy = s32[]{:T(128)S(6)} copy(%i)
  %x = bf16[32,256]{1,0} get-tuple-element(%lp), index=1
  %ws = bf16[3,64,256]{2,1,0} get-tuple-element(%lp), index=2
  %zero = s32[] constant(0)
  %w = bf16[1,64,256]{2,1,0} dynamic-slice(%ws, %i.copy, %zero, %zero), dynamic_slice_sizes={1,64,256}
  %ag = bf16[1,256,256]{2,1,0} all-gather(%w), channel_id=1, replica_groups=[2,4]<=[8], dimensions={1}
  %wb = bf16[256,256]{1,0} bitcast(%ag)
  %y = bf16[32,256]{1,0} fusion(%x, %wb), kind=kOutput, calls=%fused_matmul, metadata={op_name="jit(f)/while/body/layers/dot"}
  %one = s32[] constant(1)
  %next = s32[] add(%i.copy, %one)
  ROOT %lt = (s32[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) tuple(%next, %y, %ws)
}

%layer_cond (lc: (s32[], bf16[32,256], bf16[3,64,256])) -> pred[] {
  %lc = (s32[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) parameter(0)
  %n = s32[] constant(3)
  %m = s32[] constant(2)
  %j = s32[] get-tuple-element(%lc), index=0
  %data = s32[] get-tuple-element(%lc), index=1
  ROOT %stop = pred[] COMPARE
}

%decode_body (dp: (s32[], pred[], bf16[32,256], bf16[3,64,256])) -> (s32[], pred[], bf16[32,256], bf16[3,64,256]) {
  %dp = (s32[], pred[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) parameter(0)
  %s = s32[] get-tuple-element(%dp), index=0
  %done = pred[] get-tuple-element(%dp), index=1
  %h = bf16[32,256]{1,0} get-tuple-element(%dp), index=2
  %stack = bf16[3,64,256]{2,1,0} get-tuple-element(%dp), index=3
  %c0 = s32[] constant(0)
  %c0.copy = s32[] copy(%c0)
  %init = (s32[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) tuple(%c0.copy, %h, %stack)
  %layers = (s32[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) while(%init), condition=%layer_cond, body=%layer_body
  %h2 = bf16[32,256]{1,0} get-tuple-element(%layers), index=1
  %c1 = s32[] constant(1)
  %s1 = s32[] add(%s, %c1)
  ROOT %dt = (s32[], pred[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) tuple(%s1, %done, %h2, %stack)
}

%decode_cond (dc: (s32[], pred[], bf16[32,256], bf16[3,64,256])) -> pred[] {
  %dc = (s32[], pred[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) parameter(0)
  %t = s32[] get-tuple-element(%dc), index=0
  %limit = s32[] constant(511)
  %c1.c = s32[] constant(1)
  %t1 = s32[] add(%t, %c1.c)
  %more = pred[] compare(%t1, %limit), direction=LT
  %d = pred[] get-tuple-element(%dc), index=1
  %notdone = pred[] not(%d)
  ROOT %go = pred[] and(%more, %notdone)
}

%sum_body (sp: (s32[], f32[1024])) -> (s32[], f32[1024]) {
  %sp = (s32[], f32[1024]{0}) parameter(0)
  %k = s32[] get-tuple-element(%sp), index=0
  %v = f32[1024]{0} get-tuple-element(%sp), index=1
  %ar = f32[1024]{0} all-reduce(%v), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  ROOT %st = (s32[], f32[1024]{0}) tuple(%k, %ar)
}

%sum_cond (sc: (s32[], f32[1024])) -> pred[] {
  %sc = (s32[], f32[1024]{0}) parameter(0)
  ROOT %always = pred[] constant(true)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %ab = f32[] add(%a, %b)
}

ENTRY %main (h0: bf16[32,256], ws0: bf16[3,64,256], v0: f32[1024]) -> bf16[32,256] {
  %h0 = bf16[32,256]{1,0} parameter(0)
  %ws0 = bf16[3,64,256]{2,1,0} parameter(1)
  %v0 = f32[1024]{0} parameter(2)
  %zero.e = s32[] constant(0)
  %false = pred[] constant(false)
  %state = (s32[], pred[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) tuple(%zero.e, %false, %h0, %ws0)
  %decode = (s32[], pred[], bf16[32,256]{1,0}, bf16[3,64,256]{2,1,0}) while(%state), condition=%decode_cond, body=%decode_body
  %sums = (s32[], f32[1024]{0}) tuple(%zero.e, %v0)
  %summed = (s32[], f32[1024]{0}) while(%sums), condition=%sum_cond, body=%sum_body, backend_config={"known_trip_count":{"n":"5"}}
  ROOT %out = bf16[32,256]{1,0} get-tuple-element(%decode), index=2
}
"""
SCAN_PATTERN = NESTED_HLO.replace("COMPARE", "compare(%j, %n), direction=LT")


@pytest.mark.parametrize(
    ("compare", "layers"),
    [("compare(%j, %n), direction=LT", 3), ("compare(%n, %j), direction=GT", 3), ("compare(%j, %m), direction=LE", 3),
     ("compare(%j, %data), direction=LT", 1)],  # the bound is data: unknown, counted once
)  # fmt: skip
def test_loop_bodies_run_their_trip_count_and_unknown_loops_once(compare: str, layers: int) -> None:
    counts = hlo.parse(NESTED_HLO.replace("COMPARE", compare)).counts
    assert counts["main"] == counts["decode_body"] == counts["decode_cond"] == 1  # data-dependent: once
    assert counts["layer_body"] == counts["fused_matmul"] == layers  # a fusion in the body inherits
    assert counts["layer_cond"] == (layers + 1 if layers > 1 else 1)  # tested once more than the body runs
    assert (counts["sum_body"], counts["sum_cond"], counts["add"]) == (5, 6, 5)  # known_trip_count


def test_a_counted_loop_that_also_stops_on_data_runs_its_count_at_most() -> None:
    """`i < N and not done` (the sampler's decode segments): N trips, the worst case."""
    counts = hlo.parse(SCAN_PATTERN.replace("compare(%t1, %limit)", "compare(%t, %limit)")).counts
    assert counts["decode_body"] == 511 and counts["layer_body"] == 511 * 3 and counts["main"] == 1


def test_a_loop_of_unknown_trip_count_runs_as_often_as_the_caller_says() -> None:
    # The decode program: its data-dependent loop runs C - 1 times, what is outside it once.
    counts = hlo.parse(SCAN_PATTERN, unknown_trips=511).counts
    assert counts["main"] == 1
    assert counts["decode_body"] == counts["decode_cond"] == 511
    assert counts["layer_body"] == counts["fused_matmul"] == 511 * 3 and counts["layer_cond"] == 511 * 4


def test_collectives_traffic_and_flops_in_a_loop_body_count_per_trip() -> None:
    module = hlo.parse(SCAN_PATTERN)
    got = hlo.collectives(module, devices=8)
    assert got["all-gather"] == 3 * 256 * 256 * 2  # gathered from groups of 4, in each of the 3 layers
    assert got["all-reduce"] == 5 * 1024 * 4
    assert got["moved"] == int(3 * 256 * 256 * 2 * 3 / 4 + 5 * 2 * 1024 * 4 * 7 / 8)
    ops = {r.name: r for r in traffic.op_bytes(module)}
    assert ops["y"].count == 3 and ops["y"].bytes == 3 * (32 * 256 * 2 + 256 * 256 * 2 + 32 * 256 * 2)
    assert ops["ag"].bytes == 3 * (64 * 256 * 2 + 256 * 256 * 2)
    assert ops["ar"].count == 5 and "conv" not in ops  # the fusion's inside is its caller's traffic
    by = {b["source"]: b for b in traffic.by_source(list(ops.values()))}
    assert by["layers/dot"] == {"source": "layers/dot", "ops": 1, "bytes": ops["y"].bytes}
    assert flops.flops(module) == 3 * 2 * 32 * 256 * 256


# Matmuls as libtpu writes them (from a compiled attention block): a plain matmul; q·kᵀ with batch and heads
# as spatial dims (window = lhs_dilate = the dim: one tap per output); a projection to heads x head_dim
# (heads as a padded window: a tap per head); the output projection contracting heads x head_dim.
@pytest.mark.parametrize(
    ("instruction", "lhs", "rhs", "expected"),
    [("bf16[32,512]{1,0} dot(%a, %b), lhs_batch_dims={}, lhs_contracting_dims={1}, rhs_contracting_dims={0}",
      "bf16[32,256]", "bf16[256,512]", 2 * 32 * 512 * 256),
     ("f32[8,16,32]{2,1,0} dot(%a, %b), lhs_batch_dims={0}, lhs_contracting_dims={2}, rhs_batch_dims={0}, "
      "rhs_contracting_dims={1}", "f32[8,16,64]", "f32[8,64,32]", 2 * 8 * 16 * 32 * 64),
     ("bf16[1024,32]{0,1} convolution(%a, %b), dim_labels=bf_io->fb", "bf16[32,256]", "bf16[256,1024]",
      2 * 32 * 1024 * 256),
     ("bf16[2,4,256,256]{3,2,1,0} convolution(%a, %b), window={size=2x4 stride=1x3 lhs_dilate=2x4}, "
      "dim_labels=0b1f_0o1i->01bf", "bf16[2,256,4,64]", "bf16[2,256,4,64]", 2 * 2 * 4 * 256 * 256 * 64),
     ("bf16[2,256,4,64]{3,2,1,0} convolution(%a, %b), window={size=1x4 pad=0_0x3_3 rhs_reversal=0x1}, "
      "dim_labels=0bf1_i1o0->0b1f", "bf16[2,256,512,1]", "bf16[512,4,64,1]", 2 * 2 * 256 * 512 * 4 * 64),
     ("bf16[2,256,512,1]{3,2,1,0} convolution(%a, %b), window={size=1x4}, dim_labels=0b1f_1io0->0bf1",
      "bf16[2,256,4,64]", "bf16[4,64,512,1]", 2 * 2 * 256 * 512 * 4 * 64)],
)  # fmt: skip
def test_matmul_flops_of_dots_and_tpu_convolutions(
    instruction: str, lhs: str, rhs: str, expected: int
) -> None:
    text = f"""
ENTRY %main (a: {lhs}, b: {rhs}) -> f32[] {{
  %a = {lhs} parameter(0)
  %b = {rhs} parameter(1)
  ROOT %mm = {instruction}
}}
"""
    assert flops.flops(text) == expected


@pytest.mark.parametrize(("kernel", "matmuls"), [("splash_mha_fwd_segmented_residuals.2", 2),
                                                 ("splash_mha_dq_segmented_no_residuals.1", 3),
                                                 ("splash_mha_dkv_segmented_no_residuals.1", 4),
                                                 ("some_other_kernel.1", 0)])  # fmt: skip
def test_splash_attention_kernels_count_their_matmuls_over_the_causal_triangle(
    kernel: str, matmuls: int
) -> None:
    """libtpu's splash attention custom calls (as the seed's update has them: 16 query heads, 2 kv heads): each
    kernel's matmuls over the (query, key) pairs of the causal triangle; any other custom call counts nothing."""
    text = f"""
ENTRY %main (q: bf16[4,16,1536,128], k: bf16[4,2,1536,128], v: bf16[4,2,1536,128]) -> bf16[4,16,1536,128] {{
  %q = bf16[4,16,1536,128]{{3,2,1,0}} parameter(0)
  %k = bf16[4,2,1536,128]{{3,2,1,0}} parameter(1)
  %v = bf16[4,2,1536,128]{{3,2,1,0}} parameter(2)
  ROOT %{kernel} = bf16[4,16,1536,128]{{3,2,1,0}} custom-call(%q, %k, %v), custom_call_target="tpu_custom_call"
}}
"""
    assert flops.flops(text) == matmuls * 2 * 4 * 16 * (1536 * 1537 // 2) * 128
    assert flops.op_flops(text) == ({kernel: flops.flops(text)} if matmuls else {})


def test_splash_attention_after_a_prompt_counts_the_completions_pairs() -> None:
    """The update's completions over their group's prompt (flash.attend_flash_after_prompt: 1024 queries, the last
    of 1536 keys): each query sees the 512 prompt keys and its own at or before it."""
    text = """
ENTRY %main (q: bf16[4,16,1024,128], k: bf16[4,2,1536,128], v: bf16[4,2,1536,128]) -> bf16[4,16,1024,128] {
  %q = bf16[4,16,1024,128]{3,2,1,0} parameter(0)
  %k = bf16[4,2,1536,128]{3,2,1,0} parameter(1)
  %v = bf16[4,2,1536,128]{3,2,1,0} parameter(2)
  ROOT %splash_mha_fwd_segmented.1 = bf16[4,16,1024,128]{3,2,1,0} custom-call(%q, %k, %v), custom_call_target="tpu_custom_call"
}
"""
    assert flops.flops(text) == 2 * 2 * 4 * 16 * (1024 * 512 + 1024 * 1025 // 2) * 128


@pytest.fixture
def v6e_8(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The 8 devices of a v6e-8, compiled for by libtpu on this machine (no TPU)."""
    pytest.importorskip("libtpu", reason="libtpu (the tpu extra) compiles for a TPU topology")
    for k in ("ALLOW_MULTIPLE_LIBTPU_LOAD", "TPU_SKIP_MDS_QUERY", "TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES",
              "TF_CPP_MIN_LOG_LEVEL"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)  # restored after the test
    _quiet_libtpu("v6e-8")
    from jax.experimental import topologies

    return list(topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices)


@pytest.mark.parametrize(
    ("x_spec", "w_spec", "gathered"),
    [(("x", None), (None, "x", None), "weight"),  # FSDP: each layer's weight all-gathered in the loop body
     ((None, None), (None, None, "x"), "activation")],  # TP: the device's slice of the stack read in a fusion
)  # fmt: skip
def test_a_scan_over_layers_costs_its_layers_times_one_layer(
    v6e_8: list[object], x_spec: tuple[str | None, ...], w_spec: tuple[str | None, ...], gathered: str
) -> None:
    """libtpu's text of a lax.scan over L layers: L x the matmul FLOPs, all-gathers and weight reads of one
    layer, as the same layers unrolled (XLA's cost analysis counts the body once)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    mesh, B, D = Mesh(np.array(v6e_8), ("x",)), 256, 512
    x = jax.ShapeDtypeStruct((B, D), jnp.bfloat16, sharding=NamedSharding(mesh, P(*x_spec)))

    def scan(x: jax.Array, ws: jax.Array) -> jax.Array:
        return jax.lax.scan(lambda x, w: (jnp.tanh(x @ w), None), x, ws)[0]

    def unrolled(x: jax.Array, ws: jax.Array) -> jax.Array:
        for w in ws:
            x = jnp.tanh(x @ w)
        return x

    def cost(f: object, layers: int) -> tuple[int, int, int]:
        ws = jax.ShapeDtypeStruct((layers, D, D), jnp.bfloat16, sharding=NamedSharding(mesh, P(*w_spec)))
        module = hlo.parse(jax.jit(f).lower(x, ws).compile().as_text())
        hbm = sum(r.bytes for r in traffic.op_bytes(module))
        return flops.flops(module), hbm, hlo.collectives(module, 8)["all-gather"]

    (f1, hbm1, _), (f4, hbm4, ag4) = cost(scan, 1), cost(scan, 4)
    assert f1 == 2 * B * D * D // 8 and f4 == 4 * f1  # every device does an eighth of each matmul
    # FSDP gathers each layer's weight; TP the layer's input (the scan's carry keeps one sharding).
    assert ag4 == 4 * {"weight": D * D * 2, "activation": B * D * 2}[gathered]
    shard = D * D * 2 // 8  # the weight each device reads per layer; x and the result are read/written once
    assert hbm4 - hbm1 == pytest.approx(3 * shard, rel=1e-3)  # + the loop counter's few bytes
    if gathered == "weight":  # unrolled TP gathers L - 1 inputs and prefetches slices of the stack whole
        f, hbm, ag = cost(unrolled, 4)
        assert (f, ag) == (f4, ag4) and hbm == pytest.approx(hbm4, rel=1e-3)


def test_the_lm_head_gradient_is_reduce_scattered_over_the_batch_devices(v6e_8: list[object]) -> None:
    """The loss kernels' dW [D, V] leaves each device as its fsdp slice: libtpu's fused reduce-scatter, which fit
    counts at a reduce-scatter's bytes (an all-reduce of dW would move twice as many)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from trainer import sharding
    from trainer.kernels import sharded
    from trainer.kernels.logprob import reference

    mesh, B, T, D, V = sharding.make_mesh(1, 8, 1, devices=v6e_8), 16, 128, 256, 4096

    def kernel(h: jax.Array, w: jax.Array, ids: jax.Array) -> tuple[jax.Array, jax.Array]:
        return reference.token_logprob_entropy(h @ w, ids)

    def loss(h: jax.Array, w: jax.Array, ids: jax.Array) -> jax.Array:
        return jnp.sum(sharded.batch_sharded(kernel, h, w.astype(h.dtype), ids)[0])

    def like(shape: tuple[int, ...], dtype: object, spec: P) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, spec))

    args = (like((B, T, D), jnp.bfloat16, P(sharding.BATCH)), like((D, V), jnp.float32, P("fsdp")),
            like((B, T), jnp.int32, P(sharding.BATCH)))  # fmt: skip
    with jax.set_mesh(mesh):
        text = jax.jit(jax.grad(loss, argnums=1)).lower(*args).compile().as_text()
    ops = [op for op in hlo.collective_ops(text, 8) if op.group == tuple(range(8))]
    scattered = [op for op in ops if op.kind == "reduce-scatter"]
    assert [op.result_bytes for op in scattered] == [D * V * 2 // 8]  # dW in the weight's compute dtype, bf16
    assert not [op for op in ops if op.kind == "all-reduce" and op.result_bytes >= D * V * 2 // 8]
