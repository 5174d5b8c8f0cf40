"""The catalog of published models for `symparam list`: each preset's Hub id, series, family, total and active.

Counting 40-odd presets takes seconds, so `symparam docs` writes the figures to presets/_index.json and `list` reads
them; `docs --check` and the tests recompute them, so the file cannot drift from the recipes."""

from __future__ import annotations

import json
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from symparam.config import catalog, presets
from symparam.errors import SymparamError
from symparam.model import load

INDEX = "_index.json"


def entry(name: str) -> dict[str, Any]:
    """One preset: its Hub id and series, and its family, total and active, or why it cannot be counted yet."""
    out: dict[str, Any] = {"name": name, **catalog().get(name, {})}
    try:
        model = load(name)
        count = model.count()
    except SymparamError as e:
        return out | {"unsupported": str(e)}
    return out | {"family": model.recipe.family, "title": model.recipe.title, "total": count.total, "active": count.active}


@cache
def compute() -> str:
    """The index as JSON text: every preset's entry, in preset order."""
    return json.dumps([entry(name) for name in presets()], indent=1) + "\n"


def index_path() -> Path:
    return Path(str(resources.files("symparam").joinpath("presets", INDEX)))


def index() -> list[dict[str, Any]]:
    """The entries as `symparam docs` last wrote them."""
    try:
        return json.loads(index_path().read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SymparamError(f"{index_path()}: missing; run `symparam docs` in a checkout") from None


def by_family(entries: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Entries grouped by family (largest family first by name order), those not countable yet under None."""
    groups: dict[str, list[dict[str, Any]]] = {}
    for e in sorted(entries, key=lambda e: (e.get("family") is None, e.get("family") or "", e.get("total") or 0)):
        groups.setdefault(e.get("family"), []).append(e)
    return groups


def text(entries: list[dict[str, Any]]) -> str:
    """Presets grouped by family: name, Hub id, total and active (in B); unsupported ones in one line each."""
    from symparam.figures import scaled

    width = max(len(e["name"]) for e in entries)
    hub = max(len(e.get("hub", "")) for e in entries)
    lines = ["presets (--model NAME or Hub id), by family:"]
    for family, group in by_family(entries).items():
        lines.append(f"  {family or 'not supported yet'}")
        for e in group:
            if "unsupported" in e:
                lines.append(f"    {e['name']:<{width}}  {e.get('hub', ''):<{hub}}  {e['unsupported']}")
                continue
            active = f"  active {scaled(e['active'])}" if e["active"] not in (None, e["total"]) else ""
            lines.append(f"    {e['name']:<{width}}  {e.get('hub', ''):<{hub}}  total {scaled(e['total'])}{active}".rstrip())
    return "\n".join(lines)


__all__ = ["INDEX", "entry", "compute", "index", "index_path", "by_family", "text"]
