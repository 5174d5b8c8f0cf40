"""The shared vocabulary: every symbol, its LaTeX name, its meaning and the config keys it is read from."""

from __future__ import annotations

import ast
import functools
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import sympy as sp

from symparam.errors import SymparamError
from symparam.files import shown
from symparam.rules import syntax


@dataclass(frozen=True)
class SymbolDef:
    """One symbol of the vocabulary and where a Hugging Face config.json keeps its value."""

    name: str  # Python name, also the name used in recipes and `--set`
    latex: str  # how it prints in derivations
    meaning: str  # one phrase, used in tables of derivations
    keys: tuple[str, ...] = ()  # config.json keys (dotted for nested tables), first present wins
    fallback: str | None = None  # formula over other symbols (or an integer) when no key is present
    layers: str | None = None  # a layer-count symbol: the rule over layer index i that selects its layers
    zero: bool = False  # may be zero (a layer count, shared experts); other dimensions are positive
    zh: str = ""  # the meaning in Chinese, for derivations in zh
    each: str | None = None  # read per layer: a rule over the config and layer index i (a size that is listed per layer)
    over: str | None = None  # the layer-count symbol whose layers share the value read by `each` (default: every layer)
    routing: str | None = None  # a statistic of the batch's routing, not of the config: a rule over other symbols giving
    # the value figures take unless --set gives another (its largest, the most memory it can cost)
    summed: bool = False  # with `each`: the sum of its values over those layers, which may differ (a size that grows by layer)


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
    SymbolDef("n_s", "n_s", "shared experts", ("n_shared_experts",), zero=True),
    SymbolDef("N_dense", "N_{dense}", "dense (non-MoE) decoder layers", layers="False", zero=True),
    SymbolDef("P", "P", "learned positions", ("n_positions", "max_position_embeddings")),
    SymbolDef("r_q", "r_q", "query low-rank dimension (MLA)", ("q_lora_rank",)),
    SymbolDef("r_kv", "r_{kv}", "key/value latent dimension (MLA)", ("kv_lora_rank",)),
    SymbolDef("d_nope", "d_{nope}", "per-head query/key dimension without rotary (MLA)", ("qk_nope_head_dim",)),
    SymbolDef("d_rope", "d_{rope}", "per-head rotary query/key dimension (MLA)", ("qk_rope_head_dim",)),
    SymbolDef("d_v", "d_v", "per-head value dimension (MLA)", ("v_head_dim",)),
    SymbolDef("g", "g", "query heads per key/value head, h/h_kv"),
    SymbolDef("W", "W", "sliding attention window, in tokens", ("sliding_window",)),
    SymbolDef("N_swa", "N_{swa}", "decoder layers with sliding-window attention", layers="False", zero=True),
    SymbolDef("N_linear", "N_{linear}", "decoder layers with linear attention", layers="False", zero=True),
    SymbolDef("N_ssm", "N_{ssm}", "decoder layers with a state-space (Mamba) mixer", layers="False", zero=True),
    SymbolDef("h_lk", "h_{lk}", "linear-attention key heads", ("linear_num_key_heads",)),
    SymbolDef("d_lk", "d_{lk}", "linear-attention key head dimension", ("linear_key_head_dim",)),
    SymbolDef("h_lv", "h_{lv}", "linear-attention value heads", ("linear_num_value_heads",)),
    SymbolDef("d_lv", "d_{lv}", "linear-attention value head dimension", ("linear_value_head_dim",)),
    SymbolDef("d_conv", "d_{conv}", "convolution kernel size", ("conv_kernel", "linear_conv_kernel_dim")),
    SymbolDef("d_inner", "d_{in}", "state-space (Mamba) inner size", ("intermediate_size",)),
    SymbolDef("d_state", "d_{st}", "state-space (Mamba) state size per channel", ("state_size", "ssm_state_size")),
    SymbolDef("h_ssm", "h_{ssm}", "state-space (Mamba2) heads", ("num_heads", "mamba_n_heads")),
    SymbolDef("g_ssm", "g_{ssm}", "state-space (Mamba2) groups of B and C", ("n_groups", "mamba_n_groups")),
    SymbolDef("r_dt", "r_{\\Delta}", "time-step (dt) projection rank", ("time_step_rank",)),
    SymbolDef("S", "S", "tokens in context (sequence length)"),
    SymbolDef("B", "B", "sequences in a batch"),
    SymbolDef("b", "b", "bytes per stored value (by dtype)"),
)


