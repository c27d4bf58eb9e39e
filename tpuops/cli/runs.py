"""Top-level commands users type: `run NAME`, `recompile-check`, `gradcheck`, `microbench`, and detached runs."""

# No `from __future__ import annotations` here: the generated commands need real annotation objects
# for Typer (their signatures are assembled at import time).
import inspect
from collections.abc import Callable
from typing import Annotated

import typer

from tpuops.cli import options as o
from tpuops.cli.state import finish_json, run_sop


def _sop_command(
    sop_name: str | None, doc: str, fixed: Callable[..., dict[str, str]] | None = None
) -> Callable:
    """A command that runs one SOP with every shared target option (sop_name None: the SOP is an argument)."""

    def command(
        set_: o.SetOpt = None,
        worker: o.WorkerOpt = "all",
        dry_run: o.DryRunOpt = False,
        json: o.JsonOpt = False,
        force: o.ForceOpt = False,
        keep_going: o.KeepGoingOpt = False,
        parallel: o.ParallelOpt = None,
        vm: o.VmOpt = None,
        zone: o.ZoneOpt = None,
        project: o.ProjectOpt = None,
        host: o.HostOpt = None,
        hostkey: o.HostKeyOpt = None,
        user: o.UserOpt = None,
        identity: o.IdentityOpt = None,
        local: o.LocalOpt = False,
        local_workers: o.LocalWorkersOpt = 1,
        internal_ip: o.InternalIpOpt = False,
        api_endpoint: o.ApiEndpointOpt = None,
        tunnel_through_iap: o.TunnelOpt = False,
        no_key_push: o.NoKeyPushOpt = False,
        key_ttl: o.KeyTtlOpt = None,
        recover: o.RecoverOpt = False,
        max_recoveries: o.MaxRecoveriesOpt = 3,
        skip_fit: o.SkipFitOpt = False,
        unreachable_s: o.UnreachableOpt = None,
        **extra: str,
    ) -> None:
        spec = o.target(
            vm=vm,
            zone=zone,
            project=project,
            host=host,
            hostkey=hostkey,
            user=user,
            identity=identity,
            local=local,
            local_workers=local_workers,
            internal_ip=internal_ip,
            api_endpoint=api_endpoint,
            tunnel_through_iap=tunnel_through_iap,
            no_key_push=no_key_push,
            key_ttl=key_ttl,
        )
        name = sop_name or extra.pop("name")
        sets = {**(fixed(**extra) if fixed else {}), **o.parse_sets(set_)}
        run_sop(
            name,
            sets,
            spec,
            worker=worker,
            dry_run=dry_run,
            json=json,
            force=force,
            keep_going=keep_going,
            parallel=parallel,
            recover=max_recoveries if recover else None,
            skip_fit=skip_fit,
            unreachable_s=unreachable_s,
        )

    command.__doc__ = doc
    return command


def _with_args(fn: Callable, *params: inspect.Parameter) -> Callable:
    """Typer reads the signature: put the command's positional arguments first, drop the **extra."""
    sig = inspect.signature(fn)
    kept = [p for p in sig.parameters.values() if p.kind != p.VAR_KEYWORD]
    fn.__signature__ = sig.replace(parameters=[*params, *kept])  # type: ignore[attr-defined]
    return fn


def named_sop_command(doc: str) -> Callable:
    """A command whose first argument is the SOP's name (`tpuops run NAME`, `tpuops sop run NAME`)."""
    name_arg = inspect.Parameter(
        "name",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        annotation=Annotated[str, typer.Argument(help="SOP name (tpuops sop list), e.g. grpo.")],
    )
    return _with_args(_sop_command(None, doc), name_arg)


