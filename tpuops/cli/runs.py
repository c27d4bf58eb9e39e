"""Top-level commands users type: `run NAME`, `recompile-check`, `gradcheck`, `microbench`, detached runs, doctor."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Annotated

import typer
from typer.core import TyperCommand

from tpuops.cli import options as o
from tpuops.cli.command import App, SopCommand, sop_command
from tpuops.cli.state import detach_on_sigint, finish_json, interrupted_line, run_sop

SopNameArg = o.SopNameArg
LossArg = Annotated[str, typer.Argument(help="Which loss: grpo or ce.")]
ImplOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--impl",
        help="Loss implementation, repeatable: reference, chunked, pallas, fused_lm_head, auto "
        "(default: chunked). Several run one after another and are compared side by side.",
    ),
]


def run_named(
    name: str,
    fixed: dict[str, object],
    opts: o.RunOptions,
    target: o.TargetOptions,
    watch: o.WatchOptions,
    command: list[str] | None = None,
) -> None:
    """Run SOP `name` with the command's own values (`fixed`) under the user's --set (and the words after `--`)."""
    run_sop(
        name,
        {**fixed, **opts.sets()},  # type: ignore[dict-item]
        target.spec(),
        command=tuple(command or ()),
        worker=opts.worker,
        dry_run=opts.dry_run,
        verbose=opts.verbose,
        offline=opts.offline,
        json=opts.json,
        force=opts.force,
        keep_going=opts.keep_going,
        parallel=opts.parallel,
        recover=watch.recoveries(),
        skip_fit=watch.skip_fit,
        unreachable_s=watch.unreachable_s,
    )


@o.wired
def run(
    name: SopNameArg,
    cmd: o.CommandArg = None,
    *,
    profile_steps: o.ProfileStepsOpt = None,
    opts: o.RunOptions,
    target: o.TargetOptions,
    watch: o.WatchOptions,
) -> None:
    """Run a SOP by name; `--set a.b=c` (with a dot) goes to the trainer, checked before anything runs.
    `job` runs your own command (after `--`) in your repository on every worker.

    \b
    Examples:
      tpuops run grpo --vm mllm-jax-v6e-8 --zone us-east1-d --set steps=20
      tpuops run grpo --local --set steps=3 --set rollout.max_new_tokens=16
      tpuops run job --vm mllm-jax-v6e-8 -- python -u scripts/train.py --config configs/small.yaml
      tpuops run grpo --dry-run --json
      tpuops run grpo --local --set steps=8 --profile-steps 5-7
    """
    run_named(name, {"profile_steps": profile_steps} if profile_steps else {}, opts, target, watch, cmd)


@o.wired
def recompile_check(
    cmd: o.CommandArg = None, *, opts: o.RunOptions, target: o.TargetOptions, watch: o.WatchOptions
) -> None:
    """A few GRPO steps (or your own JAX command, after `--`) with JAX compile logging; exit 7 if anything
    compiles after the warm-up, 13 if no step line or no compile logging was seen.

    \b
    Examples:
      tpuops recompile-check                       # the VM from tpuops.toml
      tpuops recompile-check --local --set steps=4 --json
      tpuops recompile-check --vm mllm-jax-v6e-8 -- python -u scripts/train.py --set steps=5
    """
    run_named("recompile-check-job" if cmd else "recompile-check", {}, opts, target, watch, cmd)


@o.wired
def gradcheck(
    loss: LossArg = "grpo", *, opts: o.RunOptions, target: o.TargetOptions, watch: o.WatchOptions
) -> None:
    """Every loss implementation against the float32 reference (loss, dlogits); exit 1 beyond tolerance.

    \b
    Examples:
      tpuops gradcheck ce --vm mllm-jax-v6e-8
      tpuops gradcheck grpo --local
    """
    run_named("gradcheck", {"loss": loss}, opts, target, watch)


@o.wired
def microbench(
    impl: ImplOpt = None, *, opts: o.RunOptions, target: o.TargetOptions, watch: o.WatchOptions
) -> None:
    """Forward+backward time and peak memory of loss implementations, side by side with ratios.

    \b
    Examples:
      tpuops microbench --vm mllm-jax-v6e-8 --impl reference --impl chunked --impl pallas
      tpuops microbench --local --impl chunked --set tokens=1024 --set iters=5
    """
    run_named("microbench", {"impl": impl} if impl else {}, opts, target, watch)


def register(app: typer.Typer) -> None:
    """Add the everyday commands to the top-level app."""

    # short_help: one whole sentence in `tpuops --help` (click would cut the docstring's first line at 80 columns).
    def add(name: str, fn: Callable[..., None], short: str, cls: type[TyperCommand] | None = None) -> None:
        app.command(name, cls=cls, short_help=short)(fn)

    add("run", run, "Run a SOP on the workers (`run grpo -h` lists its parameters).", SopCommand)
    add("recompile-check", recompile_check, "GRPO steps; exit 7 if anything compiles after the warm-up.",
        sop_command("recompile-check"))  # fmt: skip
    add(
        "gradcheck",
        gradcheck,
        "Loss implementations against the float32 reference.",
        sop_command("gradcheck"),
    )
    add("microbench", microbench, "Time and memory of loss implementations, side by side.",
        sop_command("microbench"))  # fmt: skip
    add("runs", runs, "The runs started from this machine, newest first.")
    add("attach", attach, "Follow a detached run again, then report it.")
    add("logs", logs, "Print a run's worker logs on stdout (-f: follow).")
    add("stop", stop, "Stop a run on every worker and clear the TPU lock.")
    add("top", top, "Each worker's chips now: HBM in use and duty cycle per chip, live.")
    add("doctor", doctor, "Check every worker: connection, .env keys, TPU lock.")


RunIdArg = o.RunIdArg


@o.wired
def runs(
    json: o.JsonOpt = False,
    offline: Annotated[
        bool, typer.Option("--offline", help="Do not ask the workers: unfinished runs show as unknown.")
    ] = False,
) -> None:
    """List the runs started from this machine (newest first) with their state: a finished run from its
    saved result; any other from its workers' pid and exit files (running, exited N, stopped, lost), or
    `unknown` with the reason when they cannot be reached."""
    from tpuops.run import detached, report, store

    finish_json(json)
    report.runs_table(detached.states(store.list_runs(), ask=not offline), json)


@o.wired
def attach(
    run_id: RunIdArg,
    json: o.JsonOpt = False,
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Replay the log from its first line.")
    ] = False,
    all_workers: Annotated[
        bool, typer.Option("--all-workers", help="Show every worker's lines, not only w0.")
    ] = False,
    raw: o.RawOpt = False,
) -> None:
    """Resume following a detached run from where the last follow stopped; then fetch logs and report.

    Ctrl-C detaches again (exit 130): the job goes on, and the line printed says how to reach it."""
    from tpuops import console
    from tpuops.logs.progress import Progress
    from tpuops.run import detached as library
    from tpuops.run import logreport, store

    finish_json(json)
    console.raw_output(raw)
    detach = threading.Event()  # the first Ctrl-C: stop following, the job goes on
    # The status line as the run's own had it: elapsed from the run's start, total and ETA from the lines before.
    view = Progress.following(store.load(run_id).started) if console.live_wanted(json) else None
    with detach_on_sigint(detach), console.Live(view) as live:
        attached = library.attach(
            run_id,
            on_line=live.line,
            stream="all" if all_workers else "first",
            from_start=from_start,
            detach=detach,
            on_past=view.past if view is not None else None,
        )
    if attached.detached:
        console.event(interrupted_line(attached.run_id, "detached"))
        raise typer.Exit(attached.code)
    for w, why in attached.lost.items():
        console.event(f"w{w}: could not follow the run: {why}")
    logreport.render(attached.log, attached.code, json, None, None)
    if attached.hint:
        console.event(f"fix: {attached.hint}")
    raise typer.Exit(attached.code)


@o.wired
def logs(
    run_id: RunIdArg,
    worker: o.WorkerOpt = "0",
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")
    ] = False,
    raw: o.RawOpt = False,
    prefix: Annotated[
        bool,
        typer.Option("--prefix", help="Start each line with its worker ([w0]); the default for several."),
    ] = False,
) -> None:
    """Print a run's worker logs on stdout (from the workers; from the local copy when it is complete).

    One worker's log comes as it is, so `tpuops logs RUN | grep ^step=` works; several workers' lines start
    with `[wK] ` (or one worker's too, with --prefix). Errors and notes go to stderr. Terminal control
    sequences in the logs (clear screen, window title, clipboard writes) are shown escaped (`\\x1b[2J`);
    `--raw` passes them through.

    \b
    Examples:
      tpuops logs 20260101-120000-grpo-ab12 | grep -c '^step='
      tpuops logs 20260101-120000-grpo-ab12 --worker all -f
    """
    from tpuops import console
    from tpuops.run import detached as library

    console.raw_output(raw)
    chosen = library.chosen_workers(run_id, worker)
    sink = console.log_sink(prefix=prefix or len(chosen) > 1)
    library.logs(run_id, worker, follow=follow, on_line=sink)


@o.wired
def top(
    run_id: RunIdArg,
    once: Annotated[bool, typer.Option("--once", help="One snapshot, then exit.")] = False,
    interval: Annotated[
        float, typer.Option("--interval", min=0.5, metavar="SECONDS", help="Seconds between snapshots.")
    ] = 5.0,
    json: o.JsonOpt = False,
) -> None:
    """Show each worker's chips at its latest step: HBM in use per chip (min-max, peak, limit) and duty cycle,
    asked of every worker of a multi-host run at once; again every --interval seconds until the job ends
    (`q` or Ctrl-C to leave; `q` exits 0). On a CPU backend the memory fields are absent, and the command says so.

    \b
    Examples:
      tpuops top 20260101-120000-grpo-ab12
      tpuops top 20260101-120000-grpo-ab12 --once --json
    """
    from tpuops.run import report
    from tpuops.run import top as library

    while True:
        snap = library.snapshot(run_id)
        report.top_table(snap, json)
        if once or json or not snap.running or library.quit_pressed(interval):
            return


@o.wired
def stop(run_id: RunIdArg, json: o.JsonOpt = False) -> None:
    """Stop a run on every worker: SIGTERM, then SIGKILL after a grace period, then clear the TPU lock."""
    from tpuops.run import detached as library
    from tpuops.run import report

    finish_json(json)
    stopped = library.stop(run_id)
    report.stop_table(run_id, stopped.results, json)
    raise typer.Exit(stopped.code)


@o.wired
def doctor(
    *,
    json: o.JsonOpt = False,
    target: o.TargetOptions,
    env_file: Annotated[
        str | None,
        typer.Option(
            "--env-file", help="The local .env to compare with (default: the SOP's env_file, .env)."
        ),
    ] = None,
    remote_env: Annotated[
        str | None,
        typer.Option("--remote-env", help="The .env path on the workers (default: REPO_DIR/.env)."),
    ] = None,
    lockfile: Annotated[
        str | None,
        typer.Option("--lockfile", help="libtpu's lock file on the workers (default: the SOP's lockfile)."),
    ] = None,
    set_: o.SetOpt = None,
) -> None:
    """Check every worker: connection and host key, which .env keys it has (by hash) against yours, the TPU lock,
    and each repository's home there (~/tpuops/<name>-<hash>/: size, last use, whether a run uses it).

    Where to look comes from the same SOP parameters a run uses (`repo_dir`, `lockfile`, `env_file`: --set,
    then `params` in tpuops.toml, then the grpo SOP's defaults); --remote-env and --lockfile override them.

    \b
    Examples:
      tpuops doctor --vm mllm-jax-v6e-8
      tpuops doctor --host me@10.0.0.2 --hostkey SHA256:... --json
    """
    from pathlib import Path

    from tpuops.config import parse_sets
    from tpuops.run import health as library
    from tpuops.run import report

    spec = target.spec()
    found = library.examine(
        spec, sets=parse_sets(set_), env_file=env_file, remote_env=remote_env, lockfile=lockfile, cwd=Path.cwd(),
    )  # fmt: skip
    report.doctor(found, json, spec.vm)
    raise typer.Exit(found.code)


bench_app = App(help="Benchmarks run through SOPs.", no_args_is_help=True, rich_markup_mode=None)


@bench_app.command("rollout")
@o.wired
def bench_rollout(
    cmd: o.CommandArg = None,
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant",
            help="One variant: trainer overrides a.b=v[,c.d=w]; with `-- CMD`, what a shell line adds to the "
            "command: leading NAME=value words are environment, the rest extra arguments. '' is the baseline.",
        ),
    ] = None,
    sop: Annotated[
        str, typer.Option("--sop", metavar="NAME", help="The SOP each variant runs (with `-- CMD`: job).")
    ] = "grpo",
    profile: o.BenchProfileOpt = False,
    *,
    opts: o.RunOptions,
    target: o.TargetOptions,
    skip_fit: o.SkipFitOpt = False,
) -> None:
    """N steps per variant (same target, one after another), then step time and rollout_generate side by side:
    GRPO by default, any SOP with --sop, your own command after `--`. The exit code is the first failed
    variant's, as `tpuops run` gives it (10 out of memory, 8 VM lost: the rest do not run; 1 no log read).

    \b
    Examples:
      tpuops bench rollout --vm mllm-jax-v6e-8 --set steps=10 --variant '' --variant rollout.max_new_tokens=256
      tpuops bench rollout --local --set steps=4 --variant '' --variant 'rollout.temperature=0.7'
      tpuops bench rollout --local --set steps=5 --profile --variant '' --variant rollout.max_new_tokens=8
      tpuops bench rollout --vm mllm-jax-v6e-8 --variant '' --variant 'XLA_FLAGS=--xla_tpu_foo=true --set bs=16' \\
        -- python -u scripts/train.py --config configs/small.yaml
    """
    from tpuops.run import bench, benchview, launch, report

    req = launch.RunRequest(
        sop="job" if cmd and sop == "grpo" else sop, sets=opts.sets(), target=target.spec(), worker=opts.worker,
        force=opts.force, keep_going=opts.keep_going, parallel=opts.parallel, skip_fit=skip_fit,
        command=tuple(cmd or ()), inspect=opts.dry_run and not opts.offline, offline=opts.dry_run and opts.offline,
    )  # fmt: skip
    req = bench.with_profile(req) if profile else req
    if opts.dry_run:
        report.dry_runs(bench.plans(req, list(variant or [])), opts.json, verbose=opts.verbose)
        return
    from tpuops import console
    from tpuops.logs.progress import Progress

    # At a terminal each variant's run is followed under the status line (its steps as compact rows).
    with console.Live(Progress() if console.live_wanted(opts.json) else None) as live:
        ran = bench.run(
            req, list(variant or []), on_line=live.line if live.watched is not None else None,
            on_step=None if opts.json else report.step_done, on_notice=console.event, notify=console.note,
            on_phase=live.phase,
        )  # fmt: skip
    if (lost := ran.verdict.error_line()) is not None:  # the VM went: one error line, as any run on it ends
        console.error(lost, ran.code, "preempted")
        raise typer.Exit(ran.code)
    benchview.rollout_bench(ran.variants, opts.json)
    raise typer.Exit(ran.code)
