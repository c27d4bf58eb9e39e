"""`python -m trainer.fit --config NAME [--set k=v] [--accelerator v6e-8 | --topology v6e:2x4] [--json]`."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_FITS, EXIT_CONFIG, EXIT_NO_FIT, EXIT_NO_LIBTPU = 0, 2, 3, 4


def _quiet_libtpu(accelerator: str) -> None:
    """Compile for a TPU on a CPU machine: no TPU runtime (so no /tmp/libtpu_lockfile), beside other JAX
    processes, without libtpu's warnings about the host it cannot find."""
    os.environ["JAX_PLATFORMS"] = "cpu"
    os.environ["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    os.environ["TPU_SKIP_MDS_QUERY"] = "1"
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def _libtpu_missing() -> str | None:
    import importlib.metadata
    import importlib.util

    try:
        if importlib.util.find_spec("libtpu") is not None:
            return None
    except ImportError:
        pass
    version = importlib.metadata.version("jax")
    return f"libtpu is not installed: pip install 'jax[tpu]=={version}' (or the project's tpu extra)"


def fix_candidates(cfg: Any, batch_devices: int) -> list[list[str]]:
    """Overrides to try when the update does not fit, cheapest first: more remat, then smaller micro-batches."""
    from trainer.loop.remat import ORDER  # (jax: imported only once libtpu's settings are made)

    remats = list(ORDER)
    stronger = remats[remats.index(cfg.train.remat) + 1 :]
    out = [[f"train.remat={r}"] for r in stronger]
    mb = cfg.train.micro_batch // 2
    while mb >= batch_devices and mb % batch_devices == 0 and cfg.sequences_per_step % mb == 0:
        out.append([f"train.micro_batch={mb}"])
        if cfg.train.remat != "full":
            out.append([f"train.micro_batch={mb}", "train.remat=full"])
        mb //= 2
    return out


def search_fix(
    cfg: Any, tgt: Any, slices: int, batch_devices: int
) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The first of `fix_candidates` whose update fits, and the candidates skipped on the way.

    Each candidate compiles in a child process (`python -m trainer.fit --phases ref_logp,update --no-fix
    --no-host` on the resolved config): libtpu's compiler can crash (seen: SIGSEGV on the tiny model's
    `train.remat=dots` at 96 sequences of 2048 tokens on v5e-1), and a crash in one speculative candidate must
    neither lose the verdict already made nor end the search. Its progress lines (stderr) pass through.
    Returns ({"set", "peak_bytes"} or None, [{"set", "why"}] for each candidate that crashed or failed)."""
    from trainer import config
    from trainer.fit import programs

    skipped: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="trainer-fit-") as folder:
        path = Path(folder) / "config.yaml"
        path.write_text(config.dumps(cfg))  # JSON is YAML: the resolved config, its overrides included
        for extra in fix_candidates(cfg, batch_devices):
            argv = [sys.executable, "-m", "trainer.fit", "--config", str(path), *(f"--set={s}" for s in extra),
                    "--topology", tgt.topology, "--slices", str(slices), "--phases", ",".join(programs.UPDATE),
                    "--no-fix", "--no-host", "--json"]  # fmt: skip
            print(f"fit: trying {' '.join(extra)}", file=sys.stderr, flush=True)
            r = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True, check=False)
            last = r.stdout.strip().splitlines()[-1] if r.stdout.strip() else ""
            if r.returncode < 0:
                skipped.append({"set": extra, "why": f"the TPU compiler crashed (signal {-r.returncode})"})
            elif r.returncode not in (EXIT_FITS, EXIT_NO_FIT) or not last.startswith("{"):
                skipped.append({"set": extra, "why": f"exit {r.returncode}"})
            elif (tried := json.loads(last))["fits"]:
                peak = max(p["peak_bytes"] for p in tried["phases"].values())
                return {"set": extra, "peak_bytes": peak}, skipped
    return None, skipped


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m trainer.fit", description=__doc__)
    ap.add_argument("--config", required=True, help="preset name or YAML path")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    target = ap.add_mutually_exclusive_group()
    target.add_argument(
        "--accelerator", help="TPU accelerator type, e.g. v6e-8 (default: the config's mesh.accelerator)"
    )
    target.add_argument("--topology", help="JAX topology, e.g. v6e:2x4")
    ap.add_argument(
        "--slices", type=int, default=1, metavar="N",
        help="compile for N slices of the target joined over DCN (a multislice); default 1",
    )  # fmt: skip
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout")
    ap.add_argument("--no-fix", action="store_true", help="do not search for overrides that would fit")
    ap.add_argument(
        "--phases", help="compile only these phases, e.g. decode_cast,prefill,decode (default: all)"
    )
    ap.add_argument(
        "--no-host", action="store_true", help="do not time the host's work of a step (trainer.fit.host)"
    )
    ap.add_argument(
        "--breakdown", type=int, default=0, metavar="N",
        help="per phase, the N sources of the most HBM bytes (e.g. --phases decode --breakdown 12)",
    )  # fmt: skip
    ap.add_argument(
        "--layouts", action="store_true",
        help="compare the decode layouts: the rollout programs at every rollout.tp that splits a slice's devices "
        "and the query heads evenly, fastest expected step first (the update does not depend on it)",
    )  # fmt: skip
    args = ap.parse_args(argv)

    from trainer import config
    from trainer.fit import tpus

    try:
        cfg = config.load(args.config, args.set)
        spec = args.topology or args.accelerator or cfg.mesh.accelerator
        if not spec:
            raise config.ConfigError("no target TPU: pass --accelerator (e.g. v6e-8) or set mesh.accelerator")
        tgt = tpus.from_topology(spec) if ":" in spec else tpus.from_accelerator(spec)
        if args.slices < 1:
            raise config.ConfigError(f"--slices must be 1 or more, received {args.slices}")
        if cfg.train.attention_impl == "cudnn":  # a TPU compile: refused here, not by a traceback mid-compile
            from trainer.model.flash import CUDNN_ON_TPU

            raise config.ConfigError(CUDNN_ON_TPU)
        if cfg.rollout.attention_impl == "pallas":  # the decode's GPU kernel: refused for a TPU the same way
            from trainer.sampling.sampler import PALLAS_DECODE_ON_TPU

            raise config.ConfigError(PALLAS_DECODE_ON_TPU)
    except (config.ConfigError, tpus.UnknownAcceleratorError) as e:
        print(f"config: {e}", file=sys.stderr)
        return EXIT_CONFIG
    if (missing := _libtpu_missing()) is not None:
        print(json.dumps({"error": "libtpu_missing", "message": missing}) if args.json else missing)
        return EXIT_NO_LIBTPU
    _quiet_libtpu(tgt.accelerator)
    try:
        if args.layouts:
            result = compare_layouts(cfg, tgt, args.set, slices=args.slices)
        else:
            only = tuple(args.phases.split(",")) if args.phases else None
            result = run(
                cfg,
                tgt,
                args.set,
                fix=not args.no_fix,
                only=only,
                breakdown=args.breakdown,
                host=not args.no_host,
                slices=args.slices,
            )
    except config.ConfigError as e:
        print(f"config: {e}", file=sys.stderr)
        return EXIT_CONFIG
    result["config"] = args.config
    if args.json:
        print(json.dumps(result, default=float))
    else:
        from trainer.fit.text import render, render_layouts

        print(render_layouts(result) if args.layouts else render(result))
    fits = result["best"] is not None if args.layouts else result["fits"]
    return EXIT_FITS if fits else EXIT_NO_FIT


def topology_devices(topology: str, slices: int = 1) -> list[Any]:
    """The devices of a JAX TPU topology (`slices` of it: each device's `slice_index` says which); slices smaller
    than one host's 2x2 chips say so to libtpu."""
    from jax.experimental import topologies

    shape = [int(d) for d in topology.split(":")[1].split("x")]
    kwargs: dict[str, Any] = {"num_slices": slices} if slices > 1 else {}
    if len(shape) == 2 and shape[0] * shape[1] < 4:
        kwargs["chips_per_host_bounds"] = (*shape, 1)
    return list(topologies.get_topology_desc(platform="tpu", topology_name=topology, **kwargs).devices)


def dcn_verdict(result: dict[str, Any], devices: list[Any], slices: int) -> dict[str, Any]:
    """What one step sends between slices: bytes per device and per host (the phases' megascale transfers), their
    time at tpus.DCN_BYTES_PER_S_PER_HOST, and whether that time exceeds the rest of the step's bound."""
    from trainer.fit import tpus

    first = [d for d in devices if getattr(d, "slice_index", 0) == 0]
    per_host = len([d for d in first if d.process_index == first[0].process_index])
    per_device = sum(p.get("dcn_bytes", 0) for p in result["phases"].values())
    seconds = per_device * per_host / tpus.DCN_BYTES_PER_S_PER_HOST
    bound = result["estimate"]["bound_s"]
    return {
        "slices": slices, "bytes_per_device": per_device, "bytes_per_host": per_device * per_host,
        "devices_per_host": per_host, "bandwidth_per_host": tpus.DCN_BYTES_PER_S_PER_HOST, "seconds": seconds,
        "step_bound_s": bound, "dominates": seconds > bound,
        "phases": {k: p.get("dcn_bytes", 0) for k, p in result["phases"].items() if p.get("dcn_bytes")},
    }  # fmt: skip


def compare_layouts(cfg: Any, tgt: Any, sets: list[str], *, slices: int = 1) -> dict[str, Any]:
    """The rollout programs (decode_cast, prefill, decode) compiled and judged at every `rollout.tp` that divides a
    slice's devices and the query heads: one row per layout (its mesh, fits, headroom, bound and expected range,
    each phase's bound), fitting layouts by expected midpoint first (the bound breaks ties), `best` the first
    one's tp (None when none fits) and `current` the config's own (rollout.tp, or the automatic choice)."""
    from trainer import config
    from trainer.fit import programs
    from trainer.layout import rollout_tp

    per_slice = len(topology_devices(tgt.topology))
    model = programs.model_config(cfg)
    rows = []
    for tp in [
        d for d in range(1, per_slice + 1) if per_slice % d == 0 and model.num_attention_heads % d == 0
    ]:
        print(f"fit: decode layout rollout.tp={tp}", file=sys.stderr, flush=True)
        r = run(config.with_sets(cfg, [f"rollout.tp={tp}"]), tgt, [*sets, f"rollout.tp={tp}"], fix=False,
                only=programs.ROLLOUT, host=False, slices=slices)  # fmt: skip
        e = r["estimate"]
        rows.append({
            "tp": tp, "rollout_mesh": r["rollout_mesh"], "fits": r["fits"], "headroom": r["headroom"],
            "bound_s": e["bound_s"], "expected_s": e["expected_s"], "expected_mid_s": e["expected_mid_s"],
            "phases_s": e["phases_s"],
        })  # fmt: skip
    rows.sort(key=lambda row: (not row["fits"], row["expected_mid_s"], row["bound_s"]))
    return {
        "accelerator": tgt.accelerator, "topology": tgt.topology, "slices": slices, "phases": list(programs.ROLLOUT),
        "current": rollout_tp(cfg.rollout.tp, model.num_key_value_heads, per_slice),
        "best": rows[0]["tp"] if rows and rows[0]["fits"] else None, "layouts": rows,
    }  # fmt: skip


def run(
    cfg: Any,
    tgt: Any,
    sets: list[str],
    *,
    fix: bool = True,
    only: tuple[str, ...] | None = None,
    breakdown: int = 0,
    host: bool = True,
    slices: int = 1,
) -> dict[str, Any]:
    """Compile and judge every phase at the model's depth (the layer scan compiles one layer body, so depth
    costs no compile time); when only the update does not fit, the first override list that does
    (`fix_candidates`, each compiled in its own process: `search_fix`). With `host`, the host's work of a step
    is timed here (trainer.fit.host) and added. With `train.remat: auto` the update is compiled per remat candidate
    until one fits (trainer.fit.remat); the result's `remat` is the policy chosen and `remat_auto` says why."""
    from trainer.fit import analyze, estimate, programs
    from trainer.fit import host as host_work
    from trainer.fit import remat as fit_remat
    from trainer.kernels.logprob.blocks import compile_target

    devices = list(topology_devices(tgt.topology, slices))
    per_device = tgt.per_device(len(devices) // slices)  # the chips' figures are per slice
    geo = estimate.Geometry(tuple(tuple(d.coords) for d in devices), tgt.chip.wrap_from)
    layers = programs.model_config(cfg).num_hidden_layers

    host_result = host_work.measure(cfg) if host else None
    phases = only or programs.ROLLOUT + programs.UPDATE
    auto: dict[str, Any] | None = None
    with compile_target(f"tpu {devices[0].device_kind}"):
        if (
            cfg.train.remat == "auto" and "update" in phases
        ):  # the update compiled per candidate, the winner kept
            cfg, update_raw, auto = fit_remat.resolve(cfg, devices, per_device, geo, breakdown)
            phases = tuple(p for p in phases if p != "update")
        progs, facts = programs.step_programs(cfg, devices, phases)
        raw = analyze.measure_all(progs, len(devices), breakdown, per_device, geo)
        if auto is not None:
            raw["update"] = update_raw
            facts["remat_auto"] = auto
    result = analyze.judge(raw, per_device, host_result["seconds"] if host_result else 0.0)
    failed = [k for k, p in result["phases"].items() if not p["fits"]]
    result["fix"] = None
    if fix and failed and all(k in programs.UPDATE for k in failed):
        result["fix"], skipped = search_fix(cfg, tgt, slices, facts["batch_devices"])
        if skipped:
            result["fix_skipped"] = skipped
    if slices > 1:
        result["dcn"] = dcn_verdict(result, devices, slices)
    return {
        "accelerator": tgt.accelerator, "topology": tgt.topology, "devices": len(devices), "slices": slices,
        "device_kind": devices[0].device_kind, "hbm_bytes_per_device": per_device["hbm_bytes"],
        "usable_bytes_per_device": (1 - analyze.HEADROOM) * per_device["hbm_bytes"], "per_device": per_device,
        "sets": sets, "layers": layers, "method": "compiled", "host": host_result, "steps": cfg.train.steps,
        **facts, **result,
    }  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
