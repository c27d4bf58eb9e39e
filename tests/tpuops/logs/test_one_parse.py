"""Each log is parsed once: the run's report is made from the scanners the follow fed (and the fetch fed only what
the follow did not read), and it is the report a read of the fetched files gives, line for line."""

from __future__ import annotations

import os
import random
import threading
from pathlib import Path

import pytest

from tpuops.config import TargetSpec
from tpuops.logs.actions import Fetch, Follow
from tpuops.logs.events import Event, ExitEvent, StepEvent
from tpuops.logs.follow import Follower, Readings
from tpuops.logs.scanner import LogScanner
from tpuops.run import launch, scan
from tpuops.run.result import RunResult
from tpuops.shell import Redactor
from tpuops.transport.local import LocalTransport

RUN = "~/runs/r1"
SECRET = "SECRET-7f3a9"
# Every kind of line the report reads: warm-up and later compiles (one explained), an eval window, records,
# step lines with and without a duration (timed by when the follower saw them), another worker's chips, a
# secret, failures, bytes that are not UTF-8, a long line, and a traceback the end of the log cuts off.
LOG = b"".join(
    [
        b"start: backend=cpu process_index=0 process_count=1\n",
        b"config: task=arith steps=40 file=/tmp/config.json\n",
        b"Compiling jit(train_step) with global shapes and types [f32[8]]\n",
        b"step=0 loss=0.900000 entropy=1.0000 reward_mean=0.1000 dt=5.00s\n",
        *(f"step={i} loss=0.{i:02d} reward_mean=0.{i:02d} dt=0.{i:02d}s\n".encode() for i in range(1, 12)),
        b"TRACING CACHE MISS at train.py:40 because:\n",
        b"  for train_step defined at train.py:12\n",
        b"  never seen input type signature\n",
        b"Compiling jit(train_step) with global shapes and types [f32[9]]\n",
        b"step=12 loss=0.5 dt=0.80s\n",
        b"eval_begin step=12\n",
        b"Compiling jit(eval_step) with global shapes and types [f32[4]]\n",
        b"eval_end step=12\n",
        b"eval step=12 accuracy=0.5\n",
        b"checkpoint step=12 path=/ck/12\n",
        b"chips: step=12 process=1 hbm_gb_min=1.5 hbm_gb_max=2.5 duty_pct_min=10 duty_pct_max=20\n",
        *(f"2026-01-20 12:00:{s:02d},000 INFO step {13 + i}\n".encode() for i, s in enumerate((1, 3, 6))),
        *(f"step: {16 + i} loss: 0.1\n".encode() for i in range(12)),
        f"wandb: url=https://wandb.ai/team/{SECRET}\n".encode(),
        b"bytes \xff\xfe that are not UTF-8\n",
        b"x" * 3000 + b"\n",
        f"RESOURCE_EXHAUSTED: out of memory while allocating (key {SECRET})\n".encode(),
        b'metrics: {"kind": "probe", "value": 1.5}\n',
        b"Traceback (most recent call last):\n",
        b'  File "train.py", line 9, in main\n',
        b"    run()",  # the job ends mid-line, inside the traceback
    ]
)


class Job(LocalTransport):
    """A job that writes its log a random piece (1-80 bytes: lines split anywhere) at each read of the log,
    then its exit file: the follower meets the log as it grows."""

    def __init__(self, root: Path, log: bytes, code: str, seed: int) -> None:
        super().__init__(root, 1)
        self.rest, self.code, self.rng = log, code, random.Random(seed)
        run = self.resolve(0, RUN)
        run.mkdir(parents=True)
        (run / "worker-0.pid").write_text(f"{os.getpid()}\n")  # alive: the follower's died-check passes
        (run / "worker-0.log").write_bytes(b"")

    def read_from(self, worker: int, remote_path: str, offset: int, limit: int | None = None) -> bytes | None:
        if remote_path.endswith(".log") and self.rest:
            n = self.rng.randint(1, 80)
            with self.resolve(worker, remote_path).open("ab") as f:
                f.write(self.rest[:n])
            self.rest = self.rest[n:]
            if not self.rest:
                self.resolve(worker, f"{RUN}/worker-0.exit").write_text(self.code)
        return super().read_from(worker, remote_path, offset, limit)


