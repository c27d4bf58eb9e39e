"""`python -m trainer.gradcheck` and `python -m trainer.microbench`: exit codes and the metrics line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from trainer import gradcheck, kernels, microbench
from trainer.kernels.logprob import chunked

REPO = Path(__file__).resolve().parents[3]
# Nothing leaves the machine (as in tests/trainer/test_wandb.py): loopback URLs, no system stats (whose CoreWeave
# probe would ask a link-local address), no error reports.
LOCAL_ONLY_WANDB = {
    "WANDB_BASE_URL": "http://127.0.0.1:1",
    "WANDB__STATS_COREWEAVE_METADATA_BASE_URL": "http://127.0.0.1:1",
    "WANDB_X_DISABLE_STATS": "true",
    "WANDB_ERROR_REPORTING": "false",
}


def metrics(text: str) -> dict:
    lines = [ln for ln in text.splitlines() if ln.startswith("metrics: ")]
    assert len(lines) == 1, text
    return json.loads(lines[0].removeprefix("metrics: "))


def test_gradcheck_subprocess_passes_every_impl_in_bf16() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.gradcheck", "grpo", "--config", "small-cpu", "--dtype", "bfloat16"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rec = metrics(proc.stdout)
    assert rec["kind"] == "gradcheck" and rec["ok"] is True and rec["tolerance_rel"] == 1e-2
    assert set(rec["impls"]) == {"chunked", "pallas", "fused_lm_head"}
    assert set(rec["impls"]["fused_lm_head"]) == {"loss", "dhidden", "dw", "ok"}
    assert all(r["ok"] for r in rec["impls"].values())
    assert rec["objective"] == "grpo_objective" and set(rec["by_objective"]) == set(gradcheck.OBJECTIVES)
    assert all(by[impl]["ok"] for by in rec["by_objective"].values() for impl in rec["impls"])


def test_gradcheck_grpo_differentiates_the_training_loss() -> None:
    """The checked loss is trainer/grpo/loss.py's objective on the reference log-probs: recomputed here."""
    from trainer.config import LossConfig
    from trainer.grpo.loss import grpo_objective

    rec = gradcheck.run("grpo", "small-cpu", "float32", ("chunked",))
    assert rec["ok"] and {"dapo", "grpo+kl", "bnpo", "dr_grpo"} <= set(rec["by_objective"])
    assert any(o.get("beta", 0) > 0 for o in gradcheck.OBJECTIVES.values())
    with jax.default_matmul_precision("highest"):
        x = gradcheck.inputs("small-cpu", "float32", 0)
        lp, ent = kernels.token_logprob_entropy(
            x["logits"], x["ids"], temperature=gradcheck.TEMPERATURE, impl="reference"
        )
    losses = {}
    for name, kw in gradcheck.OBJECTIVES.items():
        cfg = LossConfig(**kw)
        ref = x["ref_logp_logits"] if cfg.beta > 0 else None
        tokens = gradcheck.DAPO_TOKENS_SCALE * x["mask"].sum()
        want, _ = grpo_objective(
            lp, x["old_logp_logits"], ref, x["adv"], x["mask"], ent, cfg, dapo_tokens=tokens
        )
        losses[name] = float(want)
        assert rec["by_objective"][name]["reference_loss"] == pytest.approx(float(want), rel=1e-6), name
    assert len({round(v, 6) for v in losses.values()}) == len(losses)  # four different losses, not one


def test_gradcheck_ce_float32_in_process(capsys: pytest.CaptureFixture[str]) -> None:
    assert gradcheck.main(["ce", "--dtype", "float32"]) == 0
    rec = metrics(capsys.readouterr().out)
    assert rec["loss"] == "ce" and set(rec["impls"]) == {"chunked", "pallas", "fused_lm_head"}
    assert (
        rec["impls"]["chunked"]["dlogits"]["rel"] <= 2e-5
        and rec["impls"]["fused_lm_head"]["dw"]["rel"] <= 2e-5
    )


