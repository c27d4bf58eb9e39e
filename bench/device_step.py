"""The trainer's real GRPO step (decode-layout cast, prefill + decode, update) timed on one accelerator at
Qwen2.5-0.5B, 1.5B and 3B shapes, beside an analytic roofline for the same GPU (bench/step_roofline.py).

Run (repository root): `bash bench/device_step.sh` (the GPU sizes) or, to check it on CPU,
`DEVICE_STEP_SIZES=tiny bash bench/device_step.sh`. Each size runs in its own process with a time cap (a
share of DEVICE_STEP_BUDGET_S, default 450 s for all sizes: a size that fails or runs out of time loses only
itself, and its partial figures are kept). Random init on the device (nothing downloads), the model shapes
from tests/fixtures/data/qwen2.5-configs, GSM8K prompts from tests/fixtures/data through the real tokenizer
and chat template, left-padded to the prompt bucket (random full-length prompts if the tokenizer cannot load).
Per size: the trainer's jitted programs (trainer.layout.decode_layout's cast, trainer.sampling.sampler's
generate, trainer.loop.programs.make_update), one warm-up step (compiles), then up to DEVICE_STEP_STEPS timed
steps (medians). Printed and written to $OUT (device_step.json, device_step.txt) when $OUT is set; each finished
size also as a results record (bench/results_record.py) in bench/results/ on a GPU or TPU, or in the folder
`--results DIR` / DEVICE_STEP_RESULTS names (a CPU run writes none without it).

Settings (environment): DEVICE_STEP_SIZES (tiny,0.5b,1.5b,3b; also 3b-seed: the seed's preset, 1024 new
tokens, its attention windows), DEVICE_STEP_PROMPTS (16), DEVICE_STEP_SAMPLES (8), DEVICE_STEP_PROMPT_LEN
(512), DEVICE_STEP_NEW_TOKENS (512), DEVICE_STEP_STEPS (3), DEVICE_STEP_MICRO (per size: 16, 16, 8; halved
until the update's compiled memory fits), DEVICE_STEP_BUDGET_S (450), DEVICE_STEP_LAYERS (the decode's layer
loop, `rollout.decode_layers`: auto, scan or unrolled; auto is unrolled on a GPU), DEVICE_STEP_SETS (more
trainer `--set` overrides, space-separated, applied last: a variant such as `rollout.eos_check_every=8`),
DEVICE_STEP_XLA_FLAGS (appended to XLA_FLAGS in each size's process: a compiler variant). Both are kept in the
result and, as every DEVICE_STEP_* setting, in the record's command. DEVICE_STEP_PROFILE=update: after the timed
steps, one more update under jax.profiler, its device kernels summed by name into the record (`update_profile`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import device_workload as dw  # noqa: E402
import results_record  # noqa: E402 (bench/, on the path above)

# ---------------------------------------------------------------------------------------------- one size


class Recorder:
    """The size's result, rewritten to disk after every phase so a killed run still leaves its figures."""

    def __init__(self, path: Path, size: str) -> None:
        self.path, self.data = path, {"size": size, "status": "started"}

    def put(self, **values: Any) -> None:
        self.data.update(values)
        self.path.write_text(json.dumps(self.data, indent=1, default=str))

    def say(self, text: str) -> None:
        print(f"device_step {self.data['size']}: {text}", flush=True)


def run_one(size: str, result: Path, deadline: float) -> int:
    rec = Recorder(result, size)
    try:
        measure(size, rec, deadline)
    except Exception as e:  # the parent reports it; the traceback goes to stderr for the log
        import traceback

        traceback.print_exc()
        rec.put(status="error", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}")
        return 1
    return 0


