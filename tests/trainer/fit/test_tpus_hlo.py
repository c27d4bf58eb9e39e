"""The accelerator table and the HLO collective reader (pure functions: no compile)."""

from __future__ import annotations

import pytest

from trainer.fit import hlo, tpus, traffic


@pytest.mark.parametrize(
    ("accelerator", "topology", "chips"),
    [("v6e-8", "v6e:2x4", 8), ("v6e-16", "v6e:4x4", 16), ("v4-8", "v4:2x2x1", 4), ("v5litepod-8", "v5e:2x4", 8),
     ("v5p-8", "v5p:2x2x1", 4), ("v5e-1", "v5e:1x1", 1)],
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
    }


@pytest.mark.parametrize("bad", ["v6e", "v9-8", "v6e-3", "tpu"])
def test_unknown_accelerator_names_the_known_forms(bad: str) -> None:
    with pytest.raises(tpus.UnknownAcceleratorError, match="v6e"):
        tpus.from_accelerator(bad)


HLO = """
  %all-gather.1 = bf16[1024,2048]{1,0} all-gather(bf16[128,2048]{1,0} %p), channel_id=1, replica_groups=[1,8]<=[8], dimensions={0}
  %rs = f32[256,64]{1,0} reduce-scatter(f32[2048,64]{1,0} %g), channel_id=2, replica_groups={{0,1,2,3,4,5,6,7}}, dimensions={0}
  %ar = f32[] all-reduce(f32[] %x), channel_id=3, replica_groups={{0,1},{2,3},{4,5},{6,7}}, to_apply=%add
  %ags = (bf16[16,8]{1,0}, bf16[64,8]{1,0}) all-gather-start(bf16[16,8]{1,0} %q), replica_groups=[2,4]<=[8], dimensions={0}
  %add.7 = f32[8]{0} add(f32[8]{0} %a, f32[8]{0} %b)
"""


def test_collectives_read_result_bytes_group_sizes_and_async_starts() -> None:
    got = hlo.collectives(HLO, devices=8)
    assert got["all-gather"] == 1024 * 2048 * 2 + 64 * 8 * 2  # the async start's result, not its operand
    assert got["reduce-scatter"] == 256 * 64 * 4
    assert got["all-reduce"] == 4
    moved = 1024 * 2048 * 2 * 7 / 8 + 256 * 64 * 4 * 7 + 2 * 4 * 1 / 2 + 64 * 8 * 2 * 3 / 4
    assert got["moved"] == int(moved)


