"""Components as small pure functions returning Term trees of SymPy expressions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import sympy as sp

from symparam.symbols import V, P, d, h, h_kv, h_d, n, k, r_q, r_kv, d_nope, d_rope, d_v

ZERO = sp.Integer(0)
ONE = sp.Integer(1)

# Breakdown buckets in the order tables list them.
COMPONENTS = (
    "input embedding",
    "position embedding",
    "attention",
    "dense FFN",
    "router",
    "routed experts",
    "shared experts",
    "norms",
    "final norm",
    "LM head",
)
EMBEDDINGS = ("input embedding", "position embedding")


@dataclass(frozen=True)
class Term:
    """A node of a model: one tensor (a leaf) or a group of terms repeated `times` times."""

    key: str  # module path segment as transformers names it: "q_proj", "weight", "layers"
    label: str  # what a derivation calls it: "W_Q", "query projection"
    note: str = ""  # the derivation comment: which matrix, which shape
    shape: tuple[sp.Expr, ...] = ()  # a leaf's tensor shape; empty for a group
    children: tuple[Term, ...] = ()
    times: sp.Expr = ONE  # copies of the children: N layers, n experts
    active_times: sp.Expr = ONE  # copies one token visits: k of n experts
    component: str | None = None  # breakdown bucket, inherited by the subtree
    tied: bool = False  # a tensor shared with another (a tied LM head): counted once, elsewhere

    @property
    def is_leaf(self) -> bool:
        return not self.children

    @property
    def each(self) -> sp.Expr:
        """Parameters in one copy: a tensor's elements, or the sum over the children."""
        if self.is_leaf:
            return ZERO if self.tied else sp.Mul(*self.shape)
        return sp.Add(*(c.expr for c in self.children))

    @property
    def expr(self) -> sp.Expr:
        """Parameters in this node, all copies included."""
        return self.times * self.each

    @property
    def active(self) -> sp.Expr:
        """Parameters of this node one token uses."""
        if self.is_leaf:
            return self.active_times * self.each
        return self.active_times * sp.Add(*(c.active for c in self.children))


def tensor(key: str, label: str, shape: Iterable[sp.Expr], note: str = "", **kw) -> Term:
    """A leaf: one parameter tensor of the given shape."""
    return Term(key=key, label=label, note=note, shape=tuple(sp.sympify(s) for s in shape), **kw)


def group(key: str, label: str, children: Iterable[Term], times=ONE, active_times=None, **kw) -> Term:
    """A module made of terms, optionally repeated (layers, experts)."""
    times = sp.sympify(times)
    active_times = times if active_times is None else sp.sympify(active_times)
    return Term(key=key, label=label, children=tuple(children), times=times, active_times=active_times, **kw)


def linear(key: str, label: str, d_out, d_in, bias: bool, note: str = "") -> Term:
    """nn.Linear(d_in, d_out): weight [d_out, d_in] and an optional bias [d_out]."""
    weight = tensor("weight", f"W_{{{label}}}", (d_out, d_in), note)
    parts = [weight] + ([tensor("bias", f"b_{{{label}}}", (d_out,), f"bias of {note or key}")] if bias else [])
    return group(key, label, parts)


def norm(key: str, kind: str, dim, note: str) -> Term:
    """RMSNorm (a scale gamma) or LayerNorm (gamma and beta) over `dim` features."""
    parts = [tensor("weight", r"\gamma", (dim,), f"{note}: scale")]
    if kind == "layer":
        parts.append(tensor("bias", r"\beta", (dim,), f"{note}: shift"))
    return group(key, f"{kind}norm", parts)


def embedding(positions: bool) -> list[Term]:
    """The token table [V, d], and a learned position table [P, d] where the family has one."""
    terms = [tensor("embed_tokens", "E", (V, d), "token embedding table, one row of d per token", component="input embedding")]
    if positions:
        terms.append(tensor("wpe", "E_{pos}", (P, d), "learned position table, one row of d per position", component="position embedding"))
    return terms


def attention(kind: str, qkv_bias: bool, o_bias: bool, qk_norm: str, sinks: bool, fused: bool, q_lora: bool) -> Term:
    """Self-attention: multi-head (d x d), grouped-query (h, h_kv, h_d) or multi-head latent (MLA)."""
    if kind == "mla":
        return _latent_attention(qkv_bias, q_lora)
    q_dim, kv_dim = (d, d) if kind == "mha" else (h * h_d, h_kv * h_d)
    if fused:
        parts = [linear("qkv_proj", "QKV", q_dim + 2 * kv_dim, d, qkv_bias, "W_Q, W_K and W_V stacked")]
    else:
        parts = [
            linear("q_proj", "Q", q_dim, d, qkv_bias, "W_Q: h query heads of h_d"),
            linear("k_proj", "K", kv_dim, d, qkv_bias, "W_K: h_kv key heads of h_d"),
            linear("v_proj", "V", kv_dim, d, qkv_bias, "W_V: h_kv value heads of h_d"),
        ]
    parts.append(linear("o_proj", "O", d, q_dim, o_bias, "W_O: heads back to d"))
    if qk_norm != "none":
        # "full" (OLMoE) normalises whole projections, sized by transformers from d: d for q, h_kv heads of d/h for k.
        q_norm, k_norm = (h_d, h_d) if qk_norm == "head" else (d, d * h_kv / h)
        parts += [norm("q_norm", "rms", q_norm, "query norm"), norm("k_norm", "rms", k_norm, "key norm")]
    if sinks:
        parts.append(tensor("sinks", "s", (h,), "one attention-sink logit per query head"))
    return group("self_attn", "attention", parts, component="attention")