def measure(size: str, rec: Recorder, deadline: float) -> None:
    t_start = time.perf_counter()
    import jax
    import numpy as np
    import step_roofline

    from trainer import config
    from trainer.distributed import global_array, to_host
    from trainer.fit.programs import training_mesh
    from trainer.kernels import resolve_impl
    from trainer.layout import decode_layout, init_opt_state
    from trainer.loop.programs import optimizer
    from trainer.model import flash
    from trainer.sampling import sampler

    w = dw.workload(size)
    dev = jax.devices()[0]
    gpu, note = step_roofline.gpu_for(dev.device_kind)
    rec.put(workload=w, device=f"{jax.default_backend()} {dev.device_kind} x{len(jax.devices())}",
            jax=jax.__version__, peaks={"name": gpu.name, "hbm_bw": gpu.hbm_bw, "bf16_flops": gpu.bf16_flops},
            peaks_note=note, platform=jax.default_backend(), device_kind=dev.device_kind,
            driver=results_record.driver_version(jax.default_backend()))  # fmt: skip
    N, P_len, C = w["prompts"] * w["samples"], w["prompt_len"], w["new_tokens"]
    dtype = "float32" if size == "tiny" and jax.default_backend() == "cpu" else "bfloat16"
    sets = dw.trainer_sets(size, dtype, w)
    rec.put(sets=os.environ.get("DEVICE_STEP_SETS", ""), xla_flags=os.environ.get("XLA_FLAGS", ""))
    cfg = config.load(dw.SIZES[size][0], sets)
    mconf = dw.model_shapes(size, dtype)
    mesh = training_mesh(cfg, jax.devices())

    t0 = time.perf_counter()
    params = dw.random_params(mconf, mesh, 0)
    opt = optimizer(cfg)
    opt_state = init_opt_state(opt, params, mesh)(params)
    jax.block_until_ready((params, opt_state))
    n_params = sum(int(np.prod(x.shape)) for x in jax.tree_util.tree_leaves(params))
    rec.say(f"{n_params / 1e9:.3f} B parameters and AdamW state made on {dev.device_kind} in "
            f"{time.perf_counter() - t0:.1f} s")  # fmt: skip

    ids_PP, mask_PP, eos, pad, source = dw.prompts(cfg, w["prompts"], P_len, mconf.vocab_size)
    ids_NP, mask_NP = np.repeat(ids_PP, w["samples"], axis=0), np.repeat(mask_PP, w["samples"], axis=0)
    prompt_lens = [int(x) for x in mask_NP.sum(axis=1)]
    rec.put(n_params=n_params, prompts=source, mean_prompt_tokens=float(np.mean(prompt_lens)))
    rec.say(f"prompts: {source}; {np.mean(prompt_lens):.0f} real tokens of {P_len} on average")

    rmesh, to_decode = decode_layout(mesh, mconf, params, cfg.rollout.tp)
    # the prefill attends as the trainer's rollout picks for this bucket (trainer.loop.rollout)
    rconf = mconf.replace(attention=flash.resolve(cfg.train.attention_impl, P_len, strict=False))
    impl = resolve_impl(cfg.train.loss_impl, jax.default_backend())
    sampling = sampler.for_rollout(cfg.rollout, jax.default_backend())
    rec.put(decode_layers=sampling.layers, eos_check_every=sampling.eos_every,
            attention={"prefill": rconf.attention, "update": flash.resolve(cfg.train.attention_impl, P_len + C)})  # fmt: skip
    rng = np.random.default_rng(1)

    # The update, compiled ahead of time so its memory is known before it runs (bench/device_aot.py compiles the
    # same for a GPU without one): the micro-batch halved until it fits beside the weights and optimizer state.
    zeros_NC = np.zeros((N, C), np.int32)
    like = dw.update_batch(ids_NP, mask_NP, zeros_NC, zeros_NC, zeros_NC.astype(np.float32), np.zeros(N))
    glike = {k: global_array(mesh, np.asarray(v)) for k, v in like.items()}
    t0 = time.perf_counter()
    stats = dev.memory_stats() or {}
    compiled = dw.compile_update(
        cfg, mconf, P_len, impl, (params, opt_state, glike, np.int32(cfg.train.steps)), w["micro_batch"],
        stats.get("bytes_limit"), stats.get("bytes_in_use", 0), say=rec.say,
    )  # fmt: skip
    if compiled["remat"] is not None:
        rec.put(remat=compiled["remat"].policy, remat_why=compiled["remat"].why)
    update, micro, need, free = (compiled[k] for k in ("executable", "micro_batch", "need", "free"))
    update_compile_s = time.perf_counter() - t0
    w["micro_batch"] = micro
    n_micro = N // micro
    rec.put(workload=w, update_compile_s=update_compile_s, update_compiles=compiled["compiles"],
            update_memory_gb=need / 1e9, free_gb=free / 1e9,
            update_xla_cost=dw.xla_cost(update))  # fmt: skip
    del glike

    # The standalone prefill, timed apart to split the rollout into prefill and decode (trainer.fit lowers
    # the same function with the same static arguments).
    # (Internal names: if the sampler changes them, the split is lost, not the run.)
    split: dict[str, str | None] = {"error": None}

    def prefill(rparams: Any, ids: Any, mask: Any) -> float:
        if split["error"]:
            return 0.0
        t0 = time.perf_counter()
        try:
            static = sampler.static_args(rconf, sampling, eos, pad, rmesh, w["samples"])
            with jax.set_mesh(rmesh):
                jax.block_until_ready(
                    sampler._prefill(rparams, ids, mask, jax.random.key(7), **static).tokens_BC
                )
        except Exception as e:
            split["error"] = f"prefill not timed apart ({type(e).__name__}): decode_s is the whole generate"
            rec.put(split_error=split["error"])
            return 0.0
        return time.perf_counter() - t0

    state = {"params": params, "opt_state": opt_state}
    del params, opt_state

    def step(i: int) -> dict[str, float]:
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        rparams = jax.block_until_ready(to_decode(state["params"]))
        t["cast_s"] = time.perf_counter() - t0
        ids, mask = global_array(rmesh, ids_NP), global_array(rmesh, mask_NP)
        t["prefill_s"] = prefill(rparams, ids, mask)  # not part of the step: it only splits the rollout
        t0 = time.perf_counter()
        key = jax.random.fold_in(jax.random.key(cfg.train.seed), i)
        out = sampler.generate(
            rparams, rconf, ids, mask, key, sampling, eos, pad, mesh=rmesh, samples=w["samples"]
        )
        comp, cmask, old = (
            to_host(out.completion_ids_BC),
            to_host(out.completion_mask_BC),
            to_host(out.logprobs_BC),
        )
        t["generate_s"] = time.perf_counter() - t0
        t["decode_iters"] = int(out.steps) - 1
        t["tokens"] = int(cmask.sum())
        del rparams, out
        t0 = time.perf_counter()
        adv = rng.standard_normal(N)  # GRPO advantages: some positive, some negative
        batch = dw.update_batch(ids_NP, mask_NP, comp, cmask, old, adv)
        gbatch = state["batch"] = {k: global_array(mesh, np.asarray(v)) for k, v in batch.items()}
        t["host_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        state["params"], state["opt_state"], stats = update(
            state["params"], state["opt_state"], gbatch, np.int32(cfg.train.steps)
        )
        t["loss"] = float(stats["loss"])
        t["update_s"] = time.perf_counter() - t0
        t["decode_s"] = max(t["generate_s"] - t["prefill_s"], 0.0)
        t["step_s"] = t["cast_s"] + t["generate_s"] + t["host_s"] + t["update_s"]
        return t

    t0 = time.perf_counter()
    first = step(0)
    compile_s = update_compile_s + time.perf_counter() - t0 - first["update_s"]
    rec.put(status="warm", first_step=first, compile_s=compile_s)
    rec.say(f"first step {time.perf_counter() - t0:.1f} s (compiles: cast, prefill, decode loop); "
            f"update compiled in {update_compile_s:.1f} s before it")  # fmt: skip
    steps: list[dict[str, float]] = []
    while len(steps) < w["steps"]:
        if not dw.another_step_fits(steps, time.time(), deadline):
            rec.say(f"stopping after {len(steps)} timed steps: the size's time cap is near")
            break
        steps.append(step(len(steps) + 1))
        rec.say(" ".join(f"{k}={v:.3f}" for k, v in steps[-1].items() if k.endswith("_s")))
        summarize(rec, mconf, n_params, prompt_lens, P_len, C, n_micro, gpu, steps, compile_s, w["samples"])
    if not steps:
        raise RuntimeError("no timed step fitted in the size's time cap (the warm-up step is in first_step)")
    if os.environ.get("DEVICE_STEP_PROFILE") == "update":
        profile_update(rec, update, state, np.int32(cfg.train.steps), steps[-1]["update_s"], deadline)
    rec.put(status="ok", wall_s=time.perf_counter() - t_start)


