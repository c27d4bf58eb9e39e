"""Batched sampling: one prefill, then the whole decode in one jitted lax.while_loop over a KV cache.

Dims: B batch, P prompt bucket (prompts LEFT-padded), C = max_new_tokens, V vocab, S = P + C.
generate() dispatches two jitted functions, `_prefill` and `_decode`; both are cached on
(batch, bucket, config, sampling), so a run compiles each once per bucket. With `samples` G > 1 the rows come
in groups of G copies of one prompt (GRPO's samples per prompt): the prefill runs each prompt once and hands
its KV cache and first-token logits to the group's G rows. There is no
Python loop; the loop stops early once every sequence has emitted an EOS id, tested every `eos_every` positions
(a GPU copies each test's flag to the host: `_decode`).
`logprobs_BC` is the log-probability of each sampled token under the distribution that drew it: the
temperature-scaled softmax after top-k/top-p filtering (greedy: the unfiltered temperature-scaled one).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import flax.struct
import jax
import jax.numpy as jnp
from jax import Array
from jax.sharding import Mesh

from trainer import sharding
from trainer.model import qwen2, unrolled
from trainer.model.config import Qwen2Config
from trainer.sampling import kv_cache, split
from trainer.sampling.kv_cache import KVCache
from trainer.sampling.tokens import LAYER_LOOPS, SamplingConfig

if TYPE_CHECKING:
    from trainer.config import RolloutConfig


def for_rollout(rollout: RolloutConfig, platform: str, greedy: bool = False) -> SamplingConfig:
    """The sampling settings of the config's `rollout` section, its layer loop chosen for `platform`."""
    r = rollout
    return SamplingConfig(
        r.max_new_tokens, r.temperature, r.top_k, r.top_p, greedy=greedy, block=r.attention_block,
        layers=layers_for(r.decode_layers, platform), eos_every=r.eos_check_every,
        attention=attention_for(r.attention_impl, platform),
    )  # fmt: skip


PALLAS_DECODE_ON_TPU = (
    "rollout.attention_impl=pallas is a GPU kernel (Pallas Triton); on a TPU use rollout.attention_impl=xla (the "
    "TPU compiler reads the cache window in place)"
)


def attention_for(choice: str, platform: str) -> str:
    """The decode's attention for `rollout.attention_impl` on `platform`: pallas is a Pallas GPU (Triton) kernel,
    run in interpret mode off a GPU (the CPU tests) and refused on a TPU, whose compiler reads the window in place."""
    if choice == "pallas" and platform == "tpu":
        raise ValueError(PALLAS_DECODE_ON_TPU)
    return choice


def layers_for(choice: str, platform: str) -> str:
    """The decode's layer loop for `rollout.decode_layers` on `platform` (jax's backend name): "auto" is
    "unrolled" on GPU (XLA:GPU copies each layer's slice of a stack before its matmuls) and "scan" elsewhere
    (the TPU compiler reads the stack in place, and one layer body compiles L times faster)."""
    if choice == "auto":
        return "unrolled" if platform in ("gpu", "cuda", "rocm") else "scan"
    if choice not in LAYER_LOOPS:
        raise ValueError(f"rollout.decode_layers must be auto, scan or unrolled, received {choice!r}")
    return choice


@flax.struct.dataclass
class SampleOutput:
    completion_ids_BC: Array
    completion_mask_BC: Array
    logprobs_BC: Array
    prompt_ids_BP: Array
    prompt_mask_BP: Array
    steps: Array  # int32 scalar: decode positions actually run (< C when all stopped early)


@flax.struct.dataclass
class DecodeState:
    if TYPE_CHECKING:  # flax.struct.dataclass adds replace(); declared for the type checker only

        def replace(self, **updates: Any) -> DecodeState: ...

    cache: KVCache
    tokens_BC: Array
    mask_BC: Array
    logprobs_BC: Array
    done_B: Array
    positions_B: Array
    step: Array  # completion position of the last sampled token
    rng: Array


def _record(state: DecodeState, token_B: Array, logprob_B: Array, eos_E: Array, pad_id: Array) -> Any:
    """Write column `step` (dynamic_update_slice, not a scatter: cheaper inside the loop on CPU)."""
    live_B = ~state.done_B
    token_B = jnp.where(live_B, token_B, pad_id)

    def put(buf_BC: Array, col_B: Array) -> Array:
        return jax.lax.dynamic_update_slice_in_dim(buf_BC, col_B[:, None].astype(buf_BC.dtype), state.step, 1)

    return state.replace(
        tokens_BC=put(state.tokens_BC, token_B),
        mask_BC=put(state.mask_BC, live_B),
        logprobs_BC=put(state.logprobs_BC, jnp.where(live_B, logprob_B, 0.0)),
        done_B=state.done_B | jnp.any(token_B[:, None] == eos_E[None, :], axis=-1),
    )


