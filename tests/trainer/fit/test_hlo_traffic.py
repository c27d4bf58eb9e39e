"""The HBM traffic read from a compiled program's HLO (synthetic texts): each op's bytes counted once, VMEM
copies aside, one layer of a stacked weight read where a fusion slices it, and stacks updated in place."""

from __future__ import annotations

import pytest

from trainer.fit import traffic

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
  %dus = bf16[32,1024,1,128] dynamic-update-slice(%c, %new, %zero, %i, %zero, %zero), metadata={op_name="f/layers/dus"}
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
  ROOT %fusion = bf16[32,5504]{1,0} fusion(%x, %copy-done), calls=%fused_matmul, metadata={op_name="jit(f)/layers/up/dot"}
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
    assert by["layers/up/dot"]["bytes"] == x + out  # the program's own jit dropped
    assert sum(b["bytes"] for b in by.values()) == total and "other" in by


# A scan's layer body as libtpu fuses it: the matmul fusion takes the whole stack of layer weights and a nested
# fusion slices out the layer it multiplies by.
STACKED_HLO = """
%slice_layer (s0: bf16[4,256,256], s1: s32[]) -> bf16[256,256] {
  %s0 = bf16[4,256,256]{2,1,0} parameter(0)
  %s1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,256,256]{2,1,0} dynamic-slice(%s0, %s1, %z, %z), dynamic_slice_sizes={1,256,256}
  ROOT %layer = bf16[256,256]{1,0} bitcast(%ds)
}

%layer_matmul (m0: bf16[8,256], m1: bf16[4,256,256], m2: s32[]) -> bf16[8,256] {
  %m0 = bf16[8,256]{1,0} parameter(0)
  %m1 = bf16[4,256,256]{2,1,0} parameter(1)
  %m2 = s32[] parameter(2)
  %w = bf16[256,256]{1,0} fusion(%m1, %m2), kind=kLoop, calls=%slice_layer
  ROOT %mm = bf16[8,256]{1,0} convolution(%m0, %w), dim_labels=bf_io->bf
}

ENTRY %main (x: bf16[8,256], stack: bf16[4,256,256], i: s32[]) -> bf16[8,256] {
  %x = bf16[8,256]{1,0} parameter(0)
  %stack = bf16[4,256,256]{2,1,0} parameter(1)
  %i = s32[] parameter(2)
  ROOT %y = bf16[8,256]{1,0} fusion(%x, %stack, %i), kind=kOutput, calls=%layer_matmul
}
"""


def test_traffic_reads_one_layer_of_a_stack_sliced_in_a_nested_fusion() -> None:
    (y,) = traffic.op_bytes(STACKED_HLO)
    assert y.bytes == 8 * 256 * 2 + 256 * 256 * 2 + 4 + 8 * 256 * 2  # x, one layer, the index, the result


# The same on TPU7x: libtpu nests a change of tiling of the whole stack (bf16 T(16,128) -> T(8,128)) between the
# stack and the slice, as a copy fusion written into its own operand's buffer (`output_to_operand_aliasing`).
RELAYOUT_STACKED_HLO = """
%relayout (r0: bf16[4,256,256]) -> bf16[4,256,256] {
  %r0 = bf16[4,256,256]{2,1,0:T(16,128)(2,1)} parameter(0)
  ROOT %c = bf16[4,256,256]{2,1,0:T(8,128)(2,1)} copy(%r0)
}

%slice_layer (s0: bf16[4,256,256], s1: s32[]) -> bf16[256,256] {
  %s0 = bf16[4,256,256]{2,1,0:T(16,128)(2,1)} parameter(0)
  %re = bf16[4,256,256]{2,1,0:T(8,128)(2,1)} fusion(%s0), kind=kLoop, ALIAS calls=%relayout
  %s1 = s32[] parameter(1)
  %z = s32[] constant(0)
  %ds = bf16[1,256,256]{2,1,0:T(8,128)(2,1)} dynamic-slice(%re, %s1, %z, %z), dynamic_slice_sizes={1,256,256}
  ROOT %layer = bf16[256,256]{1,0:T(8,128)(2,1)} bitcast(%ds)
}

%layer_matmul (m0: bf16[8,256], m1: bf16[4,256,256], m2: s32[]) -> bf16[8,256] {
  %m0 = bf16[8,256]{1,0} parameter(0)
  %m1 = bf16[4,256,256]{2,1,0:T(16,128)(2,1)} parameter(1)
  %m2 = s32[] parameter(2)
  %w = bf16[256,256]{1,0:T(8,128)(2,1)} fusion(%m1, %m2), kind=kLoop, calls=%slice_layer
  ROOT %mm = bf16[8,256]{1,0} convolution(%m0, %w), dim_labels=bf_io->bf
}

ENTRY %main (x: bf16[8,256], stack: bf16[4,256,256], i: s32[]) -> (bf16[8,256], bf16[8,256]) {
  %x = bf16[8,256]{1,0} parameter(0)
  %stack = bf16[4,256,256]{2,1,0:T(16,128)(2,1)} parameter(1)
  %i = s32[] parameter(2)
  %y = bf16[8,256]{1,0} fusion(%x, %stack, %i), kind=kOutput, calls=%layer_matmul
  %fmt = ((bf16[8,256]{1,0}, token[]), bf16[8,256]{1,0}) call-start(%y), async_execution_thread="sparsecore", to_apply=%relayout
  %z = bf16[8,256]{1,0} call-done(%fmt)
  ROOT %out = (bf16[8,256]{1,0}, bf16[8,256]{1,0}) tuple(%y, %z)
}
"""


