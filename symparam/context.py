"""The context a pass runs in: S tokens, B sequences, and the layers that attend only within a window W.

Memory (the KV cache) and FLOPs (the attention term) both read it; it sits below both."""

from __future__ import annotations

import sympy as sp

from symparam.config import as_subs
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.symbols import B, N, N_swa, S, W


def slides(model: Model) -> bool:
    """Whether some layers of this model keep only a window: the recipe's rule, and the values if known."""
    if model.recipe.options.get("cache", {}).get("sliding", "none") == "none":
        return False
    return model.values is None or model.values.get("N_swa", 0) > 0


def attended(model: Model) -> sp.Expr:
    """Cached (and attended) positions summed over the layers: S in full layers, at most W in sliding ones."""
    return (N - N_swa) * S + N_swa * sp.Min(S, W) if slides(model) else N * S


def substitution(model: Model, seq: int | None, batch: int = 1) -> dict[sp.Symbol, sp.Integer]:
    """Every value of the model plus S (default: its maximum context), B, and the window where layers slide."""
    values = model.values or {}
    if seq is None:
        if "P" not in values:
            raise SymparamError("--seq: give the number of tokens (the config has no max_position_embeddings)")
        seq = values["P"]
    for option, given in (("--seq", seq), ("--batch", batch)):
        if type(given) is not int or given < 1:
            raise SymparamError(f"{option}: expected a positive integer, got {given!r}")
    subs = {**model.substitution(), **as_subs(values), N_swa: sp.Integer(values.get("N_swa", 0)), S: sp.Integer(seq), B: sp.Integer(batch)}
    if slides(model):
        if "W" not in values:
            raise SymparamError("sliding_window: missing (the window some layers attend within)")
        subs[W] = sp.Integer(values["W"])
    return subs


__all__ = ["slides", "attended", "substitution"]