def make(name: str) -> sp.Symbol:
    """The SymPy symbol called `name`: a positive integer (equal to every other symbol of that name)."""
    return sp.Symbol(name, integer=True, positive=True)


BY_NAME: dict[str, SymbolDef] = {}
SYMBOLS: dict[str, sp.Symbol] = {}
LATEX_NAMES: dict[sp.Symbol, str] = {}


def define(s: SymbolDef) -> sp.Symbol:
    """Add a symbol to the vocabulary (recipes add their own); the same name with another LaTeX name is an error."""
    known = BY_NAME.get(s.name)
    if known is not None and known.latex != s.latex:
        raise SymparamError(f"symbol {s.name!r}: LaTeX {s.latex!r} differs from its earlier definition {known.latex!r}")
    if known is None:
        BY_NAME[s.name] = s
        SYMBOLS[s.name] = make(s.name)
        LATEX_NAMES[SYMBOLS[s.name]] = s.latex
    return SYMBOLS[s.name]


for _s in TABLE:
    define(_s)

N, V, d, d_ff, h, h_kv, h_d = (SYMBOLS[x] for x in ("N", "V", "d", "d_ff", "h", "h_kv", "h_d"))
n, k, d_moe, n_s, N_dense, P = (SYMBOLS[x] for x in ("n", "k", "d_moe", "n_s", "N_dense", "P"))
r_q, r_kv, d_nope, d_rope, d_v, g = (SYMBOLS[x] for x in ("r_q", "r_kv", "d_nope", "d_rope", "d_v", "g"))
W, N_swa, S, B, b = (SYMBOLS[x] for x in ("W", "N_swa", "S", "B", "b"))


def symbol(name: str) -> sp.Symbol:
    """The symbol called `name`; a name no table defines is a SymparamError."""
    if name not in SYMBOLS:
        raise SymparamError(f"unknown symbol {name!r}; known: {', '.join(SYMBOLS)}")
    return SYMBOLS[name]


_OPERATORS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
}


class digits(sp.Function):
    """Decimal digits of a whole number (bitsandbytes writes a tensor's shape into its JSON quant_state)."""

    @classmethod
    def eval(cls, x: sp.Expr) -> sp.Expr | None:
        return sp.Integer(len(str(int(x)))) if x.is_Integer and x > 0 else None


FORMULA_FUNCTIONS: dict[str, Callable[[sp.Expr], sp.Expr]] = {
    "isqrt": lambda x: sp.floor(sp.sqrt(x)),  # Doge's retrieval experts: 2*isqrt(n) router rows
    "ceil": sp.ceiling,  # quantization formats: one scale per started block, ceil(d_out/128)
    "digits": digits,  # quantization formats: a shape written as text
}


MAX_VALUE = 2**63 - 1  # the largest value a symbol takes: PyTorch's sizes and counts are int64
MAX_EXPONENT = 8  # the largest n of x**n in a formula (the built-in recipes use 2)
MAX_DEGREE = 8  # the largest degree of a formula in its symbols, arguments put in (the built-in recipes reach 3)
MAX_BITS = 256  # bits of a constant a formula makes (2**8 is 9)
MAX_RESULT = 1_000  # bits of a value a formula is evaluated to (301 digits): a float holds every figure (GB, GiB)


