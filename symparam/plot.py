"""Charts of parameter distribution: across a family's presets (absolute and %) and one model's breakdown; matplotlib loaded lazily."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from symparam.catalog import index
from symparam.config import catalog
from symparam.errors import SymparamError
from symparam.files import replacing
from symparam.model import Count, Model, load
from symparam.recipes import REGISTRY

FORMATS = (".png", ".svg", ".pdf")
# Component buckets take colours in the order they first appear in a chart (matplotlib's tab20 order).
PALETTE = ("#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78", "#2ca02c", "#98df8a", "#d62728", "#ff9896", "#9467bd", "#c5b0d5",
           "#8c564b", "#c49c94", "#e377c2", "#f7b6d2", "#7f7f7f", "#c7c7c7", "#bcbd22", "#dbdb8d", "#17becf", "#9edae5")


def colours(used: list[str]) -> dict[str, str]:
    """One colour per component of a chart, in order (the palette repeats past 20 components)."""
    return {c: PALETTE[i % len(PALETTE)] for i, c in enumerate(used)}


def family_models(name: str) -> tuple[str, list[Model]]:
    """A title and the presets to compare, smallest first: a catalog series (qwen3: every published Qwen3 size, dense
    and MoE), else the presets of one recipe family."""
    series = [p for p, entry in catalog().items() if entry.get("series") == name.lower()]
    if series:
        return f"{name}: parameter distribution across the published sizes", sorted((load(p) for p in series), key=lambda m: m.count().total)
    recipe = REGISTRY.family(name)
    names = [e["name"] for e in index() if e.get("family") == recipe.family]
    if not names:
        raise SymparamError(f"family {recipe.family}: no presets to compare; try --model NAME")
    return f"{recipe.title}: parameter distribution across sizes", sorted((load(p) for p in names), key=lambda m: m.count().total)


def bars(models: list[Model]) -> list[tuple[str, dict[str, int]]]:
    """(label, component -> parameters) per bar: a dense model's total; an MoE model's total and active side by side."""
    out = []
    for m in models:
        c: Count = m.count()
        if c.active not in (None, c.total):  # total and active side by side (a config without k: its total alone)
            out += [(f"{m.name}\ntotal", c.components), (f"{m.name}\nactive", c.active_components)]
        else:
            out.append((m.name, c.components))
    return out


def human(n: int) -> str:
    """A parameter count in B (10^9), M (10^6) or K (10^3)."""
    for unit, size in (("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return str(n)


def share(part: int, whole: int) -> str:
    pct = 100 * part / whole
    return "<0.01%" if pct < 0.01 else f"{pct:.2g}%"


def _figure(width: float, height: float):
    from matplotlib.figure import Figure  # lazily: the library works without matplotlib loaded

    return Figure(figsize=(width, height), dpi=110, layout="constrained")


def _used(rows: list[tuple[str, dict[str, int]]]) -> list[str]:
    """The components with parameters in any bar, in the order they first appear."""
    return list(dict.fromkeys(c for _, r in rows for c, n in r.items() if n))


def family_figure(models: list[Model], title: str):
    """As document 003 draws a family: dense models in one row, MoE models (total and active side by side) in another;
    each row stacked parameters in billions per model, and the same as % of each bar."""
    groups = [g for g in ([m for m in models if not _moe(m)], [m for m in models if _moe(m)]) if g]
    used = _used([r for g in groups for r in bars(g)])
    colour = colours(used)
    widest = max(len(bars(g)) for g in groups)
    fig = _figure(max(8.0, 1.6 * widest + 4), 5.0 * len(groups) + 0.6)
    panels = fig.subplots(len(groups), 2, squeeze=False)
    for (absolute, percent), group in zip(panels, groups):
        _bar_row(absolute, percent, bars(group), used, colour, "MoE, total and active" if _moe(group[0]) else "dense")
    handles, labels = panels[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(used), 5), frameon=False)
    fig.suptitle(title)
    return fig


def _moe(model: Model) -> bool:
    c = model.count()
    return c.active not in (None, c.total)


def _bar_row(absolute, percent, rows: list[tuple[str, dict[str, int]]], used: list[str], colour: dict[str, str], kind: str) -> None:
    """One row of a family figure: stacked absolute parameters and their percentages, one bar per model (or two)."""
    x = range(len(rows))
    for ax, scale in ((absolute, None), (percent, 100)):
        bottom = [0.0] * len(rows)
        for comp in used:
            heights = [r.get(comp, 0) / (1e9 if scale is None else sum(r.values()) / scale) for _, r in rows]
            ax.bar(x, heights, bottom=bottom, color=colour[comp], label=comp, width=0.7, edgecolor="white", linewidth=0.5)
            if scale is not None:
                for i, (hgt, base) in enumerate(zip(heights, bottom)):
                    if hgt >= 6:
                        ax.text(i, base + hgt / 2, f"{hgt:.0f}%", ha="center", va="center", fontsize=8, color="white")
            bottom = [b + hh for b, hh in zip(bottom, heights)]
        ax.set_xticks(list(x), [label for label, _ in rows], fontsize=8, rotation=30, ha="right", rotation_mode="anchor")
        ax.grid(axis="y", alpha=0.3)
        ax.set_axisbelow(True)
    for i, (_, r) in enumerate(rows):
        absolute.text(i, sum(r.values()) / 1e9, f"{sum(r.values()) / 1e9:.2f} B", ha="center", va="bottom", fontsize=8)
    absolute.set_ylabel("parameters (billions, 10⁹)")
    absolute.set_title(f"{kind}: parameters by component")
    absolute.margins(y=0.1)
    percent.set_ylabel("share of the bar's parameters (%)")
    percent.set_ylim(0, 100)
    percent.set_title(f"{kind}: share by component (%)")


def model_figure(model: Model):
    """One model: a horizontal bar per component with its count and share; MoE models show total and active."""
    c = model.count()
    moe = c.active not in (None, c.total)
    used = [k for k, n in c.components.items() if n]
    colour = colours(used)
    fig = _figure(10, 0.42 * len(used) * (2 if moe else 1) + 1.6)
    ax = fig.subplots()
    series = [("total", c.components, c.total)] + ([("active", c.active_components, c.active)] if moe else [])
    height = 0.8 / len(series)
    for j, (label, values, whole) in enumerate(series):
        ys = [i + j * height for i in range(len(used))]
        widths = [values.get(k, 0) / 1e9 for k in used]
        ax.barh(ys, widths, height=height, color=[colour[k] for k in used], alpha=1.0 if j == 0 else 0.55, edgecolor="black" if j else "white", hatch="//" if j else None, label=label)
        for y, k, w in zip(ys, used, widths):
            ax.text(w, y, f" {human(values.get(k, 0))} ({share(values.get(k, 0), whole)} of {label})", va="center", fontsize=8)
    ax.set_yticks([i + height * (len(series) - 1) / 2 for i in range(len(used))], used)
    ax.invert_yaxis()
    ax.set_xscale("log")  # components span six orders of magnitude: norms next to experts
    ax.set_xlabel("parameters (billions, 10⁹; log scale)")
    ax.set_xlim(min(values.get(k, 0) for _, values, _ in series for k in used if values.get(k, 0)) / 1e9 / 3, max(c.components.values()) / 1e9 * 12)
    ax.grid(axis="x", alpha=0.3)
    ax.set_axisbelow(True)
    heading = f"{model.name}: {human(c.total)} parameters" + (f", {human(c.active)} active per token" if moe else "")
    if c.active is None:
        heading += f"\n(active per token unknown: the config does not set {', '.join(model.unknown.values())})"
    if model.flags.get("tied"):
        heading += "\n(LM head tied to the input embedding: stored once)"
    ax.set_title(heading)
    if moe:
        ax.legend(loc="lower right", title="bars")
    return fig


def save(fig: Any, output: str | Path) -> Path:
    """Write the figure to `output` atomically (symparam.files): no half-written files."""
    path = Path(output)
    if path.suffix.lower() not in FORMATS:
        raise SymparamError(f"-o {output}: expected a file ending in {', '.join(FORMATS)}")
    with replacing(path) as f:
        fig.savefig(f, format=path.suffix[1:].lower())
    return path


def plot_family(name: str, output: str | Path) -> dict[str, Any]:
    title, models = family_models(name)
    path = save(family_figure(models, title), output)
    return {"output": str(path), "family": name, "models": [m.name for m in models]}


def plot_model(model: Model, output: str | Path) -> dict[str, Any]:
    path = save(model_figure(model), output)
    return {"output": str(path), "model": model.name}


__all__ = ["family_models", "family_figure", "model_figure", "save", "plot_family", "plot_model"]
