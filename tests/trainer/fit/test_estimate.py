"""The step estimate's pieces on synthetic HLO: replica groups as libtpu writes them, the links and hops a group
uses on the torus, each op at its own roofline, a latency per hop, the expected range and the host's work."""

from __future__ import annotations

import pytest

from trainer import config
from trainer.fit import analyze, estimate, hlo, host, tpus

V6E_2X4 = estimate.Geometry(tuple((i % 2, i // 2, 0) for i in range(8)), wrap_from=16)  # libtpu's coords


@pytest.mark.parametrize(
    ("groups", "members"),
    [("replica_groups={{0,1},{2,3},{4,5},{6,7}}", [0, 1]),
     ("replica_groups=[4,2]<=[8]", [0, 1]),
     ("replica_groups=[2,4]<=[4,2]T(1,0)", [0, 2, 4, 6]),
     ("replica_groups=mesh['axis_0'=4,'axis_1'=2] {'axis_0'}", [0, 2, 4, 6]),
     ("replica_groups=mesh['axis_0'=4,'axis_1'=1,'axis_2'=2] {'axis_2'}", [0, 1]),
     ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], device_ids=([4,2]T(1,0)) {'axis_0'}", [0, 1]),
     ("replica_groups=mesh['axis_0'=2,'axis_1'=1,'axis_2'=4], use_global_device_ids=true", list(range(8))),
     ("channel_id=3", list(range(8)))],
)  # fmt: skip
def test_replica_groups_in_every_form_libtpu_writes(groups: str, members: list[int]) -> None:
    line = f"  %ar = f32[32]{{0}} all-reduce(f32[32]{{0}} %x), channel_id=1, {groups}, to_apply=%add"
    assert hlo.group_members(line, 8) == members


@pytest.mark.parametrize(
    ("group", "links", "hops"),
    [((0, 1), 1, 1),  # the decode's tp pair: one link, one hop
     ((0, 2, 4, 6), 1, 3),  # a line of 4 chips without wraparound: 3 hops end to end
     (tuple(range(8)), 2, 4),  # both dimensions: a link each, 1 + 3 hops
     ((3,), 1, 0)],
)  # fmt: skip
def test_a_group_uses_the_links_and_hops_of_the_torus_dimensions_it_spans(
    group: tuple[int, ...], links: int, hops: int
) -> None:
    assert V6E_2X4.links_and_hops(group) == (links, hops)


def test_a_full_axis_with_wraparound_is_a_ring_both_ways() -> None:
    ring = estimate.Geometry(tuple((i % 4, i // 4) for i in range(16)), wrap_from=4)  # v5p-like 4x4
    assert ring.links_and_hops((0, 1, 2, 3)) == (2, 2)  # both directions, half the way round
    assert V6E_2X4.links_and_hops((0, 2, 4, 6)) == (1, 3)  # 4 < 16 on v6e: a line


def test_per_link_bandwidth_and_latency_come_from_the_chip_table() -> None:
    v6e, v5e, v4 = (tpus.from_accelerator(a) for a in ("v6e-8", "v5litepod-8", "v4-8"))
    assert v6e.per_device(8)["link_bw"] == 100e9 and v5e.per_device(8)["link_bw"] == 50e9
    assert v4.per_device(8)["link_bw"] == 45e9 / 2  # two TensorCores share a chip's links
    assert v6e.per_device(8)["hop_latency_s"] == 1e-6


# One matmul that is compute-bound, one copy that is HBM-bound, and an all-reduce over the tp pair in a loop of
# 10: a program whose rooflines differ op by op.
PROGRAM = """
%mm (a: bf16[4096,4096], b: bf16[4096,4096]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %b = bf16[4096,4096]{1,0} parameter(1)
  ROOT %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (s32[], f32[65536])) -> (s32[], f32[65536]) {
  %p = (s32[], f32[65536]{0}) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %v = f32[65536]{0} get-tuple-element(%p), index=1
  %one = s32[] constant(1)
  %next = s32[] add(%i, %one)
  %ar = f32[65536]{0} all-reduce(%v), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  ROOT %t = (s32[], f32[65536]{0}) tuple(%next, %ar)
}

%cond (c: (s32[], f32[65536])) -> pred[] {
  %c = (s32[], f32[65536]{0}) parameter(0)
  %k = s32[] get-tuple-element(%c), index=0
  %ten = s32[] constant(10)
  ROOT %lt = pred[] compare(%k, %ten), direction=LT
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

ENTRY %main (a: bf16[4096,4096], big: f32[268435456], v: f32[65536]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %big = f32[268435456]{0} parameter(1)
  %v = f32[65536]{0} parameter(2)
  %copy = f32[268435456]{0} copy(%big)
  %zero = s32[] constant(0)
  %init = (s32[], f32[65536]{0}) tuple(%zero, %v)
  %loop = (s32[], f32[65536]{0}) while(%init), condition=%cond, body=%body
  ROOT %f = bf16[4096,4096]{1,0} fusion(%a, %a), kind=kOutput, calls=%mm
}
"""


def test_the_bound_is_each_ops_roofline_plus_each_collective_over_its_links_and_hops() -> None:
    rates = tpus.from_accelerator("v6e-8").per_device(8)
    costs = estimate.phase_costs(hlo.parse(PROGRAM), rates, V6E_2X4)
    matmul_s = 2 * 4096**3 / 918e12  # 150 us of MXU against 0.06 ms of its 100 MB of HBM traffic
    copy_s = 2 * 268435456 * 4 / 1638e9  # 1.3 ms of HBM, no FLOPs
    assert costs["compute_s"] == pytest.approx(matmul_s)
    assert costs["roofline_s"] == pytest.approx(matmul_s + copy_s)  # each op its own max, summed
    program_max = max(costs["compute_s"], costs["hbm_s"])
    assert costs["roofline_s"] > program_max  # the per-program max missed the matmul's time
    # 10 all-reduces of 256 KB over one link (the tp pair), 2 x 1 hop at 1 us each.
    assert costs["collectives"] == 10
    assert costs["collective_bw_s"] == pytest.approx(10 * 2 * 65536 * 4 / 2 / 100e9)
    assert costs["collective_latency_s"] == pytest.approx(10 * 2e-6)
    assert costs["bound_s"] == pytest.approx(
        costs["roofline_s"] + costs["collective_bw_s"] + costs["collective_latency_s"]
    )
    assert costs["overlap_s"] == pytest.approx(0, abs=1e-12)  # a synchronous all-reduce: nothing overlaps


def test_the_expected_range_divides_the_roofline_by_the_documented_efficiencies() -> None:
    rates = tpus.from_accelerator("v6e-8").per_device(8)
    module = hlo.parse(PROGRAM)
    decode = estimate.phase_costs(module, rates, V6E_2X4, "decode")
    roofline, bw, lat = decode["roofline_s"], decode["collective_bw_s"], decode["collective_latency_s"]
    eff = estimate.EFFICIENCY["decode"]
    low, high = decode["expected_s"]  # nothing overlaps here: the terms add up at each efficiency
    assert low == pytest.approx(roofline / eff.high + bw / estimate.ICI_EFFICIENCY + lat)
    assert high == pytest.approx(
        roofline / eff.low + bw / estimate.ICI_EFFICIENCY + lat * estimate.LATENCY_MEASURED_X
    )
    update = estimate.phase_costs(module, rates, V6E_2X4, "update")
    assert update["expected_s"][1] == pytest.approx(
        roofline / estimate.EFFICIENCY["train"].low
        + bw / estimate.ICI_EFFICIENCY
        + lat * estimate.LATENCY_MEASURED_X
    )
    assert all(e.source and 0 < e.low < e.high <= 1 for e in estimate.EFFICIENCY.values())


# The windowed einsum's shape: an async permute started before a matmul and waited for after it, then the same
# permute left synchronous (libtpu's form when nothing is scheduled between its start and its done).
ASYNC = """
%mm (a: bf16[4096,4096], b: bf16[4096,4096]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %b = bf16[4096,4096]{1,0} parameter(1)
  ROOT %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

ENTRY %main (a: bf16[4096,4096], x: bf16[SIZE]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %x = bf16[SIZE]{0} parameter(1)
  %cp = (bf16[SIZE]{0}, bf16[SIZE]{0}, u32[], u32[]) collective-permute-start(%x), channel_id=1, source_target_pairs={{0,1},{1,0}}
  %f = bf16[4096,4096]{1,0} fusion(%a, %a), kind=kOutput, calls=%mm
  %got = bf16[SIZE]{0} collective-permute-done(%cp)
  ROOT %g = bf16[4096,4096]{1,0} fusion(%f, %a), kind=kOutput, calls=%mm
}
"""
SYNC = ASYNC.replace(
    "%cp = (bf16[SIZE]{0}, bf16[SIZE]{0}, u32[], u32[]) collective-permute-start(%x)",
    "%cp = bf16[SIZE]{0} collective-permute(%x)",
).replace("  %got = bf16[SIZE]{0} collective-permute-done(%cp)\n", "")


@pytest.mark.parametrize(
    "elements", [2_000_000, 20_000_000]
)  # the permute shorter, then longer, than a matmul
def test_an_async_collective_runs_beside_the_ops_scheduled_between_its_start_and_done(elements: int) -> None:
    rates = tpus.from_accelerator("v6e-8").per_device(8)
    text = ASYNC.replace("SIZE", str(elements))
    both = estimate.phase_costs(hlo.parse(text), rates, V6E_2X4)
    alone = estimate.phase_costs(hlo.parse(SYNC.replace("SIZE", str(elements))), rates, V6E_2X4)
    matmul_s = 2 * 4096**3 / 918e12
    # A permute without replica groups spans every device (both torus dimensions: 2 links); one hop.
    permute_s = 2 * elements / (rates["link_bw"] * 2) + rates["hop_latency_s"]
    assert alone["collective_bw_s"] + alone["collective_latency_s"] == pytest.approx(permute_s)
    assert both["roofline_s"] == pytest.approx(alone["roofline_s"]) and both["roofline_s"] >= 2 * matmul_s
    # Synchronous: every term adds. Async: the first matmul runs while the permute does; the done waits for the rest.
    assert alone["bound_s"] == pytest.approx(alone["roofline_s"] + permute_s)
    assert alone["overlap_s"] == pytest.approx(0, abs=1e-12)
    assert both["bound_s"] == pytest.approx(
        alone["bound_s"] - min(permute_s, both["roofline_s"] / 2), rel=1e-6
    )
    assert both["overlap_s"] == pytest.approx(alone["bound_s"] - both["bound_s"])
    low, high = both["expected_s"]
    assert (
        alone["expected_s"][0] - low > 0 and alone["expected_s"][1] - high > 0
    )  # hidden at every efficiency


# libtpu's TPU7x form: the all-reduce inside a computation an async `call-start` runs on the SparseCore, waited for
# by its `call-done`; and the same all-reduce held by a fusion the TensorCore runs (synchronous).
CALLED = """
%mm (a: bf16[4096,4096], b: bf16[4096,4096]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %b = bf16[4096,4096]{1,0} parameter(1)
  ROOT %d = bf16[4096,4096]{1,0} dot(%a, %b), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%add (x: f32[], y: f32[]) -> f32[] {
  %x = f32[] parameter(0)
  %y = f32[] parameter(1)
  ROOT %s = f32[] add(%x, %y)
}

%called (p: f32[2000000]) -> f32[2000000] {
  %p = f32[2000000]{0} parameter(0)
  ROOT %ar = f32[2000000]{0} all-reduce(%p), channel_id=1, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
}

ENTRY %main (a: bf16[4096,4096], v: f32[2000000]) -> bf16[4096,4096] {
  %a = bf16[4096,4096]{1,0} parameter(0)
  %v = f32[2000000]{0} parameter(1)
  %cs = ((f32[2000000]{0}), f32[2000000]{0}, u32[]) call-start(%v), async_execution_thread="sparsecore", to_apply=%called
  %f = bf16[4096,4096]{1,0} fusion(%a, %a), kind=kOutput, calls=%mm
  %cd = f32[2000000]{0} call-done(%cs)
  ROOT %g = bf16[4096,4096]{1,0} fusion(%f, %a), kind=kOutput, calls=%mm
}
"""
HELD = CALLED.replace(
    '  %cs = ((f32[2000000]{0}), f32[2000000]{0}, u32[]) call-start(%v), async_execution_thread="sparsecore", '
    "to_apply=%called\n",
    "  %cs = f32[2000000]{0} fusion(%v), kind=kLoop, calls=%called\n",
).replace("  %cd = f32[2000000]{0} call-done(%cs)\n", "")


def test_a_collective_inside_an_async_call_overlaps_and_inside_a_fusion_holds_the_core() -> None:
    rates = tpus.from_accelerator("v6e-8").per_device(8)
    called = estimate.phase_costs(hlo.parse(CALLED), rates, V6E_2X4)
    held = estimate.phase_costs(hlo.parse(HELD), rates, V6E_2X4)
    all_reduce_s = 2 * 2_000_000 * 4 / 2 / 100e9 + 2 * 1e-6  # the tp pair: one link, 2 x 1 hop
    matmul_s = 2 * 4096**3 / 918e12
    for costs in (called, held):  # counted once either way, where it sits
        assert costs["collectives"] == 1
        assert costs["collective_bw_s"] + costs["collective_latency_s"] == pytest.approx(all_reduce_s)
    assert all_reduce_s < matmul_s  # the first matmul hides all of it
    assert called["overlap_s"] == pytest.approx(all_reduce_s)
    assert called["bound_s"] == pytest.approx(called["roofline_s"])
    assert held["overlap_s"] == pytest.approx(0, abs=1e-12)
    assert held["bound_s"] == pytest.approx(held["roofline_s"] + all_reduce_s)


# libtpu's reduce-scatter: an all-reduce whose fusion returns only this device's slice (partition-id x size);
# beside it an all-reduce whose slice a separate op takes afterwards, which is a whole all-reduce.
SCATTER = """
%all-reduce-scatter (input: f32[8,256,1024]) -> f32[256,1024] {
  %input = f32[8,256,1024]{2,1,0} parameter(0)
  %all-reduce.46 = f32[8,256,1024]{2,1,0} all-reduce(%input), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  %partition-id.45 = u32[] partition-id()
  %c = u32[] constant(0)
  ROOT %dynamic-slice.205 = f32[1,256,1024]{2,1,0} dynamic-slice(%all-reduce.46, %partition-id.45, %c, %c)
}

ENTRY %main (p: f32[8,256,1024]) -> f32[256,1024] {
  %p = f32[8,256,1024]{2,1,0} parameter(0)
  %fusion.17 = f32[1,256,1024]{2,1,0} fusion(%p), kind=kCustom, calls=%all-reduce-scatter
  %whole = f32[8,256,1024]{2,1,0} all-reduce(%p), replica_groups={{0,1,2,3,4,5,6,7}}, to_apply=%add
  ROOT %slice = f32[1,256,1024]{2,1,0} dynamic-slice(%whole, %c, %c, %c), dynamic_slice_sizes={1,256,1024}
}
"""


def test_an_all_reduce_whose_fusion_keeps_only_this_devices_slice_is_a_reduce_scatter() -> None:
    ops = {op.name: op for op in hlo.collective_ops(SCATTER, 8)}
    full = 8 * 256 * 1024 * 4
    assert (ops["all-reduce.46"].kind, ops["all-reduce.46"].result_bytes) == ("reduce-scatter", full // 8)
    assert ops["all-reduce.46"].moved_bytes == full * 7 / 8  # half an all-reduce's
    assert (ops["whole"].kind, ops["whole"].result_bytes, ops["whole"].moved_bytes) == (
        "all-reduce",
        full,
        2 * full * 7 / 8,
    )
    rates = tpus.from_accelerator("v6e-8").per_device(8)
    bw, latency = estimate.collective_seconds(ops["all-reduce.46"], rates, V6E_2X4)
    assert (bw, latency) == pytest.approx(
        (full * 7 / 8 / (2 * 100e9), 4e-6)
    )  # both dimensions' links, 1 + 3 hops


def test_the_step_adds_the_host_work_to_the_bound_and_to_the_range() -> None:
    costs = {"compute_s": 0.5, "hbm_s": 1.0, "roofline_s": 1.2, "collective_bw_s": 0.1, "collective_latency_s": 0.05,
             "collectives": 3, "overlap_s": 0.0, "bound_s": 1.35, "expected_s": [2.0, 2.6]}  # fmt: skip
    raw = {"resident_bytes": 0, "argument_bytes": 1, "output_bytes": 1, "alias_bytes": 0, "temp_bytes": 1,
           "flops": 1e12, "hbm_bytes": 1e9, "collective_bytes": {"moved": 1e6}, "costs": costs}  # fmt: skip
    got = analyze.judge({"decode": raw}, tpus.from_accelerator("v6e-8").per_device(8), host_s=0.25)
    est = got["estimate"]
    assert est["bound_s"] == pytest.approx(1.6) and est["host_s"] == 0.25
    assert est["expected_s"] == pytest.approx([2.25, 2.85])
    assert est["program_roofline_s"] == pytest.approx(1e12 / 918e12 + 1e6 / 400e9)  # the former figure
    assert got["phases"]["decode"]["largest_term"] == "hbm"
    assert set(est["efficiency"]) == set(estimate.EFFICIENCY)


@pytest.mark.slow
def test_host_work_is_timed_at_the_configs_shapes() -> None:
    cfg = config.load("tiny", ["rollout.max_new_tokens=64", "train.prompts_per_step=4"])
    got = host.measure(cfg, repeats=1)
    assert got["sequences"] == cfg.sequences_per_step and got["tokens"] == cfg.sequences_per_step * 64
    assert got["seconds"] > 0 and got["tokenizer"] in ("qwen2.5", "bundled")


def test_fix_candidates_are_more_remat_first_then_halved_micro_batches() -> None:
    """What `fit` compiles, in order, when only the update does not fit (the CLI test compiles up to the first
    that fits): stronger remat, then each halved micro-batch that still splits the batch evenly, alone and with
    full remat."""
    from trainer.fit.__main__ import fix_candidates

    cfg = config.load(
        "tiny", ["train.prompts_per_step=16", "rollout.samples_per_prompt=8", "train.micro_batch=128"]
    )
    assert fix_candidates(cfg, 1)[:6] == [
        ["train.remat=dots"], ["train.remat=mlp_up"], ["train.remat=full"], ["train.micro_batch=64"],
        ["train.micro_batch=64", "train.remat=full"], ["train.micro_batch=32"],
    ]  # fmt: skip
    assert fix_candidates(config.with_sets(cfg, ["train.remat=full"]), 32) == [
        ["train.micro_batch=64"],
        ["train.micro_batch=32"],
    ]


def test_auto_measures_against_what_libtpu_says_it_can_allocate() -> None:
    """A candidate too big to compile names libtpu's allocatable HBM; `remat: auto` then picks against 90% of it,
    as a run does against its device's allocator limit."""
    from trainer.fit.remat import allocatable

    error = (
        "RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries (119.02G) "
        "exceeds available HBM (31.25G)."
    )
    assert allocatable(error) == 31.25 * 2**30
    assert allocatable("INTERNAL: something else") is None and allocatable("") is None