def _latent_attention(bias: bool, q_lora: bool) -> Term:
    """DeepSeek MLA: low-rank queries (optional), a shared key/value latent of r_kv plus a rotary key."""
    q_head = d_nope + d_rope
    if q_lora:
        query = [
            linear("q_a_proj", "Q_a", r_q, d, bias, "query down-projection to r_q"),
            norm("q_a_layernorm", "rms", r_q, "query latent norm"),
            linear("q_b_proj", "Q_b", h * q_head, r_q, False, "query up-projection, h heads of d_nope + d_rope"),
        ]
    else:
        query = [linear("q_proj", "Q", h * q_head, d, False, "W_Q: h heads of d_nope + d_rope")]
    parts = query + [
        linear("kv_a_proj_with_mqa", "KV_a", r_kv + d_rope, d, bias, "key/value latent r_kv and one shared rotary key d_rope"),
        norm("kv_a_layernorm", "rms", r_kv, "key/value latent norm"),
        linear("kv_b_proj", "KV_b", h * (d_nope + d_v), r_kv, False, "latent up to h keys of d_nope and h values of d_v"),
        linear("o_proj", "O", d, h * d_v, bias, "W_O: h values of d_v back to d"),
    ]
    return group("self_attn", "attention", parts, component="attention")


def ffn(kind: str, size: sp.Expr, bias: bool, fused: bool, key: str = "mlp", component: str = "dense FFN") -> Term:
    """Feed-forward d -> size -> d: gated (SwiGLU: gate, up, down) or plain (up, down)."""
    if kind == "plain":
        parts = [linear("up_proj", "up", size, d, bias, "up-projection d -> d_ff"), linear("down_proj", "down", d, size, bias, "down-projection d_ff -> d")]
    elif fused:
        parts = [linear("gate_up_proj", "gate,up", 2 * size, d, bias, "gate and up projections stacked"), linear("down_proj", "down", d, size, bias, "down-projection")]
    else:
        parts = [
            linear("gate_proj", "gate", size, d, bias, "gate projection d -> d_ff"),
            linear("up_proj", "up", size, d, bias, "up projection d -> d_ff"),
            linear("down_proj", "down", d, size, bias, "down projection d_ff -> d"),
        ]
    return group(key, "feed-forward", parts, component=component)


def moe(kind: str, size: sp.Expr, bias: bool, router_bias: bool, shared: sp.Expr | None, shared_bias: bool = False) -> Term:
    """Mixture of experts: a router over n experts, k of them per token, and optional shared experts (own bias switch)."""
    router = linear("gate", "router", n, d, router_bias, "router: one logit per expert")
    expert = ffn(kind, size, bias, fused=False, key="expert", component="routed experts")
    parts = [group("gate", "router", [router], component="router"), group("experts", "routed experts", [expert], times=n, active_times=k, component="routed experts")]
    if shared is not None:
        parts.append(ffn(kind, shared, shared_bias, fused=False, key="shared_experts", component="shared experts"))
    return group("mlp", "mixture of experts", parts)


def decoder_layers(key: str, label: str, count: sp.Expr, norm_kind: str, norms: int, attn: Term, mlp: Term) -> Term:
    """`count` identical decoder layers: their norms, attention and FFN or MoE."""
    layer_norms = [norm(f"norm_{i}", norm_kind, d, "per-layer norm") for i in range(norms)]
    return group(key, label, [group("norms", "norms", layer_norms, component="norms"), attn, mlp], times=count)


def head(tied: bool, final_norm: str | None) -> list[Term]:
    """The final norm (if any) and the LM head [V, d]; a tied head reuses the embedding table."""
    terms = [group("norm", "final norm", [norm("norm", final_norm, d, "final norm")], component="final norm")] if final_norm else []
    note = "tied to the token embedding: stored once" if tied else "LM head: one row of d per token"
    return terms + [tensor("lm_head", "W_{LM}", (V, d), note, component="LM head", tied=tied)]


def leaves(term: Term, active: bool = False, mult: sp.Expr = ONE, bucket: str | None = None):
    """Every tensor of the tree with its copies (all, or one token's) and its bucket: (leaf, copies, bucket)."""
    bucket = term.component or bucket
    mult = mult * (term.active_times if active else term.times)
    if term.is_leaf:
        yield term, mult, bucket
    for child in term.children:
        yield from leaves(child, active, mult, bucket)


def breakdown(term: Term, active: bool = False) -> dict[str, sp.Expr]:
    """Parameters per component bucket, over the whole tree, in COMPONENTS order."""
    sums: dict[str, sp.Expr] = {}
    for leaf, copies, bucket in leaves(term, active):
        sums[bucket] = sums.get(bucket, ZERO) + copies * leaf.each
    return {c: sp.expand(sums[c]) for c in COMPONENTS if c in sums}


__all__ = ["Term", "tensor", "group", "linear", "norm", "embedding", "attention", "ffn", "moe", "decoder_layers", "head", "breakdown", "leaves", "COMPONENTS", "EMBEDDINGS"]
