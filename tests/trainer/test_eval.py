"""GSM8K eval: the scoring eval uses, the command (with a restored checkpoint), eval inside a training run."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.data import DATA
from tests.trainer.conftest import empty_tracing_cache
from trainer import checkpoint, config, data, metrics, train
from trainer import eval as trainer_eval

REPO = Path(__file__).resolve().parents[2]
EVAL_LINE = re.compile(r"^eval step=(?P<step>\d+) accuracy=(?P<acc>[0-9.]+) n=(?P<n>\d+) dt=[0-9.]+s$")


def eval_lines(out: str) -> list[str]:
    return [ln for ln in out.splitlines() if ln.startswith(("eval_begin ", "eval ", "eval_end "))]


def test_score_completions_gold_is_right_and_wrong_is_wrong() -> None:
    golds = [ex.gold for ex in data.load_gsm8k("auto", "test", str(DATA))[:4]]
    right = [f"<reasoning>\nsome work\n</reasoning>\n<answer>\n{g}\n</answer>" for g in golds]
    wrong = [f"<reasoning>\n{g} is tempting\n</reasoning>\n<answer>\n{int(g) + 1}\n</answer>" for g in golds]
    assert trainer_eval.score_completions(right, golds).tolist() == [1.0] * 4
    assert trainer_eval.score_completions(wrong, golds).tolist() == [0.0] * 4
    mixed = trainer_eval.score_completions([right[0], wrong[1], "no answer at all", f"so {golds[3]}"], golds)
    assert mixed.tolist() == [1.0, 0.0, 0.0, 1.0]  # without tags: the last number counts, as in training
    with pytest.raises(ValueError, match="3 completions but 4 gold answers"):
        trainer_eval.score_completions(right[:3], golds)


def test_bad_config_and_missing_checkpoint_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert trainer_eval.main(["--config", "tiny", "--set", "eval.batch=0"]) == 2
    assert "eval.batch must be > 0, received 0" in capsys.readouterr().err
    assert trainer_eval.main(["--config", "tiny", "--set", "eval.max_exampels=3"]) == 2
    assert "did you mean 'eval.max_examples'" in capsys.readouterr().err
    assert trainer_eval.main(["--config", "tiny", "--checkpoint", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert trainer_eval.main(["--config", "arith"]) == 2  # a task without an eval split, before any loading
    assert "config: data.task=arith has no eval split (tasks with one: gsm8k)" in capsys.readouterr().err
    assert not (tmp_path / "nope").exists()  # the check must not create it (orbax would)


def test_restore_params_reads_params_only_placed_like_the_model(tmp_path: Path, tiny_f32: tuple) -> None:
    import jax

    _, params = tiny_f32
    doubled = jax.tree_util.tree_map(lambda x: 2 * x, params)
    mgr = checkpoint.manager(str(tmp_path / "ck"))
    checkpoint.save(mgr, 7, {"params": doubled, "opt_state": {"count": np.int32(3)}}, {"data_position": 5})
    step, got = trainer_eval.restore_params(checkpoint.manager(str(tmp_path / "ck")), params, "ck")
    assert step == 7
    for g, want, like in zip(
        jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(doubled), jax.tree_util.tree_leaves(params),
        strict=True,
    ):  # fmt: skip
        np.testing.assert_array_equal(np.asarray(g), np.asarray(want))
        assert g.sharding == like.sharding
    with pytest.raises(config.ConfigError, match="no checkpoint in it"):
        trainer_eval.restore_params(checkpoint.manager(str(tmp_path / "empty")), params, "empty")


@pytest.mark.slow
def test_command_prints_the_three_lines_for_a_restored_checkpoint(
    tmp_path: Path, tiny_model_dir: Path, tiny_f32: tuple
) -> None:
    _, params = tiny_f32
    checkpoint.save(
        checkpoint.manager(str(tmp_path / "ck")), 3, {"params": params, "opt_state": {}}, {"data_position": 0}
    )
    sets = [f"model.path={tiny_model_dir}", f"log.output_dir={tmp_path / 'out'}", "eval.max_examples=8",
            "rollout.max_new_tokens=4", "mesh.devices=1", f"data.root={DATA}"]  # fmt: skip
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.eval", "--config", "tiny", *[a for s in sets for a in ("--set", s)],
         "--checkpoint", str(tmp_path / "ck")],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"restored step=3 from={tmp_path / 'ck'}" in proc.stdout
    lines = eval_lines(proc.stdout)
    assert len(lines) == 3 and lines[0] == "eval_begin step=3" and lines[2] == "eval_end step=3", lines
    m = EVAL_LINE.match(lines[1])
    assert m and m["step"] == "3" and int(m["n"]) == 8 and 0.0 <= float(m["acc"]) <= 1.0, lines[1]


class _Events(logging.Handler):
    """JAX compile lines and the emitter's lines, in the order they happened."""

    def __init__(self) -> None:
        super().__init__()
        self.events: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("Compiling"):
            self.events.append("COMPILE")


class _Emitter(metrics.Emitter):
    def __init__(self, events: list[str]) -> None:
        super().__init__(0)
        self._events = events

    def line(self, text: str, *, all_processes: bool = False) -> None:
        super().line(text, all_processes=all_processes)
        self._events.append(text)


def _compiles_between(events: list[str], begin: str, end: str) -> int:
    i, j = events.index(begin), events.index(end)
    assert i < j, (begin, end)
    return events[i:j].count("COMPILE")


@pytest.mark.slow
def test_eval_every_step_compiles_only_inside_the_first_eval(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """2 steps on 2 devices, eval after each: 5 examples in batches of 3 -> 4 (a multiple of the devices),
    so the second batch carries 3 repeated prompts that must not count."""
    import jax

    empty_tracing_cache()
    handler = _Events()
    logging.getLogger("jax").addHandler(handler)
    try:
        cfg = config.load("tiny", [
            f"log.output_dir={tmp_path / 'out'}", f"data.root={DATA}", "log.log_compiles=true", "mesh.devices=2",
            "train.steps=2",
            "train.prompts_per_step=2", "rollout.samples_per_prompt=2", "train.micro_batch=4",
            "rollout.max_new_tokens=4", "data.prompt_buckets=256", "eval.every=1", "eval.max_examples=5",
            "eval.batch=3",
        ])  # fmt: skip
        train.run(cfg, emit=_Emitter(handler.events))
    finally:
        logging.getLogger("jax").removeHandler(handler)
        jax.config.update("jax_log_compiles", False)
        jax.config.update("jax_explain_cache_misses", False)
    out = capsys.readouterr().out
    ev = handler.events
    lines = eval_lines(out)
    assert [ln.split(" accuracy")[0] for ln in lines] == [
        "eval_begin step=1", "eval step=1", "eval_end step=1", "eval_begin step=2", "eval step=2", "eval_end step=2",
    ]  # fmt: skip
    for line in (lines[1], lines[4]):
        m = EVAL_LINE.match(line)
        assert m and int(m["n"]) == 5 and 0.0 <= float(m["acc"]) <= 1.0, line
    first_step = next(e for e in ev if e.startswith("step=0 "))
    second_step = next(e for e in ev if e.startswith("step=1 "))
    assert ev[: ev.index(first_step)].count("COMPILE") > 0  # the capture works: step 0 compiles
    assert _compiles_between(ev, "eval_begin step=1", "eval_end step=1") > 0  # greedy: a sampler of its own
    assert _compiles_between(ev, "eval_end step=1", second_step) == 0  # nothing of eval leaks into training
    assert _compiles_between(ev, "eval_begin step=2", "eval_end step=2") == 0