def no_entropy_grad(z: jax.Array, ids: jax.Array, t: float) -> tuple[jax.Array, jax.Array]:
    lp, ent = chunked.token_logprob_entropy(z, ids, temperature=t)
    return lp, jax.lax.stop_gradient(ent)


def logp_grad_off_by_1e4(z: jax.Array, ids: jax.Array, t: float) -> tuple[jax.Array, jax.Array]:
    lp, ent = chunked.token_logprob_entropy(z, ids, temperature=t)
    return lp + 1e-4 * (lp - jax.lax.stop_gradient(lp)), ent  # the same values, a gradient 1.0001x


@pytest.mark.parametrize("wrong", [no_entropy_grad, logp_grad_off_by_1e4])
def test_gradcheck_exits_1_on_a_wrong_impl(
    wrong: Callable, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Plausible kernel bugs (entropy without gradient; a log-prob gradient slightly off) fail every objective."""
    monkeypatch.setitem(kernels.LOGITS_IMPLS, "chunked", wrong)
    assert gradcheck.main(["grpo", "--impl", "chunked"]) == 1
    rec = metrics(capsys.readouterr().out)
    assert rec["ok"] is False and rec["impls"]["chunked"]["loss"]["rel"] <= 2e-5  # forward still right
    assert rec["impls"]["chunked"]["dlogits"]["rel"] > 2e-5
    assert not any(by["chunked"]["ok"] for by in rec["by_objective"].values())


def test_microbench_metrics_line_and_memory(capsys: pytest.CaptureFixture[str]) -> None:
    assert microbench.main(["--impl", "auto", "--B", "1", "--T", "64", "--V", "4096", "--iters", "2"]) == 0
    rec = metrics(capsys.readouterr().out)
    assert rec["kind"] == "microbench" and rec["impl"] == "chunked" and rec["dtype"] == "bfloat16"
    assert rec["p50_ms"] > 0 and rec["p90_ms"] >= rec["p50_ms"] and rec["temp_bytes"] > 0
    assert rec["floor_bytes"] == 3 * 64 * 4096 * 2


def test_chunked_and_fused_need_less_temp_memory_than_reference() -> None:
    """The issue's memory acceptance at its size, B=1 T=4096 V=151936 bf16, hidden 1536: XLA's compiled
    memory analysis of loss+grad (compile only, nothing is allocated)."""
    mem = {
        (impl, h): microbench.compiled_memory(impl, 1, 4096, 151936, jnp.bfloat16, h)["temp_bytes"]
        for impl, h in [("reference", None), ("chunked", None), ("reference", 1536), ("fused_lm_head", 1536)]
    }
    assert mem["chunked", None] <= 0.35 * mem["reference", None]
    assert mem["fused_lm_head", 1536] <= 0.15 * mem["reference", 1536]


def test_microbench_logs_to_wandb_offline_only_when_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    for var, value in LOCAL_ONLY_WANDB.items():
        monkeypatch.setenv(var, value)
    import wandb

    wandb.teardown()  # W&B reads its settings once per process: forget any earlier test's
    argv = ["--impl", "chunked", "--T", "16", "--V", "512", "--iters", "1"]
    assert microbench.main(argv) == 0
    assert not list(tmp_path.rglob("offline-run-*"))
    assert microbench.main([*argv, "--wandb"]) == 0
    assert len(list(tmp_path.rglob("offline-run-*"))) == 1
    assert capsys.readouterr().out.count("metrics: {") == 2


@pytest.mark.parametrize(
    ("main", "argv", "needle"),
    [
        (gradcheck.main, ["grpo", "--impl", "fast"], "gradcheck: --impl: loss impl must be one of"),
        (microbench.main, ["--impl", "fast"], "microbench: loss impl must be one of"),
        (microbench.main, ["--T", "0"], "microbench: --T must be > 0, received 0"),
    ],
)
def test_a_bad_argument_exits_2_with_one_line(
    main: Callable[[list[str]], int], argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """As argparse's own usage errors: exit 2, one line on stderr, nothing measured (docs/contracts.md)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert err.startswith(needle) and len(err.strip().splitlines()) == 1, err
    assert "metrics: " not in out
