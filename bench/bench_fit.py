"""Every shipped TPU preset compiled for its TPU (tpuops fit): per-phase per-device peak, headroom, FLOPs,
HBM bytes, collectives, roofline seconds and compile seconds as the markdown tables of docs/performance.md.

    python bench/bench_fit.py                        # every trainer/configs/qwen2.5-*.yaml, full depth
    python bench/bench_fit.py qwen2.5-3b-v6e-8 --set rollout.tp=1   # one preset, an alternative layout
    python bench/bench_fit.py --json-dir /tmp/fits  # and each preset's whole `--json` document
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GB = 1e9


def fit(preset: str, sets: list[str], phases: str | None = None) -> dict:
    argv = [sys.executable, "-m", "trainer.fit", "--config", preset, "--json", "--no-fix"]
    argv += ["--phases", phases] if phases else []
    r = subprocess.run(
        argv + [f"--set={s}" for s in sets], capture_output=True, text=True, cwd=REPO, check=False
    )
    if r.returncode not in (0, 3):
        raise SystemExit(f"{preset}: exit {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
    return json.loads(r.stdout)


def table(r: dict) -> str:
    head = (
        f"**{r['config']}** on {r['accelerator']} ({r['topology']}, {r['devices']} devices, "
        f"{r['hbm_bytes_per_device'] / GB:.1f} GB HBM each; loss `{r['impl']}`, update mesh {r['mesh']}, "
        f"decode mesh {r['rollout_mesh']}, micro-batch {r['micro_batch']} x {r['accumulation']}, "
        f"remat {r['remat']}): **{'fits' if r['fits'] else 'does not fit'}**, tightest "
        f"{r['tightest_phase']} at {r['headroom']:.0%} headroom; estimate **{r['estimate']['step_s']:.2f} s/step**"
    )
    rows = ["| phase | peak GB | headroom | TFLOP / run | HBM GB / run | compile s | all-gather GB | "
            "reduce-scatter GB | all-reduce GB | s / step | largest term |", "|" + " --- |" * 11]  # fmt: skip
    for name, p in r["phases"].items():
        c = p["collective_bytes"]
        rows.append(
            f"| {name} | {p['peak_bytes'] / GB:.2f} | {p['headroom']:.0%} | {p['flops'] / 1e12:.2f} | "
            f"{p['hbm_bytes'] / GB:.2f} | {p['compile_s']:.0f} | {c['all-gather'] / GB:.2f} | "
            f"{c['reduce-scatter'] / GB:.2f} | "
            f"{c['all-reduce'] / GB:.2f} | {p['seconds']:.3f} | {p['largest_term']} |"
        )
    return "\n".join([head, "", *rows])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("presets", nargs="*")
    ap.add_argument("--set", action="append", default=[])
    ap.add_argument("--phases", help="only these phases, e.g. decode_cast,prefill,decode")
    ap.add_argument(
        "--json-dir", type=Path, help="also write each preset's `tpuops fit --json` document here"
    )
    args = ap.parse_args()
    presets = args.presets or sorted(p.stem for p in (REPO / "trainer" / "configs").glob("qwen2.5-*.yaml"))
    with ThreadPoolExecutor(max_workers=2) as pool:  # XLA compiles on one core: two presets at a time
        for result in pool.map(lambda p: fit(p, args.set, args.phases), presets):
            if args.json_dir:
                args.json_dir.mkdir(parents=True, exist_ok=True)
                (args.json_dir / f"{result['config']}.json").write_text(json.dumps(result, indent=1))
            print(table(result), end="\n\n", flush=True)


if __name__ == "__main__":
    main()