def profile_update(
    rec: Recorder, update: Any, state: dict[str, Any], step: Any, update_s: float, deadline: float
) -> None:
    """One more update, on the last timed step's batch, under jax.profiler, after the timed steps (so they are
    not perturbed): its device kernels summed by name into the size's `update_profile` (dw.summarize_trace),
    when the size's time cap leaves the update and 20 s more for it (the trace's writing and reading)."""
    import shutil

    import jax

    if time.time() + update_s + 20 > deadline:
        rec.put(update_profile={"skipped": "the size's time cap is near"})
        rec.say("update profile skipped: the size's time cap is near")
        return
    trace_dir = Path(tempfile.mkdtemp(prefix="device-step-trace-"))
    try:
        with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
            out = jax.block_until_ready(update(state["params"], state["opt_state"], state["batch"], step))
        state["params"], state["opt_state"] = out[0], out[1]
        summary = dw.summarize_trace(trace_dir, 1, top=25)
    except Exception as e:  # a profile that fails loses only itself
        summary = {"error": f"{type(e).__name__}: {e}"[:500]}
    finally:
        shutil.rmtree(trace_dir, ignore_errors=True)
    rec.put(update_profile=summary)
    top = ", ".join(f"{k['name'][:40]} {k['ms']:.0f} ms" for k in summary.get("top", [])[:5])
    rec.say(
        f"update profile: {summary.get('device_kernel_ms', 0)} ms of device kernels; top: {top or summary}"
    )


