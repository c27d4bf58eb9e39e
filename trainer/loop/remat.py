"""`train.remat: auto`: the remat policy that keeps the most activations and still leaves 10% of the device's memory
free, chosen from the update's compiled memory (`pick`, a pure function; `AutoUpdate` compiles the candidates).

Candidates, most activations kept (least recomputed) first: none, dots (matmul outputs kept), mlp_up (the MLP's up
projection kept), full (each layer's input kept, everything else recomputed in the backward pass). The first whose
compiled peak (arguments + outputs - donated + temporaries + what stays resident beside the update) is at most 90% of
the device's memory wins; when none does, full (the least memory). A device whose memory limit JAX does not report
(the CPU) gets `none` without a compile: nothing bounds it, and none recomputes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import jax

from trainer import config
from trainer.config import Config
from trainer.layout import OnMesh
from trainer.loop.programs import make_update

ORDER = ("none", "dots", "mlp_up", "full")  # the most activations kept first
HEADROOM = 0.10  # the share of the device's memory left free (trainer.fit.analyze.HEADROOM)
UNBOUNDED = "none"  # the choice where the device reports no memory limit (CPU)
GB = 1e9


@dataclass(frozen=True)
class RematChoice:
    """The policy `auto` resolved to, why, and each compiled candidate's peak bytes (None: did not compile, too
    big for the device)."""

    policy: str
    why: str
    peaks: dict[str, int | None] = field(default_factory=dict)


def pick(
    peaks: Mapping[str, int | None], device_bytes: int | None, headroom: float = HEADROOM
) -> RematChoice | None:
    """The first policy of ORDER whose peak fits in (1 - headroom) x device_bytes, from the candidates compiled so far
    (keys of `peaks`, in ORDER); None while no compiled one fits and a candidate is left to compile (the caller
    compiles the next of ORDER and asks again). Without a known device memory: UNBOUNDED, nothing compiled."""
    if device_bytes is None:
        return RematChoice(
            UNBOUNDED, f"no memory limit known on this device: {UNBOUNDED} (nothing recomputed)"
        )
    usable = (1 - headroom) * device_bytes
    seen = dict(peaks)
    for policy in ORDER:
        if policy not in seen:
            return None
        peak = seen[policy]
        if peak is not None and peak <= usable:
            before = [f"{p} {_gb(seen[p])}" for p in ORDER[: ORDER.index(policy)]]
            over = f"; {', '.join(before)} over it" if before else ""
            return RematChoice(
                policy,
                f"{policy}: peak {peak / GB:.2f} GB fits in {usable / GB:.2f} GB "
                f"({1 - headroom:.0%} of {device_bytes / GB:.2f} GB){over}",
                seen,
            )
    every = ", ".join(f"{p} {_gb(seen[p])}" for p in ORDER)
    return RematChoice(
        "full", f"full: no policy fits in {usable / GB:.2f} GB ({every}); full needs the least", seen
    )


def _gb(peak: int | None) -> str:
    return "over the device at compile" if peak is None else f"{peak / GB:.2f} GB"


def device_bytes(tree: object) -> int:
    """Bytes one device holds of a pytree of sharded arrays (the first device's shards; 0 for None)."""
    total = 0
    for x in jax.tree_util.tree_leaves(tree):
        shards = getattr(x, "addressable_shards", None)
        total += int(shards[0].data.nbytes) if shards else int(getattr(x, "nbytes", 0))
    return total


def device_memory(device: jax.Device) -> int | None:
    """The bytes JAX may use on `device` (`memory_stats()["bytes_limit"]`), None where it reports none (CPU)."""
    try:
        stats = device.memory_stats()
    except Exception:  # a backend without memory statistics
        return None
    limit = stats.get("bytes_limit") if stats else None
    return int(limit) if limit else None


class AutoUpdate:
    """The update of `train.remat: auto`: at its first call, the update lowered with that call's arguments and
    compiled per candidate (ORDER, stopping at the first that fits: `pick`); the winner's compiled executable runs
    this call and every later one (no second compile). `device_bytes` defaults to the first device's limit; with
    none known, the plain jitted update at UNBOUNDED, compiled by jit as usual."""

    def __init__(
        self,
        cfg: Config,
        mconf: object,
        P_len: int,
        impl: str,
        like: tuple[object, object],
        *,
        resident_bytes: int = 0,
        device_bytes: int | None = None,
        say: Callable[[str], None] = print,
    ) -> None:
        # Shapes and shardings only: the arrays themselves are donated to the update.
        like = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), like
        )
        self.cfg, self.mconf, self.P_len, self.impl, self.like = cfg, mconf, P_len, impl, like
        self.resident_bytes, self.say = resident_bytes, say
        self.mesh = jax.tree_util.tree_leaves(like)[0].sharding.mesh
        self.device_bytes = (
            device_bytes if device_bytes is not None else device_memory(self.mesh.devices.flat[0])
        )
        self.choice: RematChoice | None = None
        self.executable: jax.stages.Compiled | None = None  # the winner's, once resolved (None: left to jit)
        self._run: Callable[..., object] | None = None

    def _program(self, policy: str) -> OnMesh:
        cfg = config.with_sets(self.cfg, [f"train.remat={policy}"])
        return make_update(cfg, self.mconf, self.P_len, self.impl, self.like)

    def resolve(self, *args: object) -> RematChoice:
        """Compile the candidates for `args` (the update's arguments) and keep the winner's executable."""
        peaks: dict[str, int | None] = {}
        compiled: dict[str, jax.stages.Compiled] = {}
        while (choice := pick(peaks, self.device_bytes)) is None:
            policy = ORDER[len(peaks)]
            program = self._program(policy)
            try:
                exe = program.lower(*args).compile()
            except Exception as e:  # XLA refuses a program whose buffers exceed the device: a verdict too
                if "RESOURCE_EXHAUSTED" not in str(e):
                    raise
                peaks[policy] = None
                continue
            mem = exe.memory_analysis()
            peaks[policy] = int(
                mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes
                + mem.temp_size_in_bytes + self.resident_bytes
            )  # fmt: skip
            compiled[policy] = exe
        self.executable = compiled.get(choice.policy)
        self._run = OnMesh(self.executable, self.mesh) if self.executable else self._program(choice.policy)
        self.choice = choice
        self.say(f"remat auto: {choice.why}")
        return choice

    def __call__(self, *args: object) -> object:
        if self._run is None:
            self.resolve(*args)
        assert self._run is not None
        return self._run(*args)


def update_program(
    cfg: Config,
    mconf: object,
    P_len: int,
    impl: str,
    like: tuple[object, object],
    *,
    resident_bytes: int = 0,
    say: Callable[[str], None] = print,
) -> Callable[..., object]:
    """The step's update: `make_update` at train.remat, or with `auto` an AutoUpdate."""
    if cfg.train.remat != "auto":
        return make_update(cfg, mconf, P_len, impl, like)
    return AutoUpdate(cfg, mconf, P_len, impl, like, resident_bytes=resident_bytes, say=say)