_STATIC = ("config", "sampling", "mesh", "samples")
_EOS_SLOTS = 8


@functools.partial(jax.jit, static_argnames=_STATIC)
def _prefill(
    params: Any, prompt_ids_BP: Array, prompt_mask_BP: Array, rng: Array, *, config: Qwen2Config,
    eos_E: Array, pad_id: Array, sampling: SamplingConfig, mesh: Mesh | None, samples: int = 1,
) -> DecodeState:  # fmt: skip
    """Run each prompt once, seed the cache, sample completion token 0.

    Rows come in groups of `samples` copies of one prompt (`generate`): the model runs on the first row of each
    group [U = B / samples, P] and its keys/values and last logits are repeated over the group's rows (a
    broadcast: each device repeats its own prompts when U splits as B does), so a step with G samples per prompt
    pays one G-th of the prefill's FLOPs (and the decode reads each group's prompt slots once: `_decode`)."""
    B, P = prompt_ids_BP.shape
    C = sampling.max_new_tokens
    if samples < 1 or B % samples:
        raise ValueError(f"samples must be >= 1 and divide the {B} rows, received {samples}")
    U = B // samples
    positions_BP = jnp.maximum(jnp.cumsum(prompt_mask_BP, axis=1) - 1, 0)
    ids_UP, mask_UP, positions_UP = (
        x.reshape(U, samples, P)[:, 0] for x in (prompt_ids_BP, prompt_mask_BP, positions_BP)
    )
    hidden_UPD, kv = qwen2.forward_with_kv(params, config, ids_UP, positions_UP, mask_UP)
    kv = (_per_row(kv[0], samples, axis=1), _per_row(kv[1], samples, axis=1))
    cache = kv_cache.from_prefill(kv, prompt_mask_BP, P + C)
    if mesh is not None:
        spec = sharding.kv_cache_sharding(mesh, cache.keys.shape)
        cache = cache.replace(
            keys=jax.lax.with_sharding_constraint(cache.keys, spec),
            values=jax.lax.with_sharding_constraint(cache.values, spec),
        )
    logits_BV = _per_row(qwen2.logits_from_hidden(params, config, hidden_UPD[:, -1:])[:, 0], samples, axis=0)
    rng, key = jax.random.split(rng)
    token_B, logprob_B = split.sample(logits_BV, key, sampling, mesh)
    state = DecodeState(
        cache=cache,
        tokens_BC=jnp.full((B, C), pad_id, jnp.int32),
        mask_BC=jnp.zeros((B, C), jnp.int32),
        logprobs_BC=jnp.zeros((B, C), jnp.float32),
        done_B=jnp.zeros((B,), bool),
        positions_B=positions_BP[:, -1] + 1,
        step=jnp.int32(0),
        rng=rng,
    )
    return _record(state, token_B, logprob_B, eos_E, pad_id)


def _per_row(x: Array, samples: int, axis: int) -> Array:
    """x with each entry along `axis` repeated `samples` times in place (a group's rows next to each other)."""
    return x if samples == 1 else jnp.repeat(x, samples, axis=axis)


def segments(max_new_tokens: int, block: int) -> list[tuple[int, int]]:
    """The decode loop's segments [start, end) of completion positions (the position of the token fed in: 0 is
    the prefill's, C - 2 the last fed): one segment without `block`, else `block` positions each."""
    last = max_new_tokens - 1  # positions 0 .. C - 2 are fed; the prefill sampled token 0
    if last <= 0:
        return []
    step = block or last
    return [(start, min(start + step, last)) for start in range(0, last, step)]


