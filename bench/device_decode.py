"""Where the decode loop's time goes on one GPU: the trainer's real rollout (prefill + `lax.while_loop` decode) at
one model size, timed per token at several batch sizes, with one profiled run summarised kernel by kernel.

Run (repository root, on the GPU machine): `python bench/device_decode.py` (part of bench/device_probe.sh).
Settings (environment): DEVICE_DECODE_SIZE (3b; tiny on CPU), DEVICE_DECODE_BATCHES (128,32: sequences per
rollout, 8 samples of each prompt), DEVICE_DECODE_PROMPT_LEN (512), DEVICE_DECODE_NEW_TOKENS (256),
DEVICE_DECODE_REPEATS (2), DEVICE_DECODE_PROFILE (1: profile one rollout at the first batch size),
DEVICE_DECODE_HLO (1: save the compiled decode program; one more compile), DEVICE_DECODE_LAYERS (auto: the
decode's layer loop, `rollout.decode_layers`; scan or unrolled).
Output: stdout, and $OUT/device_decode.json when OUT is set (the compiled decode program's text too,
gzipped, so its fusions can be read here).

Why: bench/device_step.sh measured the decode at 11-16% of HBM bandwidth on an H100 (3B, 128 sequences:
17 ms per token against ~2 ms of weight reads). If the time per token hardly moves from 32 to 128 sequences,
the loop is bound by per-token fixed costs (kernel launches, small collectives, the loop's control), not by
the bytes the bound counts; the profile names the kernels that take the time.
"""

from __future__ import annotations

import gzip
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import device_step  # noqa: E402  (the bench's helpers: shapes, random weights, prompts)
from device_workload import summarize_trace  # noqa: E402


def _env(name: str, default: str) -> str:
    return os.environ.get(name) or default  # set but empty: the default


