"""This trainer against a peer: the same GRPO workload through google-tunix's GRPOLearner (its vanilla rollout)
and through trainer.train, on CPU, in one run: step time and generated tokens/s, side by side, as ratios.

Run (repository root): `python bench/bench_peers.py` (setup once: `python bench/bench_peers.py --setup`
makes tunix's own venv, /tmp/tunix-venv: Python 3.11, google-tunix==0.1.7 with jax 0.10.2; it pins
safetensors<0.8, so it never shares the project's environment). The workload, the same for both: the `tiny`
Qwen2 shapes (2 layers, hidden 64, MLP 128, 4 query / 2 kv heads, tied 151,936-row embedding, float32,
weights normal(0.1)), the real Qwen2.5 tokenizer and chat template, GSM8K prompts from tests/fixtures/data
(each step's drawn by the trainer's own prompt stream; tunix gets the same texts), prompt bucket 256, G
samples per prompt, C new tokens at temperature 1, one update per step over the whole batch (no micro-batches,
no reference model, AdamW at 1e-4). Rewards differ (the trainer's GSM8K ones; a cheap length reward for tunix:
both are host work of a few ms). Step times are medians after the compile steps (see each side's clock:
trainer.metrics' `dt`; bench/peers_tunix.py's reward-call intervals).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FIXTURES = ROOT / "tests" / "fixtures" / "data"
TUNIX_VENV = Path("/tmp/tunix-venv")
TUNIX_PINS = ["google-tunix==0.1.7", "jax==0.10.2", "jaxlib==0.10.2"]


def setup(venv: Path) -> None:
    """tunix's own venv (seeing the system's packages, with its pins installed inside it)."""
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *TUNIX_PINS], check=True)


def trainer_config(w: Mapping[str, Any], out: str) -> Any:
    from trainer import config

    sets = [
        "model.path=tiny", f"model.preset={w['preset']}", "model.tokenizer=qwen2.5", f"model.dtype={w['dtype']}",
        "data.task=gsm8k", f"data.root={FIXTURES}", f"data.prompt_buckets={w['prompt_len']}",
        "data.fixed_bucket=true", f"rollout.samples_per_prompt={w['samples']}",
        f"rollout.max_new_tokens={w['new_tokens']}", f"rollout.temperature={w['temperature']}",
        f"train.prompts_per_step={w['prompts']}", f"train.micro_batch={w['micro_batch'] or w['prompts'] * w['samples']}",
        f"train.steps={w['steps']}", f"train.learning_rate={w['learning_rate']}", "train.warmup_steps=0",
        "loss.beta=0", "log.wandb=disabled", f"log.output_dir={out}", "eval.every=0",
    ]  # fmt: skip
    return config.load("tiny", sets)


def step_prompts(cfg: Any) -> list[list[str]]:
    """Each step's chat-templated prompts, drawn as trainer.loop.rollout draws them (same stream, same seed)."""
    from trainer import data, tasks
    from trainer.loop.rollout import draw_prompts
    from trainer.tokenizer import chat_text, load_tokenizer

    tok = load_tokenizer(FIXTURES / "qwen2.5-tokenizer")
    task = tasks.get(cfg.data.task)
    run = SimpleNamespace(cfg=cfg, tokenizer=tok, task=task)
    stream = data.PromptStream(task.examples(cfg), cfg.train.seed)
    steps = []
    for _ in range(cfg.train.steps):
        steps.append(
            [
                chat_text(tok, task.messages(ex))
                for ex in draw_prompts(run, stream, cfg.train.prompts_per_step)
            ]
        )
    return steps


def run_trainer(cfg: Any) -> dict[str, Any]:
    from trainer import metrics, train

    class Keep(metrics.Emitter):
        def __init__(self) -> None:
            super().__init__(0)
            self.rows: list[dict[str, Any]] = []

        def line(self, text: str, *, all_processes: bool = False) -> None:  # quiet: this bench reads the rows
            pass

        def step(self, step: int, values: Mapping[str, Any]) -> None:
            self.rows.append(dict(values))

    keep = Keep()
    t0 = time.perf_counter()
    train.run(cfg, emit=keep)
    wall = time.perf_counter() - t0
    timed = keep.rows[1:]
    n = cfg.sequences_per_step
    return {
        "run_s": wall,  # model made, tokenizer loaded, every step with its compiles
        "first_step_s": keep.rows[0]["dt"],
        "step_intervals_s": [r["dt"] for r in keep.rows],
        "step_s": statistics.median(r["dt"] for r in timed),
        "rollout_s": statistics.median(r["rollout_generate"] for r in timed),
        "update_s": statistics.median(r["update"] for r in timed),
        "generated_tokens_per_step": statistics.median(r["completion_len_mean"] * n for r in timed),
    }


