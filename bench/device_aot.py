"""The device session's programs compiled for an NVIDIA H100 or H200 on any Linux machine, no GPU: their memory,
the remat policy `train.remat: auto` picks, the micro-batch the update fits at, how many programs compile,
whether the attention is cuDNN's kernel or a Pallas GPU (Triton) one, and how many kernels the decode loop's body
holds, before a device minute is spent.

jax's CUDA plugin compiles for a GPU it does not have (`jax.experimental.topologies.get_topology_desc(platform=
"cuda", target_config=...)`: XLA's deviceless compile, with the card's properties in CARDS). It needs the plugin
of the installed jax, in a venv of its own (about 3 GB of CUDA wheels; nothing else of the project needs it):
  python3 -m venv /tmp/venv-cuda && /tmp/venv-cuda/bin/pip install 'jax[cuda13]==0.11.2' flax optax pyyaml \
    transformers tokenizers safetensors
  JAX_PLATFORMS=cpu /tmp/venv-cuda/bin/python bench/device_aot.py --card h200
The workload and the trainer's settings are bench/device_step.py's (DEVICE_STEP_SIZES, one size, default
3b-seed; DEVICE_STEP_SETS for a variant such as `train.attention_impl=cudnn`; XLA_FLAGS for a compiler variant),
the same programs with the same arguments' shapes: the decode-layout cast, the prefill, the decode loop and the
update, whose micro-batch and remat policy are chosen as device_step chooses them on the card
(device_workload.compile_update), against XLA_PYTHON_CLIENT_MEM_FRACTION (0.92) of the card's memory. Without the
device XLA cannot autotune: the compiled memory is the card's, the compile times are this machine's.
`--json PATH` writes the result (bench/results/aot/ keeps the ones docs/performance.md cites).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import device_workload as dw  # noqa: E402

# Card -> (device kind as jax names it, memory bytes, HBM bytes/s, L2 bytes): XLA's gpu_device_info for a compile
# without the card. Both are Hopper (sm_90, 132 SMs at 1.98 GHz); the memory is what the H200 machine lent here
# reports (143,771 MiB) and the H100 SXM's 80 GB.
CARDS: dict[str, tuple[str, int, int, int]] = {
    "h100": ("NVIDIA H100 80GB HBM3", 84_929_347_584, 3_350_000_000_000, 50 * 2**20),
    "h200": ("NVIDIA H200", 143_771 * 2**20, 4_800_000_000_000, 60 * 2**20),
}


def target_config(card: str, cudnn: tuple[int, int] = (9, 10), cuda: tuple[int, int] = (13, 0)) -> str:
    """XLA's GpuTargetConfigProto (text) for `card`: what a deviceless compile reads instead of the device."""
    kind, memory, bandwidth, l2 = CARDS[card]
    return f"""gpu_device_info {{
  threads_per_block_limit: 1024 threads_per_warp: 32 shared_memory_per_block: 49152
  shared_memory_per_core: 233472 threads_per_core_limit: 2048 core_count: 132 fpus_per_core: 128
  block_dim_limit_x: 2147483647 block_dim_limit_y: 65535 block_dim_limit_z: 65535
  memory_bandwidth: {bandwidth} l2_cache_size: {l2} clock_rate_ghz: 1.98 device_memory_size: {memory}
  shared_memory_per_block_optin: 232448 cuda_compute_capability {{ major: 9 minor: 0 }}
  registers_per_core_limit: 65536 registers_per_block_limit: 65536
}}
platform_name: "CUDA"
dnn_version_info {{ major: {cudnn[0]} minor: {cudnn[1]} }}
runtime_version {{ major: {cuda[0]} minor: {cuda[1]} }}
device_description_str: "{kind}"
"""


def memory(compiled: Any, resident: int) -> dict[str, float]:
    """A compiled program's bytes per device (GB): its arguments, outputs, temporaries, and its peak with what stays
    resident beside it (not its argument)."""
    m = compiled.memory_analysis()
    peak = (
        resident + m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
        + m.temp_size_in_bytes
    )  # fmt: skip
    return {
        "arguments_gb": m.argument_size_in_bytes / 1e9, "outputs_gb": m.output_size_in_bytes / 1e9,
        "temporaries_gb": m.temp_size_in_bytes / 1e9, "peak_gb": peak / 1e9,
    }  # fmt: skip