def main() -> int:
    import jax
    import numpy as np

    from trainer import config
    from trainer.distributed import global_array
    from trainer.fit.programs import training_mesh
    from trainer.layout import decode_layout
    from trainer.sampling import sampler

    on_cpu = jax.default_backend() == "cpu"
    size = _env("DEVICE_DECODE_SIZE", "tiny" if on_cpu else "3b")
    batches = [int(b) for b in _env("DEVICE_DECODE_BATCHES", "8,4" if on_cpu else "128,32").split(",") if b]
    P_len = int(_env("DEVICE_DECODE_PROMPT_LEN", "256" if on_cpu else "512"))
    C = int(_env("DEVICE_DECODE_NEW_TOKENS", "8" if on_cpu else "256"))
    repeats = int(_env("DEVICE_DECODE_REPEATS", "2"))
    profile = _env("DEVICE_DECODE_PROFILE", "1") == "1"
    hlo = _env("DEVICE_DECODE_HLO", "1") == "1"
    layers = _env("DEVICE_DECODE_LAYERS", "auto")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    dtype = "float32" if on_cpu else "bfloat16"
    dev = jax.devices()[0]
    result: dict[str, Any] = {"size": size, "device": f"{jax.default_backend()} {dev.device_kind}",
                              "jax": jax.__version__, "prompt_len": P_len, "new_tokens": C, "runs": []}  # fmt: skip

    def save() -> None:
        if out_dir:
            (out_dir / "device_decode.json").write_text(json.dumps(result, indent=1, default=str))

    sets = [
        "model.path=tiny", f"model.dtype={dtype}", "data.task=gsm8k", f"data.root={device_step.FIXTURES}",
        f"data.prompt_buckets={P_len}", "data.fixed_bucket=true", f"rollout.max_new_tokens={C}",
        "mesh.accelerator=", "log.wandb=disabled", "eval.every=0", f"rollout.decode_layers={layers}", "rollout.tp=0",
    ]  # fmt: skip
    cfg = config.load(device_step.SIZES[size][0], sets)
    mconf = device_step.model_shapes(size, dtype)
    mesh = training_mesh(cfg, jax.devices())
    params = device_step.random_params(mconf, mesh, 0)
    rmesh, to_decode = decode_layout(mesh, mconf, params, cfg.rollout.tp)
    rparams = jax.block_until_ready(to_decode(params))
    del params
    ids_PP, mask_PP, eos, pad, source = device_step.prompts(
        cfg, max(batches) // 8 or 1, P_len, mconf.vocab_size
    )
    result["prompts"] = source
    sampling = sampler.for_rollout(cfg.rollout, jax.default_backend())
    result["attention_block"] = getattr(sampling, "block", None)
    result["decode_layers"] = sampling.layers
    static = sampler.static_args(mconf, sampling, eos, pad, rmesh)

    for bi, B in enumerate(batches):
        ids_NP = np.repeat(ids_PP, 8, axis=0)[:B]
        mask_NP = np.repeat(mask_PP, 8, axis=0)[:B]
        ids, mask = global_array(rmesh, ids_NP), global_array(rmesh, mask_NP)
        run: dict[str, Any] = {"batch": B, "mean_prompt_tokens": float(mask_NP.sum(axis=1).mean())}

        def rollout(seed: int, ids: Any = ids, mask: Any = mask) -> tuple[float, float, int]:
            key = jax.random.key(seed)
            with jax.set_mesh(rmesh):
                t0 = time.perf_counter()
                state = jax.block_until_ready(sampler._prefill(rparams, ids, mask, key, **static))
                t1 = time.perf_counter()
                state = jax.block_until_ready(sampler._decode(rparams, state, **static))
                t2 = time.perf_counter()
            return t1 - t0, t2 - t1, int(state.step)

        t0 = time.perf_counter()
        rollout(0)
        run["first_s"] = round(time.perf_counter() - t0, 2)
        if bi == 0 and hlo:
            with jax.set_mesh(rmesh):
                state = sampler._prefill(rparams, ids, mask, jax.random.key(0), **static)
                text = sampler._decode.lower(rparams, state, **static).compile().as_text()
            if out_dir:
                with gzip.open(out_dir / f"decode_{size}_B{B}.hlo.txt.gz", "wt") as f:
                    f.write(text)
            run["hlo_chars"] = len(text)
            del state
        times = [rollout(i + 1) for i in range(repeats)]
        pre = statistics.median(t[0] for t in times)
        dec = statistics.median(t[1] for t in times)
        fed = times[0][2]
        run.update(prefill_s=round(pre, 4), decode_s=round(dec, 4), positions_fed=fed,
                   ms_per_token=round(1e3 * dec / max(fed, 1), 3),
                   tokens_per_s=round(B * fed / dec, 1))  # fmt: skip
        print(
            f"device_decode {size} {sampling.layers} B={B}: " + " ".join(f"{k}={v}" for k, v in run.items()),
            flush=True,
        )
        if profile and bi == 0:
            trace_dir = Path("/tmp/device_decode_trace")
            try:
                with jax.profiler.trace(str(trace_dir), create_perfetto_trace=True):
                    rollout(99)
                run["profile"] = summarize_trace(trace_dir, fed)
            except Exception as e:  # the timings stand without it
                run["profile"] = {
                    "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
                }
            print(json.dumps(run["profile"], indent=1)[:6000], flush=True)
        result["runs"].append(run)
        save()
    if len(result["runs"]) >= 2:
        a, b = result["runs"][0], result["runs"][-1]
        result["ms_per_token_ratio"] = round(a["ms_per_token"] / b["ms_per_token"], 3)
        print(f"device_decode: {a['batch']} vs {b['batch']} sequences: {a['ms_per_token']} vs "
              f"{b['ms_per_token']} ms per token ({result['ms_per_token_ratio']}x for "
              f"{a['batch'] / b['batch']:.0f}x the sequences)", flush=True)  # fmt: skip
    save()
    return 0


if __name__ == "__main__":
    sys.exit(main())