def register(app: typer.Typer) -> None:
    """Add the everyday commands to the top-level app."""

    app.command("run")(
        named_sop_command(
            """Run a SOP by name; `--set a.b=c` (with a dot) goes to the trainer, checked before anything runs.

        \b
        Examples:
          tpuops run grpo --vm mllm-jax-v6e-8 --zone us-east1-d --set steps=20
          tpuops run grpo --local --set steps=3 --set rollout.max_new_tokens=16
          tpuops run grpo --dry-run --json
        """
        )
    )
    app.command("recompile-check")(
        _with_args(
            _sop_command(
                "recompile-check",
                """A few GRPO steps with JAX compile logging; exit 7 if anything compiles after the warm-up.

        \b
        Examples:
          tpuops recompile-check                       # the VM from tpuops.toml
          tpuops recompile-check --local --set steps=4 --json
        """,
            )
        )
    )
    loss_arg = inspect.Parameter(
        "loss",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        annotation=Annotated[str, typer.Argument(help="Which loss: grpo or ce.")],
        default="grpo",
    )
    app.command("gradcheck")(
        _with_args(
            _sop_command(
                "gradcheck",
                """Every loss implementation against the float32 reference (loss, dlogits); exit 1 beyond tolerance.

        \b
        Examples:
          tpuops gradcheck ce --vm mllm-jax-v6e-8
          tpuops gradcheck grpo --local
        """,
                fixed=lambda loss: {"loss": loss},
            ),
            loss_arg,
        )
    )
    impl_opt = inspect.Parameter(
        "impl",
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
        annotation=Annotated[
            list[str] | None,
            typer.Option(
                "--impl",
                help="Loss implementation, repeatable: reference, chunked, pallas, fused_lm_head, auto "
                "(default: chunked). Several run one after another and are compared side by side.",
            ),
        ],
        default=None,
    )
    app.command("microbench")(
        _with_args(
            _sop_command(
                "microbench",
                """Forward+backward time and peak memory of loss implementations, side by side with ratios.

        \b
        Examples:
          tpuops microbench --vm mllm-jax-v6e-8 --impl reference --impl chunked --impl pallas
          tpuops microbench --local --impl chunked --set tokens=1024 --set iters=5
        """,
                fixed=lambda impl: {"impl": impl} if impl else {},
            ),
            impl_opt,
        )
    )


RunIdArg = Annotated[str, typer.Argument(help="A run id (tpuops runs).")]


def runs(json: o.JsonOpt = False) -> None:
    """List the runs started from this machine (newest first) with their outcome."""
    from tpuops.run import report
    from tpuops.run import store as library

    finish_json(json)
    report.runs_table(library.list_runs(), json)


def attach(
    run_id: RunIdArg,
    json: o.JsonOpt = False,
    from_start: Annotated[
        bool, typer.Option("--from-start", help="Replay the log from its first line.")
    ] = False,
    all_workers: Annotated[
        bool, typer.Option("--all-workers", help="Show every worker's lines, not only w0.")
    ] = False,
) -> None:
    """Resume following a detached run from where the last follow stopped; then fetch logs and report."""
    from tpuops import console
    from tpuops.run import logreport
    from tpuops.run import store as library

    finish_json(json)
    attached = library.attach(
        run_id, on_line=console.line, stream="all" if all_workers else "first", from_start=from_start
    )
    for w, why in attached.lost.items():
        console.event(f"w{w}: could not follow the run: {why}")
    logreport.render(attached.log, attached.code, json, None, None)
    raise typer.Exit(attached.code)


def logs(
    run_id: RunIdArg,
    worker: o.WorkerOpt = "0",
    follow: Annotated[
        bool, typer.Option("--follow", "-f", help="Keep printing new lines until the run ends.")
    ] = False,
) -> None:
    """Print a run's worker logs (from the workers; from the local copy when it is complete)."""
    from tpuops import console
    from tpuops.run import store as library

    library.logs(run_id, worker, follow=follow, on_line=console.line)


def stop(run_id: RunIdArg, json: o.JsonOpt = False) -> None:
    """Stop a run on every worker: SIGTERM, then SIGKILL after a grace period, then clear the TPU lock."""
    from tpuops.run import report
    from tpuops.run import store as library

    finish_json(json)
    stopped = library.stop(run_id)
    report.stop_table(run_id, stopped.results, json)
    raise typer.Exit(stopped.code)