# A decode-like program as libtpu compiles it: a weight prefetched into VMEM (S(1)) and read there by a matmul
# fusion whose body holds a no-op bitcast fusion, an embedding row gather inside a fusion, an in-place cache
# update in a loop body, and an all-gather.
TRAFFIC_HLO = """
%bitcast_fusion (bitcast_input: bf16[2048,5504]) -> bf16[2048,5504] {
  %bitcast_input = bf16[2048,5504]{1,0:T(8,128)(2,1)S(1)} parameter(0)
  ROOT %bitcast = bf16[2048,5504]{1,0:T(8,128)(2,1)} bitcast(%bitcast_input)
}

%fused_matmul (param_0: bf16[32,2048], param_1: bf16[2048,5504]) -> bf16[32,5504] {
  %param_0 = bf16[32,2048]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1 = bf16[2048,5504]{1,0:T(8,128)(2,1)S(1)} parameter(1)
  %fusion.2 = bf16[2048,5504]{1,0:T(8,128)(2,1)} fusion(%param_1), kind=kLoop, calls=%bitcast_fusion
  ROOT %convolution.1 = bf16[32,5504]{1,0:T(8,128)(2,1)} convolution(%param_0, %fusion.2), dim_labels=bf_io->bf
}

%fused_gather (param_0.1: bf16[75968,2048], param_1.1: s32[32]) -> bf16[32,2048] {
  %param_0.1 = bf16[75968,2048]{1,0:T(8,128)(2,1)} parameter(0)
  %param_1.1 = s32[32]{0:T(128)} parameter(1)
  ROOT %gather.1 = bf16[32,2048]{1,0:T(8,128)(2,1)} gather(%param_0.1, %param_1.1), offset_dims={1}, slice_sizes={1,2048}
}

%body (p: (bf16[32,1024,1,128], bf16[32,1,1,128], s32[])) -> (bf16[32,1024,1,128], bf16[32,1,1,128], s32[]) {
  %p = (bf16[32,1024,1,128]{3,1,0,2:T(8,128)(2,1)}, bf16[32,1,1,128]{3,1,0,2}, s32[]) parameter(0)
  %c = bf16[32,1024,1,128]{3,1,0,2:T(8,128)(2,1)} get-tuple-element(%p), index=0
  %new = bf16[32,1,1,128]{3,1,0,2} get-tuple-element(%p), index=1
  %i = s32[] get-tuple-element(%p), index=2
  %zero = s32[] constant(0)
  %dus = bf16[32,1024,1,128] dynamic-update-slice(%c, %new, %zero, %i, %zero, %zero), metadata={op_name="f/layers_7/dus"}
  ROOT %t = (bf16[32,1024,1,128]{3,1,0,2:T(8,128)(2,1)}, bf16[32,1,1,128]{3,1,0,2}, s32[]) tuple(%dus, %new, %i)
}

ENTRY %main (x: bf16[32,2048], w: bf16[2048,5504], table: bf16[75968,2048], ids: s32[32]) -> bf16[32,5504] {
  %x = bf16[32,2048]{1,0:T(8,128)(2,1)} parameter(0)
  %w = bf16[2048,5504]{1,0:T(8,128)(2,1)} parameter(1)
  %table = bf16[75968,2048]{1,0:T(8,128)(2,1)} parameter(2)
  %ids = s32[32]{0:T(128)} parameter(3)
  %copy-start = (bf16[2048,5504]{1,0:T(8,128)(2,1)S(1)}, bf16[2048,5504]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) copy-start(%w)
  %copy-done = bf16[2048,5504]{1,0:T(8,128)(2,1)S(1)} copy-done(%copy-start)
  %rows = bf16[32,2048]{1,0} fusion(%table, %ids), kind=kLoop, calls=%fused_gather, metadata={op_name="jit(f)/embed/gather"}
  %ag = bf16[64,2048]{1,0:T(8,128)(2,1)} all-gather(%rows), channel_id=1, replica_groups=[4,2]<=[8], dimensions={0}
  ROOT %fusion = bf16[32,5504]{1,0} fusion(%x, %copy-done), calls=%fused_matmul, metadata={op_name="jit(f)/layers_3/up/dot"}
}
"""


def test_traffic_counts_hbm_bytes_once_per_op_not_vmem_copies() -> None:
    ops = {r.name: r for r in traffic.op_bytes(TRAFFIC_HLO)}
    w, x, out, rows = 2048 * 5504 * 2, 32 * 2048 * 2, 32 * 5504 * 2, 32 * 2048 * 2
    assert ops["copy-start"].bytes == w  # HBM read; the VMEM copy it writes is not HBM traffic
    assert ops["fusion"].bytes == x + out  # the weight is read from VMEM; the nested bitcast is no traffic
    assert ops["rows"].bytes == 2 * rows + 32 * 4  # reads its 32 rows of the 311 MB table (and the ids)
    assert ops["dus"].bytes == 2 * 32 * 128 * 2  # in place: the update is read and written, not the cache
    assert ops["ag"].bytes == rows + 2 * rows
    assert {"copy-done", "c", "t", "x", "zero"}.isdisjoint(ops)  # views, bookkeeping: nothing moved
    total = sum(r.bytes for r in ops.values())
    by = {b["source"]: b for b in traffic.by_source(list(ops.values()), top=3)}
    assert by["layers_*/up/dot"]["bytes"] == x + out  # layer index folded
    assert sum(b["bytes"] for b in by.values()) == total and "other" in by