def summarize(
    rec: Recorder, mconf: Any, n_params: int, prompt_lens: list[int], P_len: int, C: int, n_micro: int,
    gpu: Any, steps: list[dict[str, float]], compile_s: float, samples: int,
) -> None:  # fmt: skip
    """Medians of the timed steps, MBU and MFU against the needed work, and the roofline for the same work."""
    import step_roofline

    med = {k: statistics.median(s[k] for s in steps) for k in steps[0]}
    iters = round(med["decode_iters"])
    counts = step_roofline.phase_counts(mconf, n_params, prompt_lens, P_len, C, iters, n_micro, samples)
    bounds = {k: step_roofline.bound_s(v, gpu) for k, v in counts.items()}
    model_flops = sum(v["flops"] for v in counts.values())
    measured = {
        **{k: v for k, v in med.items()},
        "compile_s": compile_s,
        # the decode loop's own tokens: the first of each row is sampled by the prefill
        "decode_tokens_per_s": (med["tokens"] - len(prompt_lens)) / med["decode_s"]
        if med["decode_s"]
        else None,
        "decode_ms_per_iter": 1e3 * med["decode_s"] / iters if iters else None,
        "decode_mbu": counts["decode"]["bytes"] / med["decode_s"] / gpu.hbm_bw if med["decode_s"] else None,
        "decode_hbm_tb_s": counts["decode"]["bytes"] / med["decode_s"] / 1e12 if med["decode_s"] else None,
        "prefill_mfu": counts["prefill"]["flops"] / med["prefill_s"] / gpu.bf16_flops
        if med["prefill_s"]
        else None,
        "update_mfu": counts["update"]["flops"] / med["update_s"] / gpu.bf16_flops,
        "step_mfu": model_flops / med["step_s"] / gpu.bf16_flops,
        "timed_steps": len(steps),
    }
    estimate = {
        "method": "analytic (bench/step_roofline.py): needed FLOPs and bytes at 100% of the peaks",
        "step_s": sum(bounds.values()),
        "phases_s": bounds,
        "counts": counts,
    }
    rec.put(measured=measured, estimate=estimate, steps=steps)


