"""``tierstore plan`` output: rich tables for the terminal and a two-panel PNG."""

from __future__ import annotations

import sys

GIB = 1 << 30


def _gib(x: float) -> str:
    return f"{x / GIB:,.2f}"


def print_plan(plan: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    from tierstore.plan.engines import shell_lines

    con = Console(width=None if sys.stdout.isatty() else 160)
    g, inp, b = plan["geometry"], plan["inputs"], plan["budget"]
    con.print(
        f"[bold]{plan['model']}[/]: {g['moe_layers']} MoE layers (+{g['dense_layers']} "
        f"dense) x {g['n_experts']} experts, top-{g['top_k']}, hidden {g['hidden']}, "
        f"expert width {g['moe_intermediate']}, {g['attention']} attention"
        + (f", {g['mtp_layers']} MTP" if g["mtp_layers"] else ""),
        soft_wrap=True,
    )
    con.print(
        f"card {inp['card_gb']:g} GiB; {inp['max_seqs']} seq x {inp['context']} tokens, "
        f"{inp['spec_tokens']} spec tokens, KV {inp['kv_dtype']}; pool rows "
        f"{inp['expert_dtype']}, base {inp['base_dtype']}",
        soft_wrap=True,
    )
    t = Table(title="memory budget")
    for col, just in (("item", "left"), ("GiB", "right"), ("how", "left")):
        t.add_column(col, justify=just)
    for item in b["items"]:
        t.add_row(item["name"], _gib(item["bytes"]), item["note"])
    t.add_row(
        "[bold]card[/]",
        _gib(b["card"]),
        f"{_gib(b['left_over'])} GiB left over"
        if not b["deficit"]
        else f"[red]{_gib(b['deficit'])} GiB short[/]",
    )
    con.print(t)
    verdict = (
        "[green]holds[/]" if b["floor_holds"] else f"[red]does not hold: {b['short_slots']} slots short[/]"
    )
    con.print(
        f"fire floor: {b['floor']} slots ({_gib(b['floor'] * b['slot_bytes'])} GiB; "
        f"{b['floor_what']}); pool {b['pool_slots']} slots: {verdict}",
        soft_wrap=True,
    )
    for line in b["does_not_fit"]:
        con.print(f"[red]does not fit:[/] {line}", soft_wrap=True)
    if plan.get("curve"):
        _print_curve(con, plan["curve"])
    for key, title in (("vllm_moet", "vLLM-Moet"), ("vllm", "upstream vLLM (--quantization tierstore)")):
        s = plan["settings"][key]
        con.print(f"\n[bold]{title}[/]")
        for line in shell_lines(s, plan["model"]):
            con.print(line, soft_wrap=True, markup=False, highlight=False)
        for note in s["notes"]:
            con.print(f"  # {note}", soft_wrap=True, markup=False)


def _print_curve(con, c: dict) -> None:
    from rich.table import Table

    policies = sorted({r["policy"] for r in c["results"]} - {"belady"}) + ["belady"]
    by = {(r["policy"], r["slots"]): r for r in c["results"]}
    key = f"{c['view']}_hit_rate"
    rec = c["recommended"] or {}
    t = Table(title=f"{c['trace']}: {c['view']} hit rate vs pool (MIN = belady; other view in --json)")
    t.add_column("slots", justify="right")
    if c["scale"] != 1:
        t.add_column("model slots", justify="right")
    for p in policies:
        t.add_column("MIN" if p == "belady" else p, justify="right")
    for s in sorted({r["slots"] for r in c["results"] if r["on_grid"] or r["slots"] == rec.get("slots")}):
        mark = " <" if s == rec.get("slots") else ""
        row = [f"{s}{mark}"] + ([str(int(round(s * c["scale"])))] if c["scale"] != 1 else [])
        row += [f"{by[(p, s)][key]:.3f}" if (p, s) in by else "" for p in policies]
        t.add_row(*row)
    con.print(t)
    if c["scale"] != 1:
        con.print(
            f"the trace has {c['trace_keys']} keys, the model {c['model_keys']}: pools "
            f"mapped by share of experts (x{c['scale']:.3g})",
            soft_wrap=True,
        )
    if rec:
        con.print(
            f"[bold]recommended:[/] {rec['model_slots']} slots, policy {rec['policy']} "
            f"({c['view']} hit {rec['hit_rate']:.3f}; MIN {rec['min_hit_rate']:.3f}; the "
            f"largest pool that fits gets {rec['top_hit_rate']:.3f}; tolerance "
            f"{c['tolerance']:g})"
            + (
                f" -- raised to the fire floor from {int(round(rec['knee_slots'] * c['scale']))}"
                if rec["raised_to_floor"]
                else ""
            ),
            soft_wrap=True,
        )
        if rec["model_slots"] < c["feasible_slots"] * c["scale"] - 1:
            con.print(
                f"the settings below use it; the {int(c['feasible_slots'] * c['scale'])} "
                f"slots that fit would add {rec['top_hit_rate'] - rec['hit_rate']:.3f} of "
                f"hit rate: the difference can go to KV cache (--context)",
                soft_wrap=True,
            )
    else:
        con.print("[red]no pool fits the card: nothing to recommend[/]")


def plot(plan: dict, path: str) -> None:
    """PNG: the budget as a stacked bar; with a curve, hit rate vs pool (both views)."""
    import matplotlib

    matplotlib.use("Agg")
    from pathlib import Path

    import matplotlib.pyplot as plt

    from tierstore.files.atomic import write_atomic_with

    c = plan.get("curve")
    fig, axes = plt.subplots(1, 3 if c else 1, figsize=(15 if c else 6, 5), squeeze=False)
    ax = axes[0][0]
    b = plan["budget"]
    bottom = 0.0
    for item in b["items"]:
        ax.bar(0, item["bytes"] / GIB, bottom=bottom, label=f"{item['name']} {item['bytes'] / GIB:.1f}")
        bottom += item["bytes"] / GIB
    ax.axhline(b["card"] / GIB, color="k", linestyle="--", label=f"card {b['card'] / GIB:.1f}")
    ax.axhline(
        (b["card"] - b["pool_bytes"] + b["floor"] * b["slot_bytes"]) / GIB
        if b["pool_bytes"]
        else b["floor"] * b["slot_bytes"] / GIB,
        color="r",
        linestyle=":",
        label=f"pool at the floor ({b['floor']} slots)",
    )
    ax.set_xticks([])
    ax.set_ylabel("GiB")
    ax.set_title(f"{plan['model']}: memory budget", fontsize=9)
    ax.legend(fontsize=7, loc="lower right")
    if c:
        rec = c["recommended"] or {}
        for ax, view in ((axes[0][1], "latency"), (axes[0][2], "bandwidth")):
            for p in sorted({r["policy"] for r in c["results"]}):
                pts = sorted((r for r in c["results"] if r["policy"] == p), key=lambda r: r["slots"])
                ax.plot(
                    [r["model_slots"] for r in pts],
                    [r[f"{view}_hit_rate"] for r in pts],
                    "--" if p == "belady" else "-",
                    marker="o",
                    markersize=3,
                    label="MIN" if p == "belady" else p,
                )
            if rec:
                ax.axvline(
                    rec["model_slots"], color="g", linestyle=":", label=f"recommended {rec['model_slots']}"
                )
            ax.axvline(b["floor"], color="r", linestyle=":", label=f"fire floor {b['floor']}")
            ax.set_xscale("log")
            ax.set_ylim(0, 1)
            ax.set_xlabel("pool slots (model)")
            ax.set_ylabel(f"{view} view hit rate")
            ax.set_title(f"{c['trace']}: {view} view", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=7)
    fig.tight_layout()
    write_atomic_with(Path(path), lambda f: fig.savefig(f, format="png", dpi=110))
    plt.close(fig)