def run_tunix(python: Path, spec: dict[str, Any], platform: str) -> dict[str, Any]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(spec, f)
    env = {**os.environ, "JAX_PLATFORMS": platform, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.run(
        [str(python), str(Path(__file__).with_name("peers_tunix.py")), f.name],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    Path(f.name).unlink()
    for line in proc.stdout.splitlines():
        if line.startswith("peers_tunix: "):
            return json.loads(line.removeprefix("peers_tunix: "))
    tail = [x for x in (proc.stderr or proc.stdout).strip().splitlines() if not x.lstrip().startswith("@")][
        -25:
    ]
    lines = "\n".join(tail)
    raise SystemExit(f"bench_peers: the tunix run gave no result (exit {proc.returncode}):\n{lines}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--setup", action="store_true", help=f"make tunix's venv ({TUNIX_VENV}) and stop")
    ap.add_argument("--tunix-python", type=Path, default=TUNIX_VENV / "bin" / "python")
    ap.add_argument("--preset", default="tiny", help="model shapes (trainer.model.config presets)")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="compute dtype")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt-len", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument(
        "--micro-batch",
        type=int,
        default=0,
        help="sequences per gradient-accumulation micro-batch, both sides (0: the whole batch)",
    )
    ap.add_argument("--steps", type=int, default=5, help="per run; the first (compiles) is not timed")
    ap.add_argument("--rounds", type=int, default=2, help="runs of each side, in ABBA order")
    ap.add_argument("--platform", default="cpu", help="JAX_PLATFORMS for both sides ('' = JAX's choice)")
    ap.add_argument(
        "--only", choices=["trainer", "tunix"], help="run one side (no ratio): e.g. one at a time on a GPU"
    )
    ap.add_argument("--json", type=Path, help="also write the result here")
    args = ap.parse_args(argv)
    if args.setup:
        setup(args.tunix_python.parents[1])
        return 0
    if not args.tunix_python.exists() and "/" in str(args.tunix_python):
        print(f"bench_peers: no tunix python at {args.tunix_python}; run `python bench/bench_peers.py --setup` "
              "first (or pass --tunix-python)", file=sys.stderr)  # fmt: skip
        return 2
    if args.platform:
        os.environ["JAX_PLATFORMS"] = args.platform
    import jax

    from trainer.model.config import preset

    w = {"prompts": args.prompts, "samples": args.samples, "prompt_len": args.prompt_len,
         "new_tokens": args.new_tokens, "micro_batch": args.micro_batch, "steps": args.steps, "temperature": 1.0,
         "learning_rate": 1e-4,
         "preset": args.preset, "dtype": args.dtype}  # fmt: skip
    device = jax.devices()[0].device_kind
    rounds: list[dict[str, dict[str, Any]]] = []
    with tempfile.TemporaryDirectory(prefix="bench-peers-") as out:
        cfg = trainer_config(w, out)
        m = preset(cfg.model.preset)
        shapes = ("num_hidden_layers", "vocab_size", "hidden_size", "intermediate_size", "num_attention_heads",
                  "num_key_value_heads", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "initializer_range")  # fmt: skip
        spec = {
            "model": {**{k: getattr(m, k) for k in shapes}, "head_dim": m.head_dim, "dtype": cfg.model.dtype},
            "workload": w, "prompts_per_step": step_prompts(cfg), "eos_ids": [151643, 151645],
            "tokenizer": str(FIXTURES / "qwen2.5-tokenizer"),
        }  # fmt: skip
        print(f"bench_peers: {w} on {device}, {args.rounds} round(s) of each side", flush=True)
        for i in range(
            args.rounds
        ):  # ABBA: the order alternates, so a drift in the machine's load falls on both
            got: dict[str, dict[str, Any]] = {}
            for side in ("trainer", "tunix") if i % 2 == 0 else ("tunix", "trainer"):
                if args.only and side != args.only:
                    continue
                got[side] = (
                    run_trainer(cfg)
                    if side == "trainer"
                    else run_tunix(args.tunix_python, spec, args.platform)
                )
                print(f"bench_peers: round {i + 1} {side}: step {got[side]['step_s']:.3f} s", flush=True)
            rounds.append(got)
    if args.only:
        result = {"workload": w, "device": device, "only": args.only, "rounds": rounds}
        print(json.dumps(result))
    else:
        result = summarize(w, device, rounds)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


def summarize(w: dict[str, Any], device: str, rounds: list[dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """Print each round's two rows and the ratios; the medians over rounds go into the result."""
    n = w["prompts"] * w["samples"]
    print(f"{'round':<7}{'':<44}{'step s':>9}{'gen tok/s':>11}{'run s':>8}")
    ratios, tok_ratios = [], []
    for i, got in enumerate(rounds):
        tok_s = {}
        names = {
            "trainer": "this trainer",
            "tunix": f"tunix {got['tunix']['tunix']} GRPOLearner, vanilla rollout",
        }
        for side, name in names.items():
            r = got[side]
            tok_s[side] = (r["generated_tokens_per_step"] or n * w["new_tokens"]) / r["step_s"]
            print(f"{i + 1:<7}{name:<44}{r['step_s']:>9.3f}{tok_s[side]:>11.1f}{r['run_s']:>8.1f}")
        ratios.append(got["tunix"]["step_s"] / got["trainer"]["step_s"])
        tok_ratios.append(tok_s["trainer"] / tok_s["tunix"])
    step_ratio, tok_ratio = statistics.median(ratios), statistics.median(tok_ratios)
    print(f"tunix / trainer step time: {', '.join(f'{x:.2f}x' for x in ratios)} (median {step_ratio:.2f}x); "
          f"trainer / tunix generated tokens/s: {', '.join(f'{x:.2f}x' for x in tok_ratios)} "
          f"(median {tok_ratio:.2f}x)")  # fmt: skip
    return {"workload": w, "device": device, "rounds": rounds, "step_ratio_tunix_over_trainer": step_ratio,
            "tokens_per_s_ratio_trainer_over_tunix": tok_ratio}  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