# Instructions of a compiled GPU program that launch nothing (views, tuples, constants folded into the executable).
NO_KERNEL = {"parameter", "get-tuple-element", "tuple", "bitcast", "constant", "after-all", "partition-id"}
_COMPUTATION = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%?[\w.\-]+ = (.*?) ([a-z][\w\-]*)\(")  # (its type, its op)


def loop_kernels(hlo: str) -> list[int]:
    """Per while loop of a compiled GPU program (its optimized HLO text), the kernels of one iteration: the
    instructions of the loop's body that are not NO_KERNEL (each fusion, library call, copy or collective one; a
    nested loop one, the condition's test one). A deviceless compile is not autotuned (every matmul a Triton
    fusion), so this counts that compile's kernels, not the launches a profile of the card's own compile counts
    (docs/performance.md compares the two)."""
    comps = {
        name: [(m.group(2), line) for line in lines if (m := _INSTRUCTION.match(line))]
        for name, lines in _computations(hlo).items()
    }

    def kernels(name: str) -> int:
        n = 0
        for op, line in comps.get(name, []):
            if op in ("conditional", "call"):  # the launches of the branch or callee
                n += sum(
                    kernels(c)
                    for c in re.findall(r"(?:branch_computations=\{|to_apply=|calls=)%?([\w.\-]+)", line)
                )
            elif op not in NO_KERNEL:
                n += 1
        return n

    bodies = [
        re.search(r"body=%?([\w.\-]+)", line) for ops in comps.values() for op, line in ops if op == "while"
    ]
    return [kernels(b.group(1)) + 1 for b in bodies if b]  # + 1: the condition's test


_BYTES = {"bf16": 2, "f16": 2, "f32": 4, "s32": 4, "u32": 4, "pred": 1, "s8": 1, "u8": 1}


def _shape_bytes(text: str) -> int:
    """Bytes of the array shapes in an HLO type (a tuple's members summed)."""
    total = 0
    for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", text):
        n = 1
        for d in filter(None, dims.split(",")):
            n *= int(d)
        total += n * _BYTES.get(dtype, 0)
    return total


def _computations(hlo: str) -> dict[str, list[str]]:
    """The computations of an optimized HLO text: name -> its instruction lines."""
    comps: dict[str, list[str]] = {}
    current: str | None = None
    for line in hlo.splitlines():
        if not line.startswith(" ") and (m := _COMPUTATION.match(line)):
            current = m.group(1)
            comps[current] = []
        elif line.startswith("}"):
            current = None
        elif current is not None:
            comps[current].append(line)
    return comps


def loop_bodies(hlo: str) -> list[list[str]]:
    """Each while loop's body of a compiled program: its instruction lines (the optimized HLO text)."""
    comps = _computations(hlo)
    whiles = [line for lines in comps.values() for line in lines if " while(" in line]
    return [comps.get(m.group(1), []) for w in whiles if (m := re.search(r"body=%?([\w.\-]+)", w))]


def slice_copies(hlo: str) -> list[int]:
    """Per while loop, the bytes its body copies out of the KV cache each iteration: the outputs of the
    attention's `dynamic_slice` fusions (the xla decode attention's window; XLA:GPU copies it before the matmuls)."""
    out = []
    for body in loop_bodies(hlo):
        n = 0
        for line in body:
            m = _INSTRUCTION.match(line)
            if m and m.group(2) == "fusion" and re.search(r'op_name="[^"]*self_attn/dynamic_slice"', line):
                n += _shape_bytes(m.group(1))
        out.append(n)
    return out


def body_kernels(hlo: str) -> list[str]:
    """The first while loop body's kernels, one line each: the instruction, its output type, its source op."""
    rows = []
    for line in (loop_bodies(hlo) or [[]])[0]:
        m = _INSTRUCTION.match(line)
        if m and m.group(2) not in NO_KERNEL:
            op = re.search(r'op_name="([^"]*)"', line)
            rows.append(f"{m.group(2):<12} {m.group(1)[:48]:<48} {op.group(1)[-70:] if op else ''}")
    return rows


def library_calls(hlo: str) -> dict[str, int]:
    """A compiled program's (its optimized HLO text) cuDNN attention calls (forward and backward kernels) and
    Pallas GPU (Triton) kernel calls (the decode's attention with `rollout.attention_impl=pallas`: one per layer
    in each loop body)."""
    return {"cudnn_calls": hlo.count("__cudnn$fmha"), "triton_calls": hlo.count("__gpu$xla.gpu.triton")}


def compile_all(card: str, size: str, layers: int = 0) -> dict[str, Any]:
    import jax
    from jax.experimental import topologies

    from trainer import config
    from trainer.fit import programs as fp
    from trainer.kernels import resolve_impl
    from trainer.kernels.logprob.blocks import compile_target

    kind, card_bytes, _, _ = CARDS[card]
    limit = int(float(os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")) * card_bytes)
    topo = topologies.get_topology_desc(platform="cuda", target_config=target_config(card), topology="1x1x1")
    devices = list(topo.devices)
    w = dw.workload(size)
    N, P_len, C = w["prompts"] * w["samples"], w["prompt_len"], w["new_tokens"]
    sets = [*dw.trainer_sets(size, "bfloat16", w), f"train.micro_batch={w['micro_batch']}"]
    cfg = config.load(dw.SIZES[size][0], sets)
    mconf = dw.model_shapes(size, "bfloat16")
    if layers:  # fewer layers: the same layer body, each kernel listed (--body) in seconds
        mconf = mconf.replace(num_hidden_layers=layers)
    out: dict[str, Any] = {
        "card": card, "device_kind": kind, "jax": jax.__version__, "commit": dw.commit(),
        "date": time.strftime("%Y-%m-%d", time.gmtime()), "size": size, "workload": w,
        "layers": mconf.num_hidden_layers,
        "sets": os.environ.get("DEVICE_STEP_SETS", ""), "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "limit_gb": limit / 1e9, "programs": {},
    }  # fmt: skip
    with compile_target(f"gpu {kind}"):
        mesh = fp.training_mesh(cfg, devices)
        params, opt_state = fp.state(cfg, mconf, mesh)
        state_bytes = fp.device_bytes(params) + fp.device_bytes(opt_state)
        rollout, facts = fp.step_programs(cfg, devices, fp.ROLLOUT, mconf=mconf)
        for prog in rollout:
            t0 = time.perf_counter()
            compiled = prog.compiled or prog.lowered.compile()
            seconds = prog.compile_s or time.perf_counter() - t0
            hlo = str(compiled.as_text())  # read once: the decode's is large
            out["programs"][prog.name] = {
                "compile_s": round(seconds, 1), **memory(compiled, prog.resident_bytes), **library_calls(hlo),
            }  # fmt: skip
            if prog.name == "decode":  # one loop per attention window (rollout.attention_block)
                out["decode_loop_kernels"] = loop_kernels(hlo)
                out["decode_cache_copies_mib"] = [round(n / 2**20, 1) for n in slice_copies(hlo)]
                out["decode_body"] = body_kernels(hlo)
        impl = resolve_impl(cfg.train.loss_impl, fp.platform())
        args = (params, opt_state, fp.update_batch_like(mesh, N, P_len, C), jax.ShapeDtypeStruct((), "int32"))
        t0 = time.perf_counter()
        upd = dw.compile_update(cfg, mconf, P_len, impl, args, w["micro_batch"], limit, state_bytes)
        out["programs"]["update"] = {
            "compile_s": round(time.perf_counter() - t0, 1), **memory(upd["executable"], 0),
            **library_calls(str(upd["executable"].as_text())),
        }  # fmt: skip
    choice = upd["remat"]
    out.update(
        attention=facts["attention"], micro_batch=upd["micro_batch"], update_compiles=upd["compiles"],
        remat=choice.policy if choice else cfg.train.remat, remat_why=choice.why if choice else "",
        remat_peaks_gb={k: None if v is None else v / 1e9 for k, v in (choice.peaks if choice else {}).items()},
        state_gb=state_bytes / 1e9,
        fits=all(p["peak_gb"] * 1e9 <= limit for p in out["programs"].values()),
    )  # fmt: skip
    return out


def table(r: dict[str, Any]) -> str:
    lines = [
        f"{r['size']} for {r['device_kind']} (jax {r['jax']}, deviceless), limit {r['limit_gb']:.1f} GB"
        f"{', sets ' + r['sets'] if r['sets'] else ''}{', XLA_FLAGS ' + r['xla_flags'] if r['xla_flags'] else ''}",
        f"decode ({r['layers']} layers): kernels in each loop's body {r['decode_loop_kernels']} (this compile's, "
        f"not autotuned); cache copied per iteration, MiB {r['decode_cache_copies_mib']}",
        f"update: micro-batch {r['micro_batch']}, remat {r['remat']} ({r['update_compiles']} compiled)"
        + (f": {r['remat_why']}" if r["remat_why"] else ""),
        f"{'program':<12} {'compile s':>9} {'args GB':>8} {'temp GB':>8} {'peak GB':>8} {'cudnn':>5} {'triton':>6}",
    ]
    for name, p in r["programs"].items():
        lines.append(
            f"{name:<12} {p['compile_s']:>9.1f} {p['arguments_gb']:>8.2f} {p['temporaries_gb']:>8.2f} "
            f"{p['peak_gb']:>8.2f} {p['cudnn_calls']:>5} {p.get('triton_calls', 0):>6}"
        )
    lines.append(f"fits: {'yes' if r['fits'] else 'NO'}")
    return "\n".join(lines)


def cuda_plugin() -> bool:
    """Whether jax's CUDA plugin (which compiles for a GPU without one) is installed."""
    import importlib.util

    try:
        return any(importlib.util.find_spec(f"jax_plugins.xla_cuda{v}") for v in (13, 12))
    except ModuleNotFoundError:  # no jax_plugins at all
        return False


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--card", choices=sorted(CARDS), default="h200")
    ap.add_argument("--json", type=Path, help="write the result here")
    ap.add_argument("--layers", type=int, default=0, help="the model's depth (default: the size's)")
    ap.add_argument(
        "--body", action="store_true", help="list the first decode loop body's kernels (not in --json)"
    )
    a = ap.parse_args(argv)
    size = os.environ.get("DEVICE_STEP_SIZES", "3b-seed")
    if size not in dw.SIZES or "," in size:
        ap.error(f"DEVICE_STEP_SIZES must be one of {sorted(dw.SIZES)}, received {size!r}")
    if not cuda_plugin():
        ap.error("no jax CUDA plugin here: pip install 'jax[cuda13]==<this jax>' (module docstring)")
    r = compile_all(a.card, size, a.layers)
    body = r.pop("decode_body")  # kept out of the record: one line per kernel
    if a.body:
        print("\n".join(body))
    print(table(r))
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(r, indent=1) + "\n")
    return 0 if r["fits"] else 1


if __name__ == "__main__":
    sys.exit(main())
