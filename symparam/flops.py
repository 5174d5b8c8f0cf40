"""FLOPs per token: 2 x the active matmul parameters plus the attention term that grows with context; training ~3x."""

from __future__ import annotations

from fractions import Fraction
from typing import Any

import sympy as sp

from symparam.components import leaves, rows
from symparam.context import holders, substitution
from symparam.figures import decimal
from symparam.model import Model
from symparam.errors import SymparamError
from symparam.symbols import S

TRAINING_FACTOR = 3  # backward ~ 2 x forward (gradients with respect to activations and to weights)
CONVENTION = (
    "one multiply-add = 2 FLOPs; forward per token = 2 x matmul parameters the token uses (input embedding is a lookup; "
    "norms, biases and sinks are not matmuls; a tied LM head still multiplies) + 2 x (q.k width + value width) per attended "
    "position per layer, for a token attending to S positions (a causal sequence of S averages (S+1)/2); "
    "softmax, activations, convolutions and recurrent state updates left out; training ~ 3 x forward"
)


def matmul_parameters(model: Model, active: bool = True) -> sp.Expr:
    """Weights of the matrix multiplications one token passes through (all experts if not `active`), each as often as
    its module runs per input token (BLT's global model once per patch of p bytes: S/p rows for S tokens)."""
    per_token = {id(node): here / S for node, here in rows(model.tree)}
    return sp.expand(sum(
        (copies * sp.Mul(*leaf.shape) * per_token[id(leaf)] for leaf, copies, _, _ in leaves(model.tree, active)
         if len(leaf.shape) == 2 and leaf.matmul and not (leaf.lookup or leaf.buffer)),
        sp.Integer(0),
    ))


def attention(model: Model) -> sp.Expr:
    """Scores q.k and the weighted sum of values, 2 FLOPs per multiply-add, over every attended position of every layer."""
    return 2 * sp.Add(*((sp.sympify(h.fact["qk"]) + sp.sympify(h.fact["v"])) * h.positions() for h in holders(model, "attend")))


def forward(model: Model) -> sp.Expr:
    """Forward FLOPs for one token attending to S positions: 2*M + A."""
    return 2 * matmul_parameters(model) + attention(model)


def training(model: Model) -> sp.Expr:
    """Training FLOPs for one token: forward and backward, TRAINING_FACTOR x forward."""
    return TRAINING_FACTOR * forward(model)


def report(model: Model, seq: int | None = None) -> dict[str, Any]:
    """Forward and training FLOPs per token at context `seq` (default: the model's maximum context), with formulas."""
    model.needs_active("FLOPs per token")
    subs = substitution(model, seq)
    seq = int(subs[S])

    def exact(expr: sp.Expr) -> int | str:
        """An exact figure: an int, or "p/q" where a module runs on other positions than S (CPM-Ant's prompt)."""
        value = sp.sympify(expr).xreplace(subs)
        if not value.is_Rational:
            raise SymparamError(f"{model.name}: {expr} has no value here ({value})")
        return int(value) if value.is_Integer else f"{value.p}/{value.q}"

    params = exact(matmul_parameters(model))
    return {
        "name": model.name,
        "family": model.recipe.family,
        "seq": seq,
        "matmul_parameters": params,
        "matmul_parameters_all_experts": exact(matmul_parameters(model, active=False)),
        "matmul_flops": exact(2 * matmul_parameters(model)),
        "attention_flops": exact(attention(model)),
        "forward_flops_per_token": exact(forward(model)),
        "training_flops_per_token": exact(training(model)),
        "formulas": {
            "forward": "2*M + A",
            "M": str(matmul_parameters(model)),
            "A": str(attention(model)),
            "training": f"{TRAINING_FACTOR}*(2*M + A)",
        },
        "convention": CONVENTION,
    }


def text(r: dict[str, Any]) -> str:
    """The report as labelled lines: the formula, then its terms and totals in FLOPs and GFLOPs."""
    f = r["formulas"]
    rows = [
        ("M  matmul parameters per token", r["matmul_parameters"], f["M"]),
        ("2M matmul FLOPs", r["matmul_flops"], "2*M"),
        ("A  attention FLOPs", r["attention_flops"], f["A"]),
        ("forward FLOPs per token", r["forward_flops_per_token"], f["forward"]),
        ("training FLOPs per token", r["training_flops_per_token"], f["training"]),
    ]
    lines = [f"{r['name']} ({r['family']}): FLOPs per token attending to S = {r['seq']:,} positions"]
    shown = lambda v: f"{v:,}" if isinstance(v, int) else decimal(Fraction(v))  # noqa: E731
    lines += [f"{label:<31} {shown(value):>22}  ({decimal(Fraction(value) / 10**9)} G)  = {formula}" for label, value, formula in rows]
    if r["matmul_parameters_all_experts"] != r["matmul_parameters"]:
        lines.append(f"(all experts: {shown(r['matmul_parameters_all_experts'])} matmul parameters; one token uses M)")
    return "\n".join(lines + ["convention: " + r["convention"]])


__all__ = ["matmul_parameters", "attention", "forward", "training", "report", "text"]