@functools.partial(jax.jit, static_argnames=_STATIC, donate_argnames=("state",))
def _decode(
    params: Any, state: DecodeState, *, config: Qwen2Config, eos_E: Array, pad_id: Array,
    sampling: SamplingConfig, mesh: Mesh | None, samples: int = 1,
) -> DecodeState:  # fmt: skip
    """Feed the last sampled token and sample the next, until C tokens or every sequence hit EOS.

    One lax.while_loop per segment (`segments`), each counting its own positions from 0 so its trip count is in
    the program (trainer.fit.hlo reads it), each stopping too when every sequence is done. With
    `sampling.block`, position t attends over the first P + end slots of its segment (slots P + t and before
    hold every token it may see; the rest are not written yet), so early positions read a short cache.
    With `sampling.layers` "unrolled" the loops carry the weights and the cache as per-layer buffers (`qwen2.
    unstack_layers`; the cache as one [1, B, S, K, H] keys/values pair per layer), and the cache is stacked again
    at the end: the returned state is the scan's, slot for slot. With `samples` G > 1 (the state from `_prefill`
    with the same G) each group's prompt slots are read from its first row only (`qwen2.attend_shared_prompt`).
    With `sampling.eos_every` k > 1 a segment of n positions is a loop of n // k trips of k positions each, then
    one trip of the n % k left (`_positions`), each trip only while a sequence is not done: the test runs once per
    k positions, and the returned state is the one k = 1 returns (tokens, log-probs, mask, step, cache)."""
    P = state.cache.length - sampling.max_new_tokens
    config = config.replace(decode_attention=sampling.attention)  # what the decode layers attend with
    stacked = state.cache
    if sampling.layers == "unrolled":  # per-layer buffers for the whole loop: one copy of weights and cache
        L = stacked.keys.shape[0]
        params = unrolled.unstack_layers(params)
        state = state.replace(cache=stacked.replace(
            keys=tuple(stacked.keys[i : i + 1] for i in range(L)),
            values=tuple(stacked.values[i : i + 1] for i in range(L)),
        ))  # fmt: skip
    for start, end in segments(sampling.max_new_tokens, sampling.block):
        one = functools.partial(
            decode_one, params, config=config, eos_E=eos_E, pad_id=pad_id, sampling=sampling, mesh=mesh,
            window=P + end if sampling.block else 0, prompt=P, samples=samples,
        )  # fmt: skip

        k, n = sampling.eos_every, end - start
        if k == 1:
            state = _checked_loop(one, n, state)
            continue
        if n // k:
            state = _checked_loop(functools.partial(_positions, one, k), n // k, state)
        if n % k:
            state = _checked_loop(functools.partial(_positions, one, n % k), 1, state)
    if sampling.layers == "unrolled":
        state = state.replace(cache=state.cache.replace(
            keys=jnp.concatenate(state.cache.keys, axis=0), values=jnp.concatenate(state.cache.values, axis=0)
        ))  # fmt: skip
    if sampling.eos_every > 1:
        state = state.replace(cache=_clear_next_slot(state.cache))
    return state


def _checked_loop(run: Callable[[DecodeState], DecodeState], trips: int, state: DecodeState) -> DecodeState:
    """`run` up to `trips` times, each only while some sequence is not done: one lax.while_loop whose counter
    counts from 0 to `trips` (the trip count trainer.fit.hlo reads; the test of `done` is its data part)."""

    def cond(c: tuple[Array, DecodeState]) -> Array:
        return (c[0] < trips) & ~jnp.all(c[1].done_B)

    def body(c: tuple[Array, DecodeState]) -> tuple[Array, DecodeState]:
        return c[0] + 1, run(c[1])

    return jax.lax.while_loop(cond, body, (jnp.int32(0), state))[1]


def _positions(one: Callable[[DecodeState], DecodeState], k: int, state: DecodeState) -> DecodeState:
    """`k` decode positions in a row (a fori_loop: one position's body to compile) with no test of `done`
    between them. A position run after every sequence is done records what the state already holds (pad,
    mask 0, log-prob 0 in a column not yet written) and its counters are put back (`_frozen_if_done`), so the
    state is the one the loop would have stopped with, but for the cache slot it wrote (`_clear_next_slot`)."""
    return jax.lax.fori_loop(0, k, lambda _, s: _frozen_if_done(s, one(s)), state)


def _frozen_if_done(before: DecodeState, after: DecodeState) -> DecodeState:
    """`after`, or, when every sequence was done `before` it, `after` with the counters and the RNG of `before`
    (step, positions, cache index: the position then ran in place, writing the one slot `index` points at)."""
    done = jnp.all(before.done_B)

    def keep(old: Array, new: Array) -> Array:
        return jnp.where(done, old, new)

    return after.replace(
        step=keep(before.step, after.step), rng=keep(before.rng, after.rng),
        positions_B=keep(before.positions_B, after.positions_B),
        cache=after.cache.replace(index=keep(before.cache.index, after.cache.index)),
    )  # fmt: skip


def _clear_next_slot(cache: KVCache) -> KVCache:
    """The cache with slot `index` unwritten again (zero keys and values, mask False), as a loop that stopped
    there leaves it: positions run after every sequence was done all wrote that slot. The decode feeds at most
    C - 1 tokens, so index <= S - 1 and the slot is always in the cache."""

    def clear(buf: Array, axis: int) -> Array:
        shape = list(buf.shape)
        shape[axis] = 1
        return jax.lax.dynamic_update_slice_in_dim(buf, jnp.zeros(shape, buf.dtype), cache.index, axis)

    return cache.replace(
        keys=clear(cache.keys, 2), values=clear(cache.values, 2), mask_BS=clear(cache.mask_BS, 1)
    )


def decode_one(
    params: Any, s: DecodeState, *, config: Qwen2Config, eos_E: Array, pad_id: Array, sampling: SamplingConfig,
    mesh: Mesh | None = None, window: int = 0, prompt: int = 0, samples: int = 1,
) -> DecodeState:  # fmt: skip
    """One decode position: feed the last sampled token through the cache, sample and record the next
    (attending over the first `window` cache slots, 0: all; the first `prompt` once per group of `samples`)."""
    cache = kv_cache.mark_written(s.cache)
    last_B1 = jax.lax.dynamic_slice_in_dim(s.tokens_BC, s.step, 1, axis=1)
    if sampling.layers == "unrolled":  # cache.keys / values: one [1, B, S, K, H] buffer per layer
        logits_B1V, caches = unrolled.decode_step_layers(
            params, config, last_B1, s.positions_B[:, None], tuple(zip(cache.keys, cache.values, strict=True)),
            cache.index, cache.mask_BS[:, None, :], window=window, prompt=prompt, samples=samples,
        )  # fmt: skip
        keys, values = tuple(k for k, _ in caches), tuple(v for _, v in caches)
    else:
        logits_B1V, keys, values = qwen2.decode_step(
            params, config, last_B1, s.positions_B[:, None], cache.keys, cache.values,
            cache.index, cache.mask_BS[:, None, :], window=window, prompt=prompt, samples=samples,
        )  # fmt: skip
    rng, key = jax.random.split(s.rng)
    token_B, logprob_B = split.sample(logits_B1V[:, 0], key, sampling, mesh, split.SLICE_BV)
    cache = cache.replace(keys=keys, values=values, index=cache.index + 1)
    s = s.replace(cache=cache, positions_B=s.positions_B + 1, step=s.step + 1, rng=rng)
    return _record(s, token_B, logprob_B, eos_E, pad_id)


def static_args(
    config: Qwen2Config, sampling: SamplingConfig, eos_ids: tuple[int, ...], pad_id: int, mesh: Mesh | None,
    samples: int = 1,
) -> dict[str, Any]:  # fmt: skip
    """The keyword arguments `_prefill` and `_decode` take besides params and data (trainer.fit uses them too);
    `samples`: the rows come in groups of that many copies of one prompt (`generate`)."""
    if not 0 < len(eos_ids) <= _EOS_SLOTS:
        raise ValueError(f"eos_ids must hold 1 to {_EOS_SLOTS} ids, received {eos_ids!r}")
    # eos ids and pad id are traced values, not static, and the eos list is padded (with -1, never a
    # token) to a fixed length: changing them does not recompile.
    eos = list(eos_ids) + [-1] * (_EOS_SLOTS - len(eos_ids))
    return {
        "config": config, "sampling": sampling, "mesh": mesh, "samples": samples,
        "eos_E": jnp.asarray(eos, jnp.int32), "pad_id": jnp.int32(pad_id),
    }  # fmt: skip


def generate(
    params: Any,
    config: Qwen2Config,
    prompt_ids_BP: Array,
    prompt_mask_BP: Array,
    rng: Array,
    sampling: SamplingConfig,
    eos_ids: tuple[int, ...],
    pad_id: int,
    *,
    mesh: Mesh | None = None,
    samples: int = 1,
) -> SampleOutput:
    """Sample up to sampling.max_new_tokens tokens after LEFT-padded prompts [B, P].

    `samples` G: the caller's promise that the rows come in groups of G identical prompts (rows g*G .. g*G + G - 1,
    as `np.repeat(prompts, G, axis=0)` makes them): the prefill then runs each prompt once (`_prefill`); each row
    still draws its own tokens. With `mesh`, both programs are traced with it in context: activations and the KV
    cache are constrained to trainer.sharding's layouts (params and prompts should already be placed on that
    mesh)."""
    prompt_ids_BP = jnp.asarray(prompt_ids_BP, jnp.int32)
    prompt_mask_BP = jnp.asarray(prompt_mask_BP, jnp.int32)
    static = static_args(config, sampling, eos_ids, pad_id, mesh, samples)
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
        state = _prefill(params, prompt_ids_BP, prompt_mask_BP, rng, **static)
        state = _decode(params, state, **static)
    return SampleOutput(
        completion_ids_BC=state.tokens_BC,
        completion_mask_BC=state.mask_BC,
        logprobs_BC=state.logprobs_BC,
        prompt_ids_BP=prompt_ids_BP,
        prompt_mask_BP=prompt_mask_BP,
        steps=state.step + 1,
    )
