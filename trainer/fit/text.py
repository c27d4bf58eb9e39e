"""The people's rendering of a fit result (tpuops renders the JSON with its own tables)."""

from __future__ import annotations

from typing import Any

GB = 1e9


def render(r: dict[str, Any]) -> str:
    head = (
        f"{r['config']} on {r['accelerator']} ({r['topology']}, {r['devices']} x {r['device_kind']}, "
        f"{r['hbm_bytes_per_device'] / GB:.1f} GB HBM per device; loss impl {r['impl']}, mesh {r['mesh']}, "
        f"rollout mesh {r['rollout_mesh']})"
    )
    if r.get("prompt_once_per", 1) > 1:
        head += f"\nupdate: each prompt's tokens run once per group of {r['prompt_once_per']} (train.shared_prompt)"
    rows = [f"{'phase':<13}{'args':>8}{'out':>8}{'temp':>8}{'resident':>9}{'peak':>8}{'headroom':>9}"
            f"{'TFLOP':>8}{'HBM GB':>8}{'coll GB':>8}{'bound s':>8}{'expected s':>12}{'compile':>8}  largest"]  # fmt: skip
    for name, p in r["phases"].items():
        rows.append(
            f"{name:<13}{p['argument_bytes'] / GB:>8.2f}{p['output_bytes'] / GB:>8.2f}{p['temp_bytes'] / GB:>8.2f}"
            f"{p['resident_bytes'] / GB:>9.2f}{p['peak_bytes'] / GB:>8.2f}{p['headroom']:>9.0%}"
            f"{p['flops'] / 1e12:>8.2f}{p['hbm_bytes'] / GB:>8.2f}{p['collective_bytes']['moved'] / GB:>8.2f}"
            f"{p['seconds']:>8.3f}{_range(p['expected_s']):>12}{p['compile_s']:>7.0f}s  {p['largest_term']}"
        )
    verdict = (
        f"fits: every phase has >= 10% headroom (tightest: {r['tightest_phase']}, {r['headroom']:.0%})"
        if r["fits"]
        else f"does not fit: {r['tightest_phase']} peak {r['phases'][r['tightest_phase']]['peak_bytes'] / GB:.1f} GB "
        f"> {r['usable_bytes_per_device'] / GB:.1f} GB usable"
        + (
            f"; --set {' --set '.join(r['fix']['set'])} fits (peak {r['fix']['peak_bytes'] / GB:.1f} GB)"
            if r["fix"]
            else ""
        )
        + "".join(f"; skipped --set {' --set '.join(k['set'])}: {k['why']}" for k in r.get("fix_skipped", []))
    )
    for name, p in r["phases"].items():
        if p.get("breakdown"):
            rows.append(f"{name}: HBM bytes per run by source")
            rows += [f"  {b['bytes'] / GB:>8.3f} GB {b['ops']:>5} ops  {b['source']}" for b in p["breakdown"]]
    auto = [f"remat auto: {r['remat_auto']['why']}"] if r.get("remat_auto") else []
    return "\n".join([head, *rows, verdict, *auto, *estimate_lines(r)])


def _range(pair: list[float]) -> str:
    return f"{pair[0]:.2f}-{pair[1]:.2f}"


def estimate_lines(r: dict[str, Any]) -> list[str]:
    """The step's bound and expected range, and where the expected range's efficiencies come from."""
    est = r["estimate"]
    lines = [
        f"bound: {est['bound_s']:.2f} s/step (every op at 100% of its roofline, collectives over the links they "
        f"use + 1 us per hop, host work {est.get('host_s', 0.0):.2f} s); largest phase {est['largest_phase']}",
        f"expected: {_range(est['expected_s'])} s/step (midpoint {est['expected_mid_s']:.2f} s) at documented "
        "efficiencies:",
    ]
    lines += [f"  {kind}: {e['low']:.0%}-{e['high']:.0%} of the roofline, {e['source']}"
              for kind, e in est["efficiency"].items()]  # fmt: skip
    return lines


def render_layouts(r: dict[str, Any]) -> str:
    """`python -m trainer.fit --layouts`: one row per decode layout, fastest expected first."""
    head = (
        f"{r['config']} on {r['accelerator']}: decode layouts (rollout.tp), the rollout programs "
        f"({', '.join(r['phases'])}) per step; the update does not depend on rollout.tp"
    )
    rows = [
        f"{'tp':>4}  {'rollout mesh':<22}{'fits':<6}{'headroom':>9}{'bound s':>9}{'expected s':>13}{'mid s':>8}"
    ]
    for x in r["layouts"]:
        m = x["rollout_mesh"]  # a tp group wider than the kv heads: (sequence splits x kv-head splits)
        pairs = f" ({m['tps']} x {m['tp']})" if m.get("tps", 1) > 1 else ""
        mesh = f"dp {m['dp']} x tp {m.get('tps', 1) * m['tp']}{pairs}"
        mark = "  (current)" if x["tp"] == r["current"] else ""
        rows.append(
            f"{x['tp']:>4}  {mesh:<22}{'yes' if x['fits'] else 'no':<6}{x['headroom']:>9.0%}"
            f"{x['bound_s']:>9.3f}{_range(x['expected_s']):>13}{x['expected_mid_s']:>8.2f}{mark}"
        )
    if r["best"] is None:
        verdict = "no layout fits"
    elif r["best"] == r["current"]:
        verdict = f"fastest: rollout.tp={r['best']}, the config's own"
    else:
        verdict = f"fastest: --set rollout.tp={r['best']} (the config has rollout.tp={r['current']})"
    return "\n".join([head, *rows, verdict])
