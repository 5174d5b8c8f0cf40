"""Term trees: tensors with SymPy shapes, grouped into modules repeated over layers and experts."""

from __future__ import annotations

from collections.abc import Container, Iterable, Iterator
from dataclasses import dataclass, replace

import sympy as sp

from symparam.symbols import S

ZERO = sp.Integer(0)
ONE = sp.Integer(1)


@dataclass(frozen=True)
class Code:
    """A block's forward program as its recipe writes it, with the sizes and conditions its instance was given."""

    text: str  # one `def` (symparam.programs)
    where: str  # the recipe entry, for error messages
    env: tuple[tuple[str, object], ...] = ()  # the block's arguments: formulas (sizes) and conditions (true/false)
    slots: tuple[tuple[str, tuple[tuple[sp.Expr, str], ...]], ...] = ()  # a layer stack: slot path -> (layers, variant path)
    stack: bool = False  # the decoder-layer stack: the program runs once per layer kind
    layers: sp.Expr | None = None  # a stack: how many layers it has (its kinds may overlap: every layer's norms, N_dense MLPs)
    entries: tuple[str, ...] = ()  # every module and tensor the block declares (a call of one it does not build passes through)
    kernel: str = ""  # where the forward is a CPU reference path a GPU replaces with a fused kernel: which, and what it keeps
    no_checkpointing: str = ""  # a layer stack transformers cannot checkpoint: why
    first_layer: str = ""  # a layer stack whose layer 0 runs otherwise than the layers after it (runs apart): how


@dataclass(frozen=True)
class Term:
    """A node of a model: one tensor (a leaf) or a group of terms repeated `times` times."""

    key: str  # module path segment as transformers names it: "q_proj", "weight", "layers"
    label: str  # what a derivation calls it: "W_Q", "attention"
    note: str = ""  # the derivation comment: which matrix, which shape
    shape: tuple[sp.Expr, ...] = ()  # a leaf's tensor shape; empty for a group
    children: tuple[Term, ...] = ()
    times: sp.Expr = ONE  # copies of the children: N layers, n experts
    active_times: sp.Expr = ONE  # copies one token visits: k of n experts
    component: str | None = None  # breakdown bucket, inherited by the subtree
    tied: bool = False  # a tensor shared with another (a tied LM head): counted once, elsewhere
    buffer: bool = False  # stored in checkpoints but not a parameter (a router's score-correction bias)
    frozen: bool = False  # a parameter training does not update (requires_grad=False): no gradient, no optimizer state
    lookup: bool = False  # a table read by index, not multiplied (embeddings): no FLOPs, not "active without embedding"
    matmul: bool = True  # a 2-D tensor that multiplies activations (false: a bias or gate shaped [heads, width])
    facts: tuple[tuple[str, tuple[tuple[str, object], ...]], ...] = ()  # per-module facts: ("cache", (("per_token", expr), ...))
    rows: sp.Expr | None = None  # positions this module runs on for S input tokens, where not S (BLT's patches S/p)
    code: Code | None = None  # what its forward computes (memory.trace interprets it)
    lora: tuple | None = None  # a parameter peft's ParamWrapper adapts: (scaling, experts, lora_A path, lora_B path)
    dtype: str | None = None  # a leaf stored in this dtype whatever the model's ("F32": transformers keeps it in fp32)
    module: str | None = None  # the kind of module transformers builds here, where quantizers care: linear, experts, head, embedding, router

    @property
    def is_leaf(self) -> bool:
        return not self.children and bool(self.shape)

    @property
    def counted(self) -> bool:
        """Whether this leaf's elements count as parameters here (a tied copy or a buffer does not)."""
        return not (self.tied or self.buffer)

    @property
    def each(self) -> sp.Expr:
        """Parameters in one copy: a tensor's elements, or the sum over the children."""
        if self.is_leaf:
            return sp.Mul(*self.shape) if self.counted else ZERO
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

    def fact(self, name: str) -> dict[str, object] | None:
        """One of this module's facts (cache, state, attend) as a dict, or None."""
        return next((dict(items) for key, items in self.facts if key == name), None)


def tensor(key: str, label: str, shape: Iterable[sp.Expr], note: str = "", **kw) -> Term:
    """A leaf: one parameter tensor of the given shape."""
    return Term(key=key, label=label, note=note, shape=tuple(sp.sympify(s) for s in shape), **kw)


def group(key: str, label: str, children: Iterable[Term], times=ONE, active_times=None, **kw) -> Term:
    """A module made of terms, optionally repeated (layers, experts)."""
    times = sp.sympify(times)
    active_times = times if active_times is None else sp.sympify(active_times)
    return Term(key=key, label=label, children=tuple(children), times=times, active_times=active_times, **kw)


def leaves(term: Term, active: bool = False, mult: sp.Expr = ONE, bucket: str | None = None, path: str = "") -> Iterator[tuple[Term, sp.Expr, str | None, str]]:
    """Every tensor of the tree with its copies (all, or one token's), its bucket and its dotted name."""
    yield from (item for item in walk(term, active, mult, bucket, path) if item[0].is_leaf)


def frozen(term: Term, leaves: Container[int] | None = None) -> Term:
    """The tree with its leaves frozen (requires_grad False: no gradient, no optimizer state): every one (a module
    transformers builds frozen, BLT's patcher), or those of `leaves`, by identity (what no gradient reaches)."""
    if term.is_leaf:
        return replace(term, frozen=True) if leaves is None or id(term) in leaves else term
    return replace(term, children=tuple(frozen(c, leaves) for c in term.children))


def walk(term: Term, active: bool = False, mult: sp.Expr = ONE, bucket: str | None = None, path: str = "") -> Iterator[tuple[Term, sp.Expr, str | None, str]]:
    """Every node of the tree, pre-order, with its copies, bucket and dotted name (layer and expert indices left out)."""
    bucket = term.component or bucket
    mult = mult * (term.active_times if active else term.times)
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    yield term, mult, bucket, path
    for child in term.children:
        yield from walk(child, active, mult, bucket, path)


def rows(term: Term, outer: sp.Expr = S) -> Iterator[tuple[Term, sp.Expr]]:
    """Every node with the positions it runs on for S input tokens: S, or what a module says (S/p patches, S + a
    prompt, S times the calls of a recurrent module), in terms of its parent's positions."""
    here = outer if term.rows is None else term.rows.xreplace({S: outer})
    yield term, here
    for child in term.children:
        yield from rows(child, here)


def breakdown(term: Term, active: bool = False) -> dict[str, sp.Expr]:
    """Parameters per component bucket over the whole tree, in the order the buckets first appear."""
    sums: dict[str, sp.Expr] = {}
    for leaf, copies, bucket, _ in leaves(term, active):
        sums[bucket or "other"] = sums.get(bucket or "other", ZERO) + copies * leaf.each
    return {c: sp.expand(e) for c, e in sums.items()}


def tensors(term: Term) -> dict[str, sp.Expr]:
    """Parameter elements per tensor name, all copies included (tied copies and buffers left out)."""
    out: dict[str, sp.Expr] = {}
    for leaf, copies, _, name in leaves(term):
        if leaf.counted:
            out[name] = out.get(name, ZERO) + copies * leaf.each
    return {name: sp.expand(e) for name, e in out.items()}


__all__ = ["Code", "Term", "tensor", "group", "frozen", "leaves", "walk", "breakdown", "tensors"]
