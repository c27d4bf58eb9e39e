"""Log parser benchmark: `tpuops report`'s library call on a synthetic 1 GB trainer log, next to `grep -c`.

Run: python bench/bench_logscan.py [--size-mb 1024] [--repeats 3] [--keep PATH]
Writes a log in the trainer's format (docs/contracts.md: step lines, eval windows, checkpoints, JAX compile
logging with cache-miss explanations, warnings) to a temp dir, then reports it in a fresh process per repeat
(wall time and that process's peak RSS) and runs `grep -c step=` over the same file as the floor. Medians.
"""

from __future__ import annotations

import argparse
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAILS = 4096  # distinct random step-line tails, reused round-robin (formatting 6M lines from scratch is slow)
REPORT = """
import json, resource, sys, time
from tpuops.run import scan
from tpuops.run import logreport
t0 = time.perf_counter()
r = scan.scan_target(sys.argv[1], warmup=1)
doc = json.dumps(logreport.as_dict(r, logreport.exit_code(r), None, None), default=str)
print(json.dumps({"wall_s": time.perf_counter() - t0, "steps": r.steps, "lines": r.lines,
                  "recompiles": r.compiles["after_warmup"], "dt_p50": r.dt.p50, "json_bytes": len(doc),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e6}))
"""


def step_tail(rng: random.Random) -> str:
    dt = rng.uniform(0.8, 2.5)
    return (
        f"loss={rng.uniform(-0.5, 0.5):.6f} entropy={rng.uniform(0.5, 2):.4f} reward_mean={rng.random():.4f} "
        f"dt={dt:.2f}s rollout_generate={dt * 0.7:.2f}s update={dt * 0.25:.2f}s "
        f"completion_len_mean={rng.uniform(20, 200):.1f} completion_len_max={rng.randint(64, 512)} "
        f"tokens_per_s={rng.uniform(500, 5000):.1f}"
    )


COMPILE = (
    "Compiling jit({fn}) with global shapes and types (ShapedArray(int32[{shape}]),). Argument mapping: (U,)."
)
HEADER = [
    "start: backend=tpu process_count=4 process_index=0 device_count=32 mesh=dp:1,fsdp:8,tp:4",
    'config: {"model": {"preset": "qwen2.5-1.5b"}, "steps": 10000000, "lr": 1e-06}',
    "batch: prompts_per_step=64 samples_per_prompt=8 sequences_per_step=512 micro_batch_per_device=4",
    "wandb: url=https://wandb.ai/team/grpo/runs/bench123",
    "TRACING CACHE MISS at /repo/trainer/train.py:88:4 (run):",
    "  never seen function:",
    "    train_step id=140549556200096 defined at /repo/trainer/train.py:40",
    COMPILE.format(fn="train_step", shape="512,1024"),
]
EVAL = [
    "eval_begin step={i}",
    COMPILE.format(fn="eval_step", shape="64,1024"),
    "eval step={i} accuracy=0.6123 n=1319 dt=45.20s",
    "eval_end step={i}",
    "checkpoint step={i} path=gs://bucket/ckpt/{i}",
]
NOISE = "W1122 16:52:21.123456 1234 pjit.py:1234] jax: some library warning that trainers print now and then"
RECOMPILE = [
    "TRACING CACHE MISS at /repo/trainer/train.py:88:4 (run):",
    "  for train_step defined at /repo/trainer/train.py:40",
    "  all previously seen cache keys differ. For the closest previous key:",
    "  different input types:",
    "  * at batch, now i32[512,1056] and before i32[512,1024]",
    COMPILE.format(fn="train_step", shape="512,1056"),
]


def write_log(path: Path, size_mb: int) -> tuple[int, int]:
    """The synthetic log: returns (steps, bytes)."""
    rng = random.Random(0)
    tails = [step_tail(rng) for _ in range(TAILS)]
    target, written, i = size_mb << 20, 0, 0
    with path.open("w") as f:
        written += f.write("\n".join(HEADER) + "\n")
        while written < target:
            block = []
            for j in range(i, i + 1000):
                block.append(f"step={j} {tails[j % TAILS]}")
                if j % 500 == 499:
                    block += [e.format(i=j) for e in EVAL]
                if j % 100 == 37:
                    block.append(NOISE)
                if j % 250_000 == 1000:  # a handful of real recompiles after the warm-up
                    block += RECOMPILE
            written += f.write("\n".join(block) + "\n")
            i += 1000
        written += f.write(f'summary: {{"steps": {i}, "dt_p50": 1.6}}\n')
    return i, written


def run_report(path: Path) -> tuple[float, float, dict[str, object]]:
    """(wall s, peak RSS MB, result) of one report in a fresh process (its own ru_maxrss, nothing else)."""
    import json

    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-c", REPORT, str(path)], capture_output=True, text=True, check=True, cwd=REPO
    ).stdout
    wall = time.perf_counter() - t0  # includes the interpreter start-up and imports
    result = json.loads(out)
    return wall, float(result["peak_rss_mb"]), result


def grep_time(path: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["grep", "-c", "step=", str(path)], capture_output=True, check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mb", type=int, default=1024)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="write the log here and keep it")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = args.keep or Path(tmp) / "train.log"  # not worker-<k>.log: no exit file is looked for
        t0 = time.perf_counter()
        steps, size = write_log(path, args.size_mb)
        print(
            f"log: {size / 2**20:.0f} MiB, {steps} steps, written in {time.perf_counter() - t0:.1f}s ({path})"
        )
        grep_time(path)  # both read from the page cache from here on
        walls, rsss, greps = [], [], []
        for _ in range(args.repeats):
            wall, rss, result = run_report(path)
            walls.append(wall)
            rsss.append(rss)
            greps.append(grep_time(path))
        print(f"report result: {result}")
        base = run_report_baseline()
        w, g = statistics.median(walls), statistics.median(greps)
        print(f"{'':28}{'median':>10}{'runs':>40}")
        print(f"{'tpuops report (wall s)':28}{w:10.2f}{[round(x, 2) for x in walls]!s:>40}")
        print(f"{'grep -c step= (wall s)':28}{g:10.2f}{[round(x, 2) for x in greps]!s:>40}")
        print(f"{'ratio report / grep':28}{w / g:10.1f}")
        print(f"{'throughput (MiB/s)':28}{size / 2**20 / w:10.0f}")
        print(
            f"{'peak RSS of the report (MB)':28}{max(rsss):10.0f}   (python + imports alone: {base:.0f} MB)"
        )
        print(
            f"acceptance: <= 15 s {'PASS' if w <= 15 else 'FAIL'}, "
            f"<= 150 MB {'PASS' if max(rsss) <= 150 else 'FAIL'}"
        )


def run_report_baseline() -> float:
    """Peak RSS of a process that only imports what the report imports: the floor under the figure above."""
    code = "import resource; from tpuops.run import logreport, scan; print(resource.getrusage(0).ru_maxrss)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return int(out.stdout) * 1024 / 1e6


if __name__ == "__main__":
    main()