def parse(formula: str | int, names: Mapping[str, sp.Expr] | None = None, known: Callable[[str], sp.Expr] = symbol) -> sp.Expr:
    """A formula such as "4*d" or "2*h_kv*h_d" as an expression: symbols (or `names`), integers and + - * / ** // %.
    Its size is bounded before anything is computed: the text, its nesting, exponents, constants and degree."""
    what = f"formula {shown(repr(formula))}"
    if type(formula) is int:
        return _constant(sp.Integer(formula), what)

    def walk(node: ast.AST) -> sp.Expr:
        if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Mod)) and right == 0:
                raise SymparamError(f"{what}: divides by zero")
            return _constant(_OPERATORS[type(node.op)](left, right), what)
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and isinstance(node.right, ast.Constant) and type(node.right.value) is int:
            if node.right.value > MAX_EXPONENT:
                raise SymparamError(f"{what}: an exponent of at most {MAX_EXPONENT}, not {shown(str(node.right.value))}")
            return _constant(walk(node.left) ** node.right.value, what)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -walk(node.operand)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            return _constant(sp.Integer(node.value), what)
        if isinstance(node, ast.Name):
            return names[node.id] if names is not None and node.id in names else known(node.id)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORMULA_FUNCTIONS and len(node.args) == 1 and not node.keywords:
            return FORMULA_FUNCTIONS[node.func.id](walk(node.args[0]))
        raise SymparamError(f"formula {formula!r}: only symbols, integers, + - * / ** // % and {', '.join(FORMULA_FUNCTIONS)}() are allowed")

    if not isinstance(formula, str):
        raise SymparamError(f"formula {formula!r}: expected a formula such as \"4*d\"")
    expr = walk(syntax(formula, what).body)
    if degree(expr) > MAX_DEGREE:
        raise SymparamError(f"{what}: of degree {degree(expr)} in its symbols; at most {MAX_DEGREE}")
    return expr


def _constant(expr: sp.Expr, what: str) -> sp.Expr:
    """`expr`, unless it is a number of more than MAX_BITS bits (in its numerator or denominator)."""
    if expr.is_Rational and max(abs(expr.p).bit_length(), expr.q.bit_length()) > MAX_BITS:
        raise SymparamError(f"{what}: makes a number of more than {MAX_BITS} bits")
    return expr


@functools.lru_cache(maxsize=4096)
def degree(expr: sp.Expr) -> int:
    """An upper bound on the total degree of `expr` in its symbols, read from its tree without expanding it (a quotient
    or a floor counts as a product: the bound is on how large its value can grow)."""
    if expr.is_Symbol:
        return 1
    if expr.is_Pow and expr.exp.is_Integer:
        return degree(expr.base) * abs(int(expr.exp))
    parts = [degree(a) for a in expr.args if isinstance(a, sp.Expr)]
    if expr.is_Add or isinstance(expr, (sp.Min, sp.Max)):
        return max(parts, default=0)
    return sum(parts)


def evaluate(expr: sp.Expr, values: Mapping[Any, int], what: str = "") -> int:
    """`expr` at `values` (keyed by symbol or name) as an exact int; a fraction, a division by zero or a value beyond
    MAX_RESULT bits is a SymparamError."""
    subs = {key if isinstance(key, sp.Symbol) else make(str(key)): sp.Integer(v) for key, v in values.items()}
    result = sp.sympify(expr).xreplace(subs)
    if not result.is_Integer:
        why = "divides by zero" if result.has(sp.zoo, sp.nan) else f"{shown(str(result))} is not a whole number"
        raise SymparamError(f"{what or shown(str(expr))}: {why} at these values")
    if abs(int(result)).bit_length() > MAX_RESULT:
        raise SymparamError(f"{what or shown(str(expr))}: more than {MAX_RESULT:,} bits at these values; no model is that large")
    return int(result)


def latex(expr: sp.Expr) -> str:
    """LaTeX for an expression with the vocabulary's names (d_{ff}, h_{kv}, ...)."""
    return sp.latex(expr, symbol_names=LATEX_NAMES)


__all__ = ["TABLE", "BY_NAME", "SYMBOLS", "SymbolDef", "define", "make", "symbol", "parse", "degree", "evaluate", "latex", "MAX_VALUE"] + [s.name for s in TABLE]
