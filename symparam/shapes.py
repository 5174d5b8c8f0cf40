"""Tensor shapes through one forward pass of S tokens, read from the recipe's options: symbolic, numbers by substitution."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sympy as sp

from symparam.config import as_subs
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.symbols import S, V, d, d_nope, d_rope, d_v, evaluate, h, h_d, h_kv, k, n, r_kv, r_q


@dataclass(frozen=True)
class Step:
    """One tensor of the forward pass (batch of one, so no batch axis)."""

    name: str  # "input embedding", "layer.q", "moe layer.router logits"
    shape: tuple[sp.Expr, ...]  # in the vocabulary's symbols
    note: str  # which module makes it, from what
    layers: sp.Expr | None = None  # how many layers repeat it; None for once per pass


def attention_steps(opts: dict[str, Any]) -> list[tuple[str, tuple, str]]:
    """Inside attention: projections, per-head q/k/v, scores, context and output; MLA through its latents."""
    if opts["kind"] == "mla":
        query = [("q latent", (S, r_q), "q_a_proj: d -> r_q, then its RMSNorm")] if opts["q_lora"] else []
        return query + [
            ("q", (S, h, d_nope + d_rope), "queries: h heads of d_nope + d_rope"),
            ("kv latent", (S, r_kv + d_rope), "kv_a_proj_with_mqa: the latent r_kv (what MLA caches) and one shared rotary key d_rope"),
            ("k", (S, h, d_nope + d_rope), "kv_b_proj lifts the latent to h keys of d_nope; the shared rotary key is appended"),
            ("v", (S, h, d_v), "kv_b_proj: h values of d_v"),
            ("scores", (h, S, S), "softmax(q k^T / sqrt(d_nope + d_rope)) under the causal mask"),
            ("attention context", (S, h, d_v), "scores @ v, per head"),
            ("attention output", (S, d), "o_proj: h*d_v -> d"),
        ]
    kv_heads = h if opts["kind"] == "mha" else h_kv
    width = 3 * d if opts["kind"] == "mha" else h * h_d + 2 * h_kv * h_d
    fused = [("qkv", (S, width), "one fused projection, split into q, k and v")] if opts["fused"] else []
    return fused + [
        ("q", (S, h, h_d), "queries: h heads of h_d"),
        ("k", (S, kv_heads, h_d), "keys: h_kv heads of h_d (each shared by h/h_kv query heads)"),
        ("v", (S, kv_heads, h_d), "values: h_kv heads of h_d"),
        ("scores", (h, S, S), "softmax(q k^T / sqrt(h_d)) per query head, causal mask (a sliding window masks more, same shape)"),
        ("attention context", (S, h, h_d), "scores @ v, per head"),
        ("attention output", (S, d), "o_proj: h*h_d -> d"),
    ]


def ffn_steps(kind: str, size: sp.Expr, fused: bool, prefix: str = "ffn") -> list[tuple[str, tuple, str]]:
    """Inside a feed-forward d -> size -> d: gated (gate, up, act(gate)*up) or plain (up, act)."""
    if kind == "plain":
        into = [(f"{prefix} up", (S, size), "up-projection d -> d_ff")]
    elif fused:
        into = [(f"{prefix} gate_up", (S, 2 * size), "fused gate and up projections, split in two")]
    else:
        into = [(f"{prefix} gate", (S, size), "gate projection"), (f"{prefix} up", (S, size), "up projection")]
    inner = "act(gate) * up" if kind == "gated" else "activation"
    return into + [(f"{prefix} inner", (S, size), inner), (f"{prefix} output", (S, d), "down-projection back to d")]


def moe_steps(opts: dict[str, Any]) -> list[tuple[str, tuple, str]]:
    """A mixture of experts: router logits, the k chosen experts, expert inner activations, shared experts."""
    pairs = [(name, (S * k, shape[1]), f"{note}; the S*k token-expert pairs, each expert seeing its share") for name, shape, note in ffn_steps(opts["kind"], opts["size"], False, "expert")[:-1]]
    steps = [("router logits", (S, n), "router: one logit per expert"), ("top-k experts", (S, k), "the k experts each token visits (indices and weights)"), *pairs]
    if opts["shared"] is not None:
        steps += ffn_steps(opts["kind"], opts["shared"], False, "shared expert")[-2:-1]
    return steps + [("moe output", (S, d), "weighted sum of the k experts' outputs (plus the shared experts)")]


def trace(model: Model) -> list[Step]:
    """Every tensor shape of one forward pass, symbolic; layers of one kind listed once with their count."""
    opts = model.recipe.resolved(model.flags)  # flags resolved and formulas parsed, as the parameter count sees them
    steps = [Step("token ids", (S,), "one integer per token"), Step("input embedding", (S, d), "rows of the [V, d] table")]
    if opts["embedding"]["positions"]:
        steps += [Step("position embedding", (S, d), "rows 0..S-1 of the [P, d] table"), Step("hidden", (S, d), "token + position")]
    groups = model.recipe.layer_groups()
    for kind, count in groups:
        prefix = "layer" if len(groups) == 1 else f"{kind} layer"
        ffn = ffn_steps(opts["ffn"]["kind"], opts["ffn"]["size"], opts["ffn"]["fused"]) if kind == "dense" else moe_steps(opts["moe"])
        inner = [("attention norm", (S, d), "norm before attention")] + attention_steps(opts["attention"]) + [("ffn norm", (S, d), "norm before the feed-forward")] + ffn
        steps += [Step(f"{prefix}.{name}", tuple(sp.sympify(x) for x in shape), note, count) for name, shape, note in inner]
    if opts["norm"]["final"]:
        steps.append(Step("final norm", (S, d), "norm after the last layer"))
    return steps + [Step("logits", (S, V), "LM head: one score per vocabulary entry per position"), Step("next-token logits", (V,), "the last position's row")]


def report(model: Model, seq: int) -> list[dict[str, Any]]:
    """The trace with numbers: each step's name, shape, symbolic shape, layer count and note."""
    if type(seq) is not int or seq < 1:
        raise SymparamError(f"--seq: expected a positive integer, got {seq!r}")
    values = {**model.substitution(), **as_subs(model.values or {}), S: sp.Integer(seq)}

    def number(x: sp.Expr) -> int:
        return evaluate(x, values, f"{model.name}: {x}")

    return [
        {"name": s.name, "shape": [number(x) for x in s.shape], "symbolic": [str(x) for x in s.shape], "layers": None if s.layers is None else number(s.layers), "note": s.note}
        for s in trace(model)
        if s.layers is None or number(s.layers) > 0
    ]


def text(steps: list[dict[str, Any]]) -> str:
    """One line per tensor: name, shape in numbers, shape in symbols, how many layers repeat it."""
    rows = [(s["name"], f"[{', '.join(f'{x:,}' for x in s['shape'])}]", f"[{', '.join(s['symbolic'])}]", "" if s["layers"] is None else f"x{s['layers']} layers") for s in steps]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    return "\n".join(f"{a:<{widths[0]}}  {b:<{widths[1]}}  {c:<{widths[2]}}  {e}".rstrip() for a, b, c, e in rows)


__all__ = ["Step", "trace", "report", "text"]
