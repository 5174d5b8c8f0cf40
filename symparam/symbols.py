"""The shared vocabulary: every symbol, its LaTeX name, its meaning and the config keys it is read from."""

from __future__ import annotations

from dataclasses import dataclass

import ast
import operator
from collections.abc import Mapping
from typing import Any

import sympy as sp

from symparam.errors import SymparamError


@dataclass(frozen=True)
class SymbolDef:
    """One symbol of the vocabulary and where a Hugging Face config.json keeps its value."""

    name: str  # Python name, also the name used in recipes and `--set`
    latex: str  # how it prints in derivations
    meaning: str  # one phrase, used in tables of derivations
    keys: tuple[str, ...] = ()  # config.json keys, first present wins
    fallback: str | None = None  # formula over other symbols when no key is present


TABLE: tuple[SymbolDef, ...] = (
    SymbolDef("N", "N", "decoder layers", ("num_hidden_layers", "n_layer")),
    SymbolDef("V", "V", "vocabulary size", ("vocab_size",)),
    SymbolDef("d", "d", "hidden size", ("hidden_size", "n_embd")),
    SymbolDef("d_ff", "d_{ff}", "FFN inner size", ("intermediate_size", "n_inner"), "4*d"),
    SymbolDef("h", "h", "query heads", ("num_attention_heads", "n_head")),
    SymbolDef("h_kv", "h_{kv}", "key/value heads", ("num_key_value_heads",), "h"),
    SymbolDef("h_d", "h_d", "head dimension", ("head_dim",), "d/h"),
    SymbolDef("n", "n", "routed experts", ("num_experts", "num_local_experts", "n_routed_experts")),
    SymbolDef("k", "k", "experts per token", ("num_experts_per_tok",)),
    SymbolDef("d_moe", "d_{moe}", "expert FFN inner size", ("moe_intermediate_size",)),
    SymbolDef("n_s", "n_s", "shared experts", ("n_shared_experts",)),
    SymbolDef("N_dense", "N_{dense}", "dense (non-MoE) decoder layers; from the family's layer layout rule"),
    SymbolDef("P", "P", "learned positions", ("n_positions", "max_position_embeddings")),
    SymbolDef("r_q", "r_q", "query low-rank dimension (MLA)", ("q_lora_rank",)),
    SymbolDef("r_kv", "r_{kv}", "key/value latent dimension (MLA)", ("kv_lora_rank",)),
    SymbolDef("d_nope", "d_{nope}", "per-head query/key dimension without rotary (MLA)", ("qk_nope_head_dim",)),
    SymbolDef("d_rope", "d_{rope}", "per-head rotary query/key dimension (MLA)", ("qk_rope_head_dim",)),
    SymbolDef("d_v", "d_v", "per-head value dimension (MLA)", ("v_head_dim",)),
    SymbolDef("g", "g", "query heads per key/value head, h/h_kv"),
    SymbolDef("W", "W", "sliding attention window, in tokens", ("sliding_window",)),
    SymbolDef("N_swa", "N_{swa}", "decoder layers with sliding-window attention (derived from the recipe's rule)"),
    SymbolDef("S", "S", "tokens in context (sequence length)"),
    SymbolDef("B", "B", "sequences in a batch"),
    SymbolDef("b", "b", "bytes per stored value (by dtype)"),
)

BY_NAME: dict[str, SymbolDef] = {s.name: s for s in TABLE}
assert len(BY_NAME) == len(TABLE), "duplicate symbol name"

SYMBOLS: dict[str, sp.Symbol] = {
    s.name: sp.Symbol(s.name, integer=True, positive=True) for s in TABLE
}
LATEX_NAMES: dict[sp.Symbol, str] = {SYMBOLS[s.name]: s.latex for s in TABLE}

N, V, d, d_ff, h, h_kv, h_d = (SYMBOLS[x] for x in ("N", "V", "d", "d_ff", "h", "h_kv", "h_d"))
n, k, d_moe, n_s, N_dense, P = (SYMBOLS[x] for x in ("n", "k", "d_moe", "n_s", "N_dense", "P"))
r_q, r_kv, d_nope, d_rope, d_v, g = (SYMBOLS[x] for x in ("r_q", "r_kv", "d_nope", "d_rope", "d_v", "g"))
W, N_swa, S, B, b = (SYMBOLS[x] for x in ("W", "N_swa", "S", "B", "b"))


def symbol(name: str) -> sp.Symbol:
    """The canonical symbol called `name`; an unknown name is a SymparamError."""
    if name not in SYMBOLS:
        raise SymparamError(f"unknown symbol {name!r}; known: {', '.join(SYMBOLS)}")
    return SYMBOLS[name]


_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def parse(formula: str) -> sp.Expr:
    """A formula such as "4*d" or "d_moe*n_s" as an expression; only symbols, integers and + - * /."""

    def walk(node: ast.AST) -> sp.Expr:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            return _OPERATORS[type(node.op)](walk(node.left), walk(node.right))
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return sp.Integer(node.value)
        if isinstance(node, ast.Name):
            return symbol(node.id)
        raise SymparamError(f"formula {formula!r}: only symbols, integers and + - * / are allowed")

    try:
        tree = ast.parse(formula, mode="eval")
    except SyntaxError:
        raise SymparamError(f"formula {formula!r} is not a formula") from None
    return walk(tree.body)


def evaluate(expr: sp.Expr, values: Mapping[Any, int], what: str = "") -> int:
    """`expr` at `values` (keyed by symbol or name) as an exact int; a fraction is a SymparamError."""
    subs = {symbol(str(key)): sp.Integer(v) for key, v in values.items()}
    result = sp.sympify(expr).xreplace(subs)
    if not result.is_Integer:
        raise SymparamError(f"{what or expr}: {result} is not a whole number at these values")
    return int(result)


def latex(expr: sp.Expr) -> str:
    """LaTeX for an expression with the vocabulary's names (d_{ff}, h_{kv}, ...)."""
    return sp.latex(expr, symbol_names=LATEX_NAMES)


__all__ = ["TABLE", "BY_NAME", "SYMBOLS", "SymbolDef", "symbol", "parse", "evaluate", "latex"] + list(SYMBOLS)