def _follower(job: Job, **kw: object) -> tuple[Follower, list[str]]:
    shown: list[str] = []
    follower = Follower(
        job, redact=Redactor([SECRET]), on_line=lambda _, text: shown.append(text),
        reads=Readings(warmup=2), **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    return follower, shown


def _same_as_a_read_of_the_fetched_files(follower: Follower, local: Path, *, followed: bool = True) -> None:
    ours = scan.run_report(follower.reads.report(), local / "r1")
    assert follower.reads.complete == [0]
    fetched = scan.scan_run(local / "r1", warmup=2)  # what the report read before: the files, once more
    assert ours.to_dict() == fetched.to_dict()
    assert ours.lines == LOG.count(b"\n") + 1 and SECRET not in str(ours.to_dict())
    # The exit code joins after the last line, the traceback the end cut off, as a read of the files has it.
    assert [f.kind for f in ours.failures] == ["oom", "traceback", "exit_code"]
    assert ours.compiles["after_warmup"] == 1 and ours.recompiles[0].explanation is not None
    # No duration printed: timed by the gaps between the polls that brought them (one poll's lines: unknown);
    # lines only the fetch read have no such time.
    assert any(r.dt for r in ours.rows if r.step > 16) is followed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_report_of_a_followed_log_is_the_report_of_its_fetched_copy(tmp_path: Path, seed: int) -> None:
    job = Job(tmp_path / "vm", LOG, "3\n", seed)
    follower, shown = _follower(job)
    r = follower.follow(0, Follow(RUN, timeout=60, poll_s=0.001), threading.Event())
    assert r.ok and r.job_exit == 3
    assert follower.fetch(0, Fetch(RUN), tmp_path / "local").ok
    fetched = (tmp_path / "local" / "r1" / "worker-0.log").read_bytes().decode(errors="replace")
    assert shown == fetched.split("\n")
    _same_as_a_read_of_the_fetched_files(follower, tmp_path / "local")


def test_a_follow_that_ends_early_is_completed_by_the_fetch_each_line_once(tmp_path: Path) -> None:
    job = Job(tmp_path / "vm", LOG, "3\n", seed=4)
    cancel = threading.Event()

    def stepped(e: Event) -> None:  # another worker failed: this follow is cancelled halfway
        if isinstance(e, StepEvent) and e.step == 8:
            cancel.set()

    follower, _ = _follower(job, on_event=stepped)
    r = follower.follow(0, Follow(RUN, timeout=60, poll_s=0.001), cancel)
    assert r.kind.value == "cancelled" and follower.reads.complete == []
    assert follower.reads.report() is None  # a log read in part is in no report
    assert follower.fetch(0, Fetch(RUN), tmp_path / "local").ok  # the job ends while it is fetched
    _same_as_a_read_of_the_fetched_files(follower, tmp_path / "local", followed=False)


def test_a_second_follower_shows_only_what_is_new_and_reads_the_whole_log_once(tmp_path: Path) -> None:
    """`tpuops attach` in a new process: the lines shown before are not shown again, but its scanner starts at
    the log's first byte, so its report is the whole log's."""
    job = Job(tmp_path / "vm", LOG, "3\n", seed=5)
    detach = threading.Event()

    def stepped(e: Event) -> None:  # Ctrl-C at step 8: the job goes on
        if isinstance(e, StepEvent) and e.step == 8:
            detach.set()

    first, shown = _follower(job, on_event=stepped, detach=detach)
    assert first.follow(0, Follow(RUN, timeout=60, poll_s=0.001), threading.Event()).kind.value == "detached"
    steps: list[int | str | None] = []

    def heard(e: Event) -> None:
        if isinstance(e, StepEvent | ExitEvent):
            steps.append(e.step if isinstance(e, StepEvent) else "exit")

    again, more = _follower(job, offsets=dict(first.offsets), on_event=heard)
    assert again.follow(0, Follow(RUN, timeout=60, poll_s=0.001), threading.Event()).ok
    assert again.fetch(0, Fetch(RUN), tmp_path / "local").ok
    every = (tmp_path / "local" / "r1" / "worker-0.log").read_bytes().decode(errors="replace").split("\n")
    assert shown + more == every  # nothing shown twice, nothing lost
    assert isinstance(steps[0], int) and steps[0] > 8 and steps[-1] == "exit"  # the new lines' events only
    _same_as_a_read_of_the_fetched_files(again, tmp_path / "local")


ONE_LOG = """name: onelog
description: a job's log, followed and fetched
scan: {source: log, warmup: 1, fail_on_recompile: true}
steps:
  - kind: run
    name: start job
    command: >-
      echo 'Compiling jit(step_fn) with global shapes'; i=0; while [ $i -lt 40 ]; do
      echo "step=$i loss=0.5 dt=0.01s"; echo "noise $i"; i=$((i+1)); sleep 0.01; done;
      echo 'Compiling jit(step_fn) with global shapes'; echo 'step=40 loss=0.5 dt=0.01s'
  - kind: follow
    poll_s: 0.05
  - kind: fetch_log
"""


def test_a_run_parses_each_workers_log_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real local job on two workers, through `launch.start`: every line of each worker's log goes through
    a scanner exactly once (the follow's), and the report is the one a read of the fetched files gives."""
    (tmp_path / "sops").mkdir()
    (tmp_path / "sops" / "onelog.yaml").write_text(ONE_LOG)
    fed: dict[int, int] = {0: 0, 1: 0}
    lines = LogScanner._lines

    def counted(self: LogScanner, chunk: list[bytes]) -> None:
        fed[self.worker] += len(chunk)
        lines(self, chunk)

    monkeypatch.setattr(LogScanner, "_lines", counted)
    req = launch.RunRequest(sop="onelog", target=TargetSpec(local=True, local_workers=2))
    result = launch.start(req, cwd=tmp_path)
    assert isinstance(result, RunResult) and int(result.code) == 7, result.to_dict()  # recompiled at step 40
    local = Path(os.environ["TPUOPS_HOME"]) / "runs" / result.run_id
    written = {w: (local / f"worker-{w}.log").read_bytes().count(b"\n") for w in (0, 1)}
    assert written == {0: 83, 1: 83} and fed == written  # each line once: no second read of the fetched files
    assert result.log is not None and result.log.workers == [0, 1] and result.log.recompiled
    monkeypatch.setattr(LogScanner, "_lines", lines)
    assert result.log.to_dict() == scan.scan_run(local, warmup=1).to_dict()