# ------------------------------------------------------------------------------------------------ parent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", help="(internal) run one size in this process")
    ap.add_argument("--result", type=Path, help="(internal) where --one writes its JSON")
    ap.add_argument("--deadline", type=float, default=0.0, help="(internal) epoch seconds")
    ap.add_argument(
        "--results", type=Path, default=Path(os.environ["DEVICE_STEP_RESULTS"]) if os.environ.get("DEVICE_STEP_RESULTS")
        else None, help="write each size's results record here (default: bench/results/ for a GPU or TPU run, "
        "nowhere for a CPU run; also DEVICE_STEP_RESULTS)",
    )  # fmt: skip
    args = ap.parse_args(argv)
    if args.one:
        return run_one(args.one, args.result, args.deadline or time.time() + 3600)

    sizes = [s.strip() for s in os.environ.get("DEVICE_STEP_SIZES", "0.5b,1.5b,3b").split(",") if s.strip()]
    unknown = [s for s in sizes if s not in dw.SIZES]
    if unknown:
        print(f"device_step: unknown size {unknown[0]!r} in DEVICE_STEP_SIZES (known: {', '.join(dw.SIZES)})",
              file=sys.stderr)  # fmt: skip
        return 2
    budget = float(os.environ.get("DEVICE_STEP_BUDGET_S", "450"))
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.setdefault("XLA_PYTHON_CLIENT_MEM_FRACTION", "0.92")
    if extra := os.environ.get(
        "DEVICE_STEP_XLA_FLAGS", ""
    ).strip():  # read by XLA when the size's process starts
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra}".strip()
    start = time.time()
    report: dict[str, Any] = {"commit": dw.commit(), "started": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
                              "budget_s": budget, "sizes": []}  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="device-step-") as tmp:
        for i, size in enumerate(sizes):
            left = budget - (time.time() - start)
            cap = left * dw.SIZES[size][3] / sum(dw.SIZES[s][3] for s in sizes[i:])
            if cap < 30:
                report["sizes"].append({"size": size, "status": "skipped", "error": f"{left:.0f} s left"})
                continue
            path = Path(tmp) / f"{size}.json"
            print(f"device_step: {size} with a cap of {cap:.0f} s", flush=True)
            cmd = [sys.executable, __file__, "--one", size, "--result", str(path), "--deadline",
                   str(time.time() + cap - 10)]  # fmt: skip
            proc = subprocess.Popen(cmd, env=env, start_new_session=True)
            try:
                rc = proc.wait(timeout=cap)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                rc = None
            r = json.loads(path.read_text()) if path.exists() else {"size": size, "status": "no result"}
            if rc is None:
                r.update(status="timeout" if r.get("status") != "ok" else "ok",
                         error=r.get("error") or f"killed at its {cap:.0f} s cap")  # fmt: skip
            elif rc != 0 and r.get("status") != "error":
                r.update(status="error", error=r.get("error") or f"exit {rc}")
            report["sizes"].append(r)
            rec = results_record.build(r, config=dw.SIZES[size][0], commit=report["commit"], started=start)
            where = results_record.folder(args.results, rec["platform"]) if rec else None
            if rec is not None and where is not None:
                report.setdefault("records", []).append(str(results_record.write(rec, where)))
            write(report, out_dir)
    report["wall_s"] = time.time() - start
    text = write(report, out_dir)
    print(text, flush=True)
    return 0 if all(r.get("status") == "ok" for r in report["sizes"]) else 1


def write(report: dict[str, Any], out_dir: Path | None) -> str:
    import step_roofline

    sizes = report["sizes"]
    dev = next((r["device"] for r in sizes if r.get("device")), "?")
    peaks: dict[str, Any] = next((r["peaks"] for r in sizes if r.get("peaks")), {})
    text = (
        f"device_step: {dev}, commit {report['commit']}, {report['started']}\n"
        f"bound = analytic roofline of the needed work at {peaks.get('name', '?')} peaks "
        f"(HBM {peaks.get('hbm_bw', 0) / 1e12:.2f} TB/s, {peaks.get('bf16_flops', 0) / 1e12:.0f} TFLOP/s bf16 dense); "
        "medians of the timed steps; MBU = decode's needed bytes / decode time / peak HBM; "
        "MFU = model FLOPs (3x forward) / time / peak\n" + step_roofline.render(sizes)
    )
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "device_step.json").write_text(json.dumps(report, indent=1, default=str))
        (out_dir / "device_step.txt").write_text(text + "\n")
    return text


if __name__ == "__main__":
    sys.exit(main())