@pytest.mark.parametrize("in_place", [True, False])
def test_a_relayout_written_in_place_is_read_as_the_slice_reads_it(in_place: bool) -> None:
    """Marked in place, the nested copy is a view: one layer is read, as without it (the TPU7x decode's stacks:
    docs/fit.md); a copy into a buffer of its own is a real one: the whole stack. An async call's `-done` half
    moves nothing (its `-start` counted the call's operand and result)."""
    text = RELAYOUT_STACKED_HLO.replace(
        "ALIAS ", "output_to_operand_aliasing={{}: (0, {})}, " if in_place else ""
    )
    ops = {r.name: r for r in traffic.op_bytes(text)}
    stack = 256 * 256 * 2 * (1 if in_place else 4)
    assert ops["y"].bytes == 8 * 256 * 2 + stack + 4 + 8 * 256 * 2
    assert ops["fmt"].bytes == 2 * 8 * 256 * 2 and "z" not in ops


# A scan that collects each layer's keys and values (the prefill): libtpu writes both into their stacks with one
# multi-output fusion whose ROOT is a tuple of two dynamic-update-slices, each in place like a lone one.
STACKS_UPDATED_HLO = """
%write_kv (p0: bf16[4,8,64], p1: s32[], p2: bf16[1,8,64], p3: bf16[4,8,64], p4: bf16[1,8,64]) -> (bf16[4,8,64], bf16[4,8,64]) {
  %p0 = bf16[4,8,64]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %p2 = bf16[1,8,64]{2,1,0} parameter(2)
  %p3 = bf16[4,8,64]{2,1,0} parameter(3)
  %p4 = bf16[1,8,64]{2,1,0} parameter(4)
  %z = s32[] constant(0)
  %k = bf16[4,8,64]{2,1,0} dynamic-update-slice(%p0, %p2, %p1, %z, %z)
  %v = bf16[4,8,64]{2,1,0} dynamic-update-slice(%p3, %p4, %p1, %z, %z)
  ROOT %kv = (bf16[4,8,64]{2,1,0}, bf16[4,8,64]{2,1,0}) tuple(%k, %v)
}

%write_k_and_scale (q0: bf16[4,8,64], q1: s32[], q2: bf16[1,8,64]) -> (bf16[4,8,64], bf16[1,8,64]) {
  %q0 = bf16[4,8,64]{2,1,0} parameter(0)
  %q1 = s32[] parameter(1)
  %q2 = bf16[1,8,64]{2,1,0} parameter(2)
  %z = s32[] constant(0)
  %k = bf16[4,8,64]{2,1,0} dynamic-update-slice(%q0, %q2, %q1, %z, %z)
  %twice = bf16[1,8,64]{2,1,0} add(%q2, %q2)
  ROOT %out = (bf16[4,8,64]{2,1,0}, bf16[1,8,64]{2,1,0}) tuple(%k, %twice)
}

ENTRY %main (ks: bf16[4,8,64], i: s32[], k: bf16[1,8,64], vs: bf16[4,8,64], v: bf16[1,8,64]) -> (bf16[4,8,64], bf16[4,8,64]) {
  %ks = bf16[4,8,64]{2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %k = bf16[1,8,64]{2,1,0} parameter(2)
  %vs = bf16[4,8,64]{2,1,0} parameter(3)
  %v = bf16[1,8,64]{2,1,0} parameter(4)
  %both = (bf16[4,8,64]{2,1,0}, bf16[4,8,64]{2,1,0}) fusion(%ks, %i, %k, %vs, %v), kind=kLoop, calls=%write_kv
  %ks2 = bf16[4,8,64]{2,1,0} get-tuple-element(%both), index=0
  %one = (bf16[4,8,64]{2,1,0}, bf16[1,8,64]{2,1,0}) fusion(%ks2, %i, %k), kind=kLoop, calls=%write_k_and_scale
  ROOT %out = (bf16[4,8,64]{2,1,0}, bf16[4,8,64]{2,1,0}) tuple(%ks2, %ks2)
}
"""


def test_a_multi_output_fusion_updates_each_stack_in_place() -> None:
    """Each dynamic-update-slice the ROOT tuple returns writes only its update (the 3B seed prefill's keys and
    values: 87 GB counted as whole-stack copies before); an output that is not in place is written whole."""
    ops = {r.name: r for r in traffic.op_bytes(STACKS_UPDATED_HLO)}
    layer = 8 * 64 * 2
    assert ops["both"].bytes == 4 + layer + layer  # the index and the two updates: no stack read or written
    assert ops["one"].bytes == 4 + layer + layer  # the index, the update (read once), the doubled update


# A decode-like program: a while loop that also stops on data (trip count unknown: counted once, the caller
# multiplies) around a scan over 3 layers (the JAX scan pattern libtpu leaves: counter from constant 0, +1,
# compared LT with 3), whose body all-gathers a weight and multiplies in a fusion; then a loop whose trip
# count XLA wrote down (known_trip_count) holding an all-reduce.