def doctor(
    json: o.JsonOpt = False,
    vm: o.VmOpt = None,
    zone: o.ZoneOpt = None,
    project: o.ProjectOpt = None,
    host: o.HostOpt = None,
    hostkey: o.HostKeyOpt = None,
    user: o.UserOpt = None,
    identity: o.IdentityOpt = None,
    local: o.LocalOpt = False,
    internal_ip: o.InternalIpOpt = False,
    api_endpoint: o.ApiEndpointOpt = None,
    tunnel_through_iap: o.TunnelOpt = False,
    no_key_push: o.NoKeyPushOpt = False,
    key_ttl: o.KeyTtlOpt = None,
    env_file: Annotated[str, typer.Option("--env-file", help="The local .env to compare with.")] = ".env",
    remote_env: Annotated[
        str, typer.Option("--remote-env", help="The .env path on the workers.")
    ] = "~/tpuops/repo/.env",
    lockfile: Annotated[
        str, typer.Option("--lockfile", help="libtpu's lock file on the workers.")
    ] = "/tmp/libtpu_lockfile",
) -> None:
    """Check every worker: connection and host key, which .env keys it has (by hash) against yours, the TPU lock.

    \b
    Examples:
      tpuops doctor --vm mllm-jax-v6e-8
      tpuops doctor --host me@10.0.0.2 --hostkey SHA256:... --json
    """
    from pathlib import Path

    from tpuops.checks import doctor as library
    from tpuops.run import report

    finish_json(json)
    spec = o.target(
        vm=vm,
        zone=zone,
        project=project,
        host=host,
        hostkey=hostkey,
        user=user,
        identity=identity,
        local=local,
        internal_ip=internal_ip,
        api_endpoint=api_endpoint,
        tunnel_through_iap=tunnel_through_iap,
        no_key_push=no_key_push,
        key_ttl=key_ttl,
    )
    health = library.examine(
        spec, env_file=Path(env_file), remote_env=remote_env, lockfile=lockfile, cwd=Path.cwd()
    )
    report.doctor(health, json)
    bad = any(
        not h.connected or any(s in ("differs", "missing", "unreadable") for s in h.env_keys.values())
        for h in health
    )
    raise typer.Exit(1 if bad else 0)


bench_app = typer.Typer(help="Benchmarks run through SOPs.", no_args_is_help=True, rich_markup_mode=None)


@bench_app.command("rollout")
def bench_rollout(
    variant: Annotated[
        list[str] | None,
        typer.Option(
            "--variant", help="Trainer overrides of one variant, a.b=v[,c.d=w]; '' is the baseline."
        ),
    ] = None,
    set_: o.SetOpt = None,
    worker: o.WorkerOpt = "all",
    dry_run: o.DryRunOpt = False,
    json: o.JsonOpt = False,
    force: o.ForceOpt = False,
    keep_going: o.KeepGoingOpt = False,
    parallel: o.ParallelOpt = None,
    vm: o.VmOpt = None,
    zone: o.ZoneOpt = None,
    project: o.ProjectOpt = None,
    host: o.HostOpt = None,
    hostkey: o.HostKeyOpt = None,
    user: o.UserOpt = None,
    identity: o.IdentityOpt = None,
    local: o.LocalOpt = False,
    local_workers: o.LocalWorkersOpt = 1,
    internal_ip: o.InternalIpOpt = False,
    api_endpoint: o.ApiEndpointOpt = None,
    tunnel_through_iap: o.TunnelOpt = False,
    no_key_push: o.NoKeyPushOpt = False,
    key_ttl: o.KeyTtlOpt = None,
    skip_fit: o.SkipFitOpt = False,
) -> None:
    """N GRPO steps per variant (same target, one after another), then step time and rollout_generate side by side.

    \b
    Examples:
      tpuops bench rollout --vm mllm-jax-v6e-8 --set steps=10 --variant '' --variant rollout.max_new_tokens=256
      tpuops bench rollout --local --set steps=4 --variant '' --variant 'rollout.temperature=0.7'
    """
    from tpuops.run import bench, launch, report

    finish_json(json)
    spec = o.target(
        vm=vm,
        zone=zone,
        project=project,
        host=host,
        hostkey=hostkey,
        user=user,
        identity=identity,
        local=local,
        local_workers=local_workers,
        internal_ip=internal_ip,
        api_endpoint=api_endpoint,
        tunnel_through_iap=tunnel_through_iap,
        no_key_push=no_key_push,
        key_ttl=key_ttl,
    )
    req = launch.RunRequest(
        sop="grpo", sets=o.parse_sets(set_), target=spec, worker=worker, force=force, keep_going=keep_going,
        parallel=parallel, skip_fit=skip_fit,
    )  # fmt: skip
    if dry_run:
        report.dry_runs(bench.plans(req, list(variant or [])), json)
        return
    results = bench.run(req, list(variant or []), on_line=None, on_step=None if json else report.step_done)
    report.rollout_bench(results, json)
    raise typer.Exit(0 if all(r.ok for r in results) else 1)
