"""Sampler benchmark: the one-jit while_loop decode against a Python loop per token, same tiny model, CPU.

Run: python bench/bench_sampler.py [--batch 8] [--prompt 32] [--new 64] [--rounds 7] [--small-vocab 1024]
Both paths share the jitted prefill and the same jitted decode step (trainer.sampling.sampler.decode_one);
the reference calls that step once per token from Python and reads `done` back to the host each time (the
per-token host sync), the while_loop path runs every step inside one jitted lax.while_loop. Greedy, no
EOS, so both produce the same B x new tokens (checked). Medians of --rounds timed runs after one warm-up.
Then the while_loop sampler with bf16 compute (bf16 KV cache and decode attention, float32 scores) against
float32 compute. Two models: `tiny` with the real 151,936-row vocabulary (its per-token cost is the
D x V lm_head and the softmax over V) and the same shapes with a small vocabulary (per-token cost is then
mostly dispatch, which is what the while_loop removes). Prints a table with tokens/s and ratios.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--small-vocab", type=int, default=1024)
    args = parser.parse_args()

    import jax

    from trainer.make_tiny import make_tiny
    from trainer.model.loading import load_pretrained
    from trainer.model.qwen2 import init_params

    folder = make_tiny(Path(tempfile.mkdtemp()) / "tiny", "tiny", 0)
    config, params = load_pretrained(folder, dtype="float32")
    print(f"device={jax.devices()[0].device_kind} batch={args.batch} prompt={args.prompt} new={args.new} "
          f"rounds={args.rounds} (medians of timed runs after a warm-up)")  # fmt: skip
    print(f"{'model':<26} {'path':<40} {'s/generate':>10} {'tokens/s':>10} {'vs loop':>8}")
    bench_model(args, "tiny (vocab 151936)", config, params)
    small = config.replace(vocab_size=args.small_vocab)
    bench_model(args, f"tiny-smallvocab ({args.small_vocab})", small, init_params(small, jax.random.key(0)))


def bench_model(args: argparse.Namespace, label: str, config32: Any, params: Any) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    from trainer.sampling import sampler

    B, P, C = args.batch, args.prompt, args.new
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(0, config32.vocab_size, size=(B, P)), jnp.int32)
    mask = jnp.ones((B, P), jnp.int32)
    sampling = sampler.SamplingConfig(C, greedy=True)
    kw = {"eos_E": jnp.full((8,), -1, jnp.int32), "pad_id": jnp.int32(0), "sampling": sampling}
    step = jax.jit(functools.partial(sampler.decode_one, config=config32, **kw), donate_argnums=(1,))

    def while_loop(config: Any) -> np.ndarray:
        out = sampler.generate(params, config, ids, mask, jax.random.key(0), sampling, (-1,), 0)
        return np.asarray(out.completion_ids_BC)

    def python_loop(config: Any) -> np.ndarray:
        state = sampler._prefill(params, ids, mask, jax.random.key(0), config=config, mesh=None, **kw)
        for _ in range(C - 1):
            state = step(params, state)
            if bool(jnp.all(state.done_B)):  # the per-token host sync a Python loop needs for EOS
                break
        return np.asarray(state.tokens_BC)

    def timed(fn: Any, config: Any) -> tuple[float, np.ndarray]:
        tokens = fn(config)  # warm-up: compiles
        times = []
        for _ in range(args.rounds):
            t0 = time.perf_counter()
            fn(config)
            times.append(time.perf_counter() - t0)
        return statistics.median(times), tokens

    t_loop, tok_loop = timed(python_loop, config32)
    t_while, tok_while = timed(while_loop, config32)
    assert np.array_equal(tok_loop, tok_while), "the two paths disagree"
    t_bf16, _ = timed(while_loop, config32.replace(dtype="bfloat16"))
    rows = [
        ("python loop per token, f32", t_loop),
        ("while_loop in one jit, f32", t_while),
        ("while_loop in one jit, bf16 attention", t_bf16),
    ]
    for name, t in rows:
        print(f"{label:<26} {name:<40} {t:>10.4f} {B * C / t:>10.1f} {t_loop / t:>7.2f}x")
    print(f"{label:<26} while_loop/python-loop {t_loop / t_while:.2f}x; bf16/f32 {t_while / t_bf16:.2f}x")


if __name__ == "__main__":
    main()
