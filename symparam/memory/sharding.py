"""Memory per GPU when a model is sharded: each kind of rank's weights, gradients, optimizer states, activations and
KV cache under a parallel layout, as formulas, and the most-loaded rank named.

A layout is conventions from conventions/layouts.toml (data, tensor, pipeline, expert and context parallel), applied to
the tensors the model's tree holds: a rank's model is the same tree with the rank's share of each tensor (the tensor
plan's split dimension in chunks of ceil(size/T), n/E routed experts, the layers of its pipeline stage), and its
activations are the single-device trace's storages seen from that rank: the sizes a split divides, inside the modules
that compute on the rank's share (the plan's scopes), and the sequence under context or sequence parallelism.
"""

from __future__ import annotations

import math
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

import sympy as sp

from symparam.components import ONE, Term
from symparam.config import Values, as_subs
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.symbols import B, S, SymbolDef, V, define, evaluate, parse

ZERO = sp.Integer(0)
DEGREES = {  # option -> (symbol name, LaTeX, meaning, Chinese)
    "dp": ("dp", "D", "data-parallel ranks", "数据并行的卡数"),
    "tp": ("tp", "T", "tensor-parallel ranks", "张量并行的卡数"),
    "pp": ("pp", "P_{pp}", "pipeline stages", "流水线并行的级数"),
    "ep": ("ep", "E", "expert-parallel ranks", "专家并行的卡数"),
    "cp": ("cp", "C", "context-parallel ranks", "上下文并行的卡数"),
}
SYMBOL = {key: define(SymbolDef(name, latex, meaning, zh=zh)) for key, (name, latex, meaning, zh) in DEGREES.items()}
DP, TP, PP, EP, CP = (SYMBOL[k] for k in ("dp", "tp", "pp", "ep", "cp"))
STAGE = define(SymbolDef("s", "s", "the pipeline stage, from 0", zh="流水线级的序号（从 0 起）"))
MICRO = define(SymbolDef("m", "m", "micro-batches per step", zh="每步的微批次数"))


# ---------------------------------------------------------------- conventions


@cache
def table() -> dict[str, Any]:
    """layouts.toml as data."""
    text = resources.files("symparam.memory").joinpath("conventions", "layouts.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def entries(section: str) -> dict[str, dict[str, Any]]:
    """The named conventions of a section (its sub-tables)."""
    return {name: spec for name, spec in table()[section].items() if isinstance(spec, dict)}


def convention(section: str, name: str, option: str) -> dict[str, Any]:
    known = entries(section)
    if name not in known:
        raise SymparamError(f"{option}: unknown {name!r}; known: {', '.join(known)}")
    return known[name]


@dataclass(frozen=True)
class Layout:
    """How the GPUs share a model: the degree of each kind of parallelism and the convention each follows."""

    dp: int = 1
    sharding: str = "ddp"  # data-parallel convention: ddp, zero1, zero2, zero3, fsdp2
    tp: int = 1
    tp_plan: str = "transformers"  # transformers (the model's own plan) or megatron
    pp: int = 1
    pp_split: str = "torchtitan"
    schedule: str = "1f1b"
    microbatches: int | None = None  # per step (gradient accumulation, pipeline micro-batches); default pp
    ep: int = 1
    cp: int = 1

    def __post_init__(self) -> None:
        for name in ("dp", "tp", "pp", "ep", "cp", "microbatches"):
            value = getattr(self, name)
            if value is not None and (type(value) is not int or value < 1):
                raise SymparamError(f"--{name}: expected a positive whole number, got {value!r}")
        convention("data", self.sharding, "--sharding")
        convention("tensor", self.tp_plan, "--tp-plan")
        convention("pipeline", self.pp_split, "--pp-split")
        convention("schedule", self.schedule, "--schedule")

    def symbol(self, name: str) -> sp.Expr:
        """A degree's symbol where it is more than 1 (a formula does not carry tp where there is one tensor rank)."""
        return SYMBOL[name] if getattr(self, name) > 1 else ONE

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp

    @property
    def steps(self) -> int:
        """Micro-batches per optimizer step."""
        return self.microbatches if self.microbatches is not None else self.pp

    @property
    def values(self) -> dict[sp.Symbol, sp.Integer]:
        return {DP: sp.Integer(self.dp), TP: sp.Integer(self.tp), PP: sp.Integer(self.pp), EP: sp.Integer(self.ep),
                CP: sp.Integer(self.cp), MICRO: sp.Integer(self.steps)}

    @property
    def data(self) -> dict[str, Any]:
        return convention("data", self.sharding, "--sharding")

    @property
    def tensor(self) -> dict[str, Any]:
        return convention("tensor", self.tp_plan, "--tp-plan")

    def named(self, training: bool = True) -> str:
        """The layout in one line, each convention named."""
        parts = [f"{self.gpus} GPU{'s' if self.gpus > 1 else ''} = dp {self.dp} x tp {self.tp} x pp {self.pp} x cp {self.cp}"]
        if training:
            parts.append(f"data: {self.sharding}")
        if self.tp > 1:
            parts.append(f"tensor: {self.tp_plan}")
        if self.pp > 1:
            parts.append(f"pipeline: {self.pp_split} split" + (f", {self.schedule} schedule, {self.steps} micro-batches" if training else ""))
        if self.ep > 1:
            parts.append(f"experts over ep {self.ep}")
        return "; ".join(parts)


# ---------------------------------------------------------------- tensors as a rank holds them


@dataclass(frozen=True)
class Piece:
    """A parameter tensor as one rank holds it: path, local shape and copies (formulas), and how it is split."""

    path: str
    shape: tuple[sp.Expr, ...]
    count: sp.Expr
    expert: bool  # a routed expert's stacked tensor (data-parallel over dp*cp*tp/ep under expert parallelism)
    trainable: bool = True

    @property
    def numel(self) -> sp.Expr:
        return sp.Mul(*self.shape)


def pattern(key: str) -> str:
    """A plan key as symparam names modules: layer indices (`*`) left out."""
    return ".".join(part for part in key.split(".") if part != "*")


def chunk(size: sp.Expr, parts: sp.Expr, rank: int, values: Mapping[sp.Symbol, int], assumed: list) -> sp.Expr:
    """Rows rank `rank` holds of `size` split in `parts` chunks of ceil(size/parts), as torch.chunk and DTensor's Shard
    give them; size/parts where it divides at the values (an assumption of the formula)."""
    exact = sp.sympify(size / parts)
    if sp.sympify(exact.xreplace(values)).is_Integer:
        if exact.free_symbols - set(values) or not exact.is_Integer:
            assumed.append(f"{parts} divides {size}")
        return exact
    piece = sp.ceiling(size / parts)
    return piece if rank == 0 else sp.Max(ZERO, sp.Min(piece, size - rank * piece))


@dataclass
class Plan:
    """A tensor-parallel plan applied to a model: each tensor's style, the scopes computing on a rank's share."""

    model: Model
    layout: Layout
    values: dict[sp.Symbol, sp.Integer]
    assumed: list = field(default_factory=list)

    @property
    def on(self) -> bool:
        return self.layout.tp > 1

    def style(self, path: str) -> dict[str, Any] | None:
        """The style of a tensor (its own plan entry, else its module's), as the convention places it."""
        if not self.on:
            return None
        plan = {pattern(k): v for k, v in self.model.recipe.tp_plan.items()}
        name = plan.get(path) or plan.get(path.rpartition(".")[0])
        if name is None:
            return None
        return self.layout.tensor["styles"].get(name)

    def split_dim(self, path: str, shape: tuple[sp.Expr, ...]) -> tuple[int, bool] | None:
        """Which dimension of a tensor the plan splits (and whether it holds packed blocks), or None."""
        style = self.style(path)
        if style is None:
            return None
        rule = style.get("bias", style.get("vector", style["weight"])) if path.rpartition(".")[2] == "bias" else \
            style["weight"] if len(shape) > 1 else style.get("vector", style["weight"])
        if rule == "whole":
            return None
        dim = int(rule)
        if len(shape) == 1:
            dim = -1 if dim < 0 else dim
        return dim % len(shape), bool(style.get("packed")) and len(shape) > 1

    def local_shape(self, path: str, shape: tuple[sp.Expr, ...], rank: int) -> tuple[sp.Expr, ...]:
        found = self.split_dim(path, shape)
        if found is None:
            return shape
        dim, packed = found
        size = self.vocabulary(path, shape[dim])
        blocks = 2 if packed else 1
        local = blocks * chunk(size / blocks, TP, rank, self.values, self.assumed)
        return shape[:dim] + (local,) + shape[dim + 1:]

    def vocabulary(self, path: str, size: sp.Expr) -> sp.Expr:
        """The vocabulary a vocabulary-parallel tensor is padded to (Megatron: a multiple of 128*T)."""
        style = self.style(path) or {}
        if style.get("vocabulary") and size.has(V):
            return size.xreplace({V: parse(self.layout.tensor["vocabulary"], {"V": V, "tp": TP})})
        return size

    def scopes(self, rank: int = 0) -> dict[str, dict[sp.Symbol, sp.Expr]]:
        """Module path -> the sizes its code sees on tensor rank `rank`: the parent module of every split that keeps its
        output split (the attention around q_proj sees h/T heads), each size a unit of layouts.toml's list; heads must
        divide by T, a width may split unevenly (rank r's chunk)."""
        if not self.on:
            return {}
        units = [sp.Symbol(u, integer=True, positive=True) for u in table()["tensor"]["units"]]
        heads = set(table()["tensor"]["heads"])
        out: dict[str, dict[sp.Symbol, sp.Expr]] = {}
        for piece in tensors(self.model.tree):
            style = self.style(piece.path)
            found = self.split_dim(piece.path, piece.shape)
            if style is None or found is None or not style.get("scope") or piece.expert and self.layout.ep > 1:
                continue
            size = piece.shape[found[0]]
            unit = next((u for u in units if u in size.free_symbols), None)
            if unit is None:
                raise SymparamError(f"--tp: {piece.path}: its split size {size} has none of the sizes a split can divide ({', '.join(map(str, units))})")
            named = pattern_of(self.model.recipe.tp_plan, piece.path) == piece.path  # a parameter named in the plan itself
            scope = (piece.path if named else piece.path.rpartition(".")[0]).rpartition(".")[0]
            value = unit.xreplace(self.values)
            if str(unit) in heads and not sp.sympify(value / self.layout.tp).is_Integer:
                raise SymparamError(f"--tp {self.layout.tp}: the {self.layout.tp_plan} plan splits {piece.path} by {unit} = {value}, "
                                    f"which {self.layout.tp} ranks cannot share: {self.layout.tensor['heads']}")
            out.setdefault(scope, {})[unit] = chunk(self.vocabulary(piece.path, unit), TP, rank, self.values, self.assumed)
        return out


def pattern_of(plan: Mapping[str, str], path: str) -> str | None:
    """The plan entry (as a path) that names this tensor itself, if any."""
    return next((pattern(k) for k in plan if pattern(k) == path), None)


def tensors(term: Term, count: sp.Expr = ONE, path: str = "", stack: sp.Expr = ONE, tied: bool = False) -> list[Piece]:
    """Every parameter tensor of a tree as PyTorch holds it (routed experts stacked on a first dimension), buffers left
    out; a tied copy only when `tied` (a pipeline stage that holds the head keeps the table it is tied to)."""
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    if term.is_leaf:
        if term.buffer or (term.tied and not tied):
            return []
        shape = term.shape if stack == ONE else (stack,) + term.shape
        return [Piece(path, tuple(shape), count, stack != ONE, not term.frozen)]
    routed = term.active_times != term.times
    inner_count, inner_stack = (count, stack * term.times) if routed else (count * term.times, stack)
    return [t for child in term.children for t in tensors(child, inner_count, path, inner_stack, tied)]


# ---------------------------------------------------------------- pipeline stages


@dataclass(frozen=True)
class Stage:
    """A pipeline stage: its index, its decoder layers [start, end), and the layer-count symbols' values there."""

    index: int
    start: int
    end: int
    counts: tuple[tuple[sp.Symbol, sp.Symbol, int], ...]  # (model symbol N_x, stage symbol L_x, layers of that kind here)
    first: bool
    last: bool

    @property
    def renamed(self) -> dict[sp.Symbol, sp.Symbol]:
        return {n: l for n, l, _ in self.counts}

    @property
    def values(self) -> dict[sp.Symbol, sp.Integer]:
        return {l: sp.Integer(v) for _, l, v in self.counts}

    def label(self, pp: int) -> str:
        if pp == 1:
            return "every rank"
        held = (["embedding"] if self.first else []) + [f"layers {self.start}-{self.end - 1}" if self.end > self.start else "no layers"] + (["norm, head, loss"] if self.last else [])
        return f"stage {self.index} of {pp} ({', '.join(held)})"


def split(layers: int, layout: Layout) -> list[tuple[int, int]]:
    """Each stage's decoder layers [start, end) under the pipeline convention."""
    spec = convention("pipeline", layout.pp_split, "--pp-split")
    p = layout.pp
    if p == 1:
        return [(0, layers)]
    first, last = int(spec["first"]), int(spec["last"])
    slots = layers + first + last
    if p > layers:
        raise SymparamError(f"--pp {p}: more stages than the model's {layers} decoder layers")
    base, extra = divmod(slots, p)
    if spec["remainder"] == "none" and extra:
        raise SymparamError(f"--pp {p}: {layout.pp_split} needs the stages to divide {slots} layer slots ({layers} layers"
                            + (f" + {first + last} for the embedding and the head" if first + last else "") + "); try --pp-split torchtitan or transformers")
    sizes = [base + (1 if spec["remainder"] == "first" and s < extra else 0) + (extra if spec["remainder"] == "last" and s == p - 1 else 0) for s in range(p)]
    sizes[0] -= first
    sizes[-1] -= last
    if min(sizes) < 0:
        raise SymparamError(f"--pp {p}: {layout.pp_split} leaves a stage with no room for its layers")
    bounds, start = [], 0
    for n in sizes:
        bounds.append((start, start + n))
        start += n
    return bounds


def stages(model: Model, layout: Layout) -> list[Stage]:
    """The pipeline stages with the layer kinds each holds (by the recipe's layer rules over the layer index)."""
    layers = int(model.values["N"])
    bounds = split(layers, layout)
    if layout.pp == 1:
        return [Stage(0, 0, layers, (), True, True)]
    values = Values(model.recipe, model.config, dict(model.values))
    kinds = [name for name in model.recipe.layer_symbols if name in model.values]
    masks = {name: values.mask(name) for name in kinds}
    out = []
    for s, (start, end) in enumerate(bounds):
        counts = [(sp.Symbol("N", integer=True, positive=True), stage_symbol("N"), end - start)]
        counts += [(sp.Symbol(name, integer=True, positive=True), stage_symbol(name), sum(1 for i in range(start, end) if masks[name][i])) for name in kinds]
        out.append(Stage(s, start, end, tuple(counts), s == 0, s == layout.pp - 1))
    return out


def stage_symbol(name: str) -> sp.Symbol:
    """The symbol of a layer count on one stage: N -> L, N_dense -> L_dense."""
    from symparam.symbols import BY_NAME

    base = BY_NAME.get(name)
    latex = "L" + (base.latex[1:] if base is not None else name[1:])
    meaning = (base.meaning if base is not None else name) + " on the rank's pipeline stage"
    return define(SymbolDef("L" + name[1:], latex, meaning, zero=True, zh="本流水线级上的" + (base.zh or base.meaning if base is not None else name)))


# ---------------------------------------------------------------- where each module lives


@dataclass(frozen=True)
class Places:
    """Where the pipeline puts modules: the decoder-layer stack's path, and the paths before it (first stage) and after
    it (last stage)."""

    stack: str
    first: tuple[str, ...]
    last: tuple[str, ...]
    shared: str  # the base model's own code (rotary tables, masks): every stage runs it

    def stage_of(self, path: str) -> str:
        """"stack", "first", "last" or "every" for a module or tensor path."""
        inside = lambda prefix: path == prefix or path.startswith(prefix + ".")  # noqa: E731
        if inside(self.stack):
            return "stack"
        if any(inside(p) for p in self.first):
            return "first"
        if any(inside(p) for p in self.last) or path == "":
            return "last"
        return "every" if inside(self.shared) or path == self.shared else "last"


def places(model: Model) -> Places:
    """The stack is the tree's node whose code runs once per layer kind; the base model is its parent."""
    found = None

    def visit(term: Term, path: str, parent: tuple[str, tuple[Term, ...]] | None) -> None:
        nonlocal found
        if found is None and term.code is not None and term.code.stack:
            found = (path, parent)
        for child in term.children:
            visit(child, f"{path}.{child.key}" if path else child.key, (path, term.children))

    root = model.tree
    visit(root, root.key, None)
    if found is None or found[1] is None:
        raise SymparamError(f"{model.name}: no decoder-layer stack found; pipeline stages need one")
    stack, (base, siblings) = found
    keys = [c.key for c in siblings]
    at = keys.index(stack.rpartition(".")[2])
    join = lambda key: f"{base}.{key}" if base else key  # noqa: E731
    first = tuple(join(k) for k in keys[:at])
    last = tuple(join(k) for k in keys[at + 1:]) + tuple(c.key for c in root.children if c.key != base.partition(".")[0])
    return Places(stack, first, last, base)


# ---------------------------------------------------------------- a rank's model


@dataclass(frozen=True)
class Rank:
    """One kind of rank: its pipeline stage and its tensor- and data-parallel rank index (named where ranks of that
    kind differ)."""

    stage: Stage
    tp_rank: int = 0
    dp_rank: int = 0
    named: tuple[str, ...] = ()  # "tp", "dp": the indices that tell this kind apart

    def label(self, layout: Layout) -> str:
        parts = [self.stage.label(layout.pp)]
        parts += [f"tensor rank {self.tp_rank} of {layout.tp}"] if "tp" in self.named else []
        parts += [f"data rank {self.dp_rank} of {layout.dp}"] if "dp" in self.named else []
        return ", ".join(parts)


def rank_tree(model: Model, plan: Plan, rank: Rank, where: Places | None) -> Term:
    """The model's tree as one rank holds it: each tensor's local shape, n/E routed experts, the layers of its stage
    (layer counts renamed to the stage's: N -> L), the modules of other stages left out, but the last stage keeps the
    table a tied head reads (as transformers keeps embed_tokens there). Facts (the KV cache per token) read the sizes
    their module computes on."""
    layout = plan.layout
    scopes = plan.scopes(rank.tp_rank)
    renamed = rank.stage.renamed if where is not None else {}

    tied = {leaf.shape for leaf in walk_leaves(model.tree) if leaf.tied}

    def visit(term: Term, path: str, stack: sp.Expr) -> Term | None:
        path = f"{path}.{term.key}" if path and term.key else path or term.key
        if where is not None and path:
            home = where.stage_of(path)
            table = rank.stage.last and any(leaf.lookup and leaf.shape in tied for leaf in walk_leaves(term))
            if home == "first" and not rank.stage.first and not table or home == "last" and not rank.stage.last:
                return None
            if home == "first" and not rank.stage.first and term.is_leaf and not (term.lookup and term.shape in tied):
                return None
        if term.is_leaf:
            full = term.shape if stack == ONE else (stack,) + term.shape
            local = full if stack != ONE and layout.ep > 1 else plan.local_shape(path, tuple(full), rank.tp_rank)
            if stack != ONE and sp.simplify(local[0] - full[0]) != 0:
                raise SymparamError(f"--tp: {path}: the plan splits the routed experts' own dimension, which symparam does not describe")
            return replace(term, shape=tuple(local[1:] if stack != ONE else local))
        routed = term.active_times != term.times
        times = sp.sympify(term.times).xreplace(renamed)
        if routed and layout.ep > 1:
            experts = term.times.xreplace(plan.values)
            if not sp.sympify(experts / layout.ep).is_Integer:
                raise SymparamError(f"--ep {layout.ep}: the {experts} routed experts do not divide over {layout.ep} ranks")
            times = term.times / EP
        children = tuple(c for c in (visit(child, path, stack * term.times if routed else stack) for child in term.children) if c is not None)
        facts = tuple((name, tuple((k, sp.sympify(v).xreplace(renamed).xreplace(scope_of(scopes, path)) if isinstance(v, sp.Basic) else v) for k, v in items))
                      for name, items in term.facts)
        return replace(term, children=children, times=times, active_times=sp.sympify(term.active_times).xreplace(renamed) if not routed else term.active_times,
                       facts=facts)

    return visit(model.tree, "", ONE)


def walk_leaves(term: Term) -> Iterator[Term]:
    if term.is_leaf:
        yield term
    for child in term.children:
        yield from walk_leaves(child)


def scope_of(scopes: Mapping[str, Mapping[sp.Symbol, sp.Expr]], path: str) -> dict[sp.Symbol, sp.Expr]:
    """The sizes divided for code running in module `path`: those of every scope it is inside."""
    out: dict[sp.Symbol, sp.Expr] = {}
    for scope, subs in scopes.items():
        if path == scope or path.startswith(scope + ".") or scope == "":
            out.update(subs)
    return out


def rank_model(model: Model, tree: Term, values: Mapping[sp.Symbol, sp.Integer]) -> Model:
    """A Model of the same config whose tree is a rank's, with the layout's and the stage's values."""
    local = Model(model.recipe, model.flags, {**model.values, **{str(k): int(v) for k, v in values.items()}}, model.name, model.notes,
                  model.scope, model.source, model.quantization, model.dtype, model.config, model.unknown)
    local.__dict__["tree"] = tree  # the cached tree is the rank's
    return local


# ---------------------------------------------------------------- data-parallel shares


def group_degree(layout: Layout, expert: bool) -> sp.Expr:
    """The ranks that hold the same tensors and split them under the data-parallel convention: dp*cp, and for routed
    experts under expert parallelism the expert data-parallel group dp*cp*tp/ep."""
    degree = layout.symbol("dp") * layout.symbol("cp")
    return degree * layout.symbol("tp") / layout.symbol("ep") if expert and layout.ep > 1 else degree


def split_numel(pieces: list[Piece], how: str, degree: sp.Expr, align: int, rank: int, values: Mapping, assumed: list) -> sp.Expr:
    """Elements one rank holds of a group of tensors under a split of layouts.toml."""
    total = sp.Add(*(p.count * p.numel for p in pieces))
    if how == "whole" or not pieces:
        return total
    if how in ("flat", "flat-whole"):
        padded = align * sp.ceiling(total / (align * degree))
        return padded * degree if how == "flat-whole" else padded
    if how == "tensor":
        return sp.Add(*(p.count * sp.ceiling(p.numel / degree) for p in pieces))
    if how in ("dim0", "dim0-local"):
        return sp.Add(*(p.count * chunk(p.shape[0], degree, 0 if how == "dim0" else rank, values, assumed) * sp.Mul(*p.shape[1:]) for p in pieces))
    raise SymparamError(f"layouts.toml: unknown split {how!r}")


def split_pieces(pieces: list[Piece], how: str, degree: sp.Expr, align: int, rank: int, values: Mapping, assumed: list) -> list[Piece]:
    """The tensors an optimizer sees on one rank: its flat partition (one 1-D tensor), each tensor's partition, or each
    tensor's rows."""
    if how == "whole" or not pieces:
        return pieces
    if how in ("flat", "flat-whole"):
        return [Piece("(flat partition)", (split_numel(pieces, "flat", degree, align, rank, values, assumed),), ONE, False)]
    if how == "tensor":
        return [replace(p, shape=(sp.ceiling(p.numel / degree),)) for p in pieces]
    return [replace(p, shape=(chunk(p.shape[0], degree, 0 if how == "dim0" else rank, values, assumed),) + p.shape[1:]) for p in pieces]


def rank_tensors(model: Model, layout: Layout, rank: Rank, padded: bool = True) -> dict[str, sp.Expr]:
    """Elements of each parameter tensor one rank holds over its layers, by name: the plan's, the experts' and the
    stage's split, then the data-parallel convention's for the weights where it splits each tensor apart (`padded`: the
    storage a rank allocates; else its own rows). A flat buffer (DeepSpeed) is not per tensor: its weights are whole."""
    values = {**as_subs(model.values), **layout.values, **rank.stage.values}
    plan = Plan(model, layout, values)
    where = places(model) if layout.pp > 1 else None
    how = layout.data["weights"]
    how = how if how in ("tensor", "dim0") else "whole"
    out: dict[str, sp.Expr] = {}
    for piece in tensors(rank_tree(model, plan, rank, where)):
        degree = group_degree(layout, piece.expert)
        index = 0 if padded else rank.dp_rank
        [local] = split_pieces([piece], "dim0-local" if how == "dim0" else how, degree, 1, index, values, plan.assumed)
        out[piece.path] = sp.expand(out.get(piece.path, ZERO) + local.count * local.numel)
    return out


# ---------------------------------------------------------------- what each rank holds


@dataclass(frozen=True)
class Held:
    """What one kind of rank holds: its parameters (elements), each term of its memory as a formula with what it is,
    and (training) the moments of a step at which they are live together."""

    rank: Rank
    label: str
    parameters: sp.Expr
    parts: tuple[tuple[str, sp.Expr, str], ...]  # (name, bytes, what)
    moments: tuple[tuple[str, sp.Expr, str], ...] = ()  # (moment, bytes, what is live)
    modules: tuple[tuple[str, sp.Expr, sp.Expr], ...] = ()  # activations per module: (module, copies, bytes per copy)

    def part(self, name: str) -> sp.Expr:
        return next((e for n, e, _ in self.parts if n == name), ZERO)

    @property
    def total(self) -> sp.Expr:
        """Everything it holds at once: serving, its parts; training, the largest of its moments."""
        return sp.Max(*(e for _, e, _ in self.moments)) if self.moments else sp.Add(*(e for _, e, _ in self.parts))


@dataclass(frozen=True)
class PerRank:
    """Every kind of rank of a layout and what it holds, with the values that make the formulas numbers."""

    layout: Layout
    ranks: tuple[Held, ...]
    values: dict[sp.Symbol, sp.Integer]  # the model's, the layout's and B, S (a rank's stage adds its layer counts)
    assumed: tuple[sp.Basic, ...]
    training: bool
    notes: tuple[str, ...] = ()

    def exact(self, held: Held, expr: sp.Expr) -> int:
        return evaluate(expr, {**self.values, **held.rank.stage.values}, f"{held.label}: {expr}")

    def bytes(self, held: Held) -> int:
        if self.training and held.moments:
            return max(self.exact(held, e) for _, e, _ in held.moments)
        return self.exact(held, held.total)

    @property
    def most_loaded(self) -> Held:
        return max(self.ranks, key=self.bytes)


def kinds_of_ranks(model: Model, layout: Layout, plan: Plan, where: Places | None) -> list[Rank]:
    """One rank per kind: every pipeline stage; tensor rank 0 and, where the plan splits something unevenly, the last;
    data rank 0 and, where FSDP2's optimizer states are the rank's own rows, the last."""
    tp_ranks = [0]
    if layout.tp > 1 and any(sp.simplify(a - b) != 0 for p in tensors(model.tree) if not (p.expert and layout.ep > 1) for a, b in
                             zip(plan.local_shape(p.path, p.shape, 0), plan.local_shape(p.path, p.shape, layout.tp - 1))):
        tp_ranks.append(layout.tp - 1)
    dp_ranks = [0, layout.dp - 1] if layout.dp > 1 and layout.data["states"] == "dim0-local" else [0]
    named = tuple(name for name, kinds in (("tp", tp_ranks), ("dp", dp_ranks)) if len(kinds) > 1)
    return [Rank(stage, t, r, named) for stage in stages(model, layout) for t in tp_ranks for r in dp_ranks]


def per_rank(model: Model, layout: Layout, dtype: str, context: Mapping[sp.Symbol, int], train: Any = None,
             quant: str | None = None, ranks: list[Rank] | None = None, found: Traced | None = None) -> PerRank:
    """What each kind of rank holds under a layout (or the given `ranks`): for training (`train`: optimizer, attention,
    checkpointing) its weights, gradients, optimizer states, activations and the loss's moment; for serving its weights
    and KV cache. `found`: the training forward traced at these B and S already (a search over layouts traces it once)."""
    if model.values is None:
        raise SymparamError(f"{model.name}: per-rank memory needs a config's values")
    if layout.tp > 1 and not model.recipe.tp_plan:
        raise SymparamError(f"--tp {layout.tp}: {model.recipe.family} has no tensor-parallel plan in transformers (its recipe states none)")
    check_experts(model, layout)
    values = {**as_subs(model.values), **layout.values, **{k: sp.Integer(v) for k, v in context.items()}}
    plan = Plan(model, layout, values)
    where = places(model) if layout.pp > 1 else None
    ranks = ranks if ranks is not None else kinds_of_ranks(model, layout, plan, where)
    if train is not None and found is None:
        found = traced(model, dtype, train, context)
    if train is not None:
        from symparam.memory.training import without_gradients

        model = without_gradients(model, found.trace.untrained)  # what no gradient reaches trains nowhere
    trace_view = Activation(model, layout, plan, found) if train is not None else None
    held = tuple(rank_holds(model, layout, plan, where, rank, dtype, train, quant, trace_view, values) for rank in ranks)
    assumed = tuple(dict.fromkeys(plan.assumed + (list(trace_view.assumed) if trace_view else [])))
    return PerRank(layout, held, values, assumed, train is not None)


def check_experts(model: Model, layout: Layout) -> None:
    """Expert parallelism needs routed experts, and its ranks are carved from the data-, context- and tensor-parallel
    ones (E divides dp*cp*tp: with --dp D, serving replicas of the attention share the experts)."""
    if layout.ep == 1:
        return
    if not any(p.expert for p in tensors(model.tree)):
        raise SymparamError(f"--ep {layout.ep}: {model.name} has no routed experts")
    if (layout.dp * layout.cp * layout.tp) % layout.ep:
        raise SymparamError(f"--ep {layout.ep}: the expert-parallel ranks must divide dp x cp x tp = {layout.dp * layout.cp * layout.tp} "
                            f"(they are the same GPUs; e.g. --dp {layout.ep // math.gcd(layout.ep, layout.cp * layout.tp)} for data-parallel attention)")


def rank_holds(model: Model, layout: Layout, plan: Plan, where: Places | None, rank: Rank, dtype: str, train: Any,
               quant: str | None, view: Activation | None, values: Mapping[sp.Symbol, sp.Integer]) -> Held:
    """What one rank holds: serving, its weights and KV cache; training, the step's terms and moments."""
    from symparam.context import holders
    from symparam.memory.ops import BYTES

    tree = rank_tree(model, plan, rank, where)
    pieces = tensors(tree)
    parameters = sp.Add(*(p.count * p.numel for p in pieces))
    local = rank_model(model, tree, {**layout.values, **rank.stage.values})
    if train is not None:
        return training_holds(local, layout, plan, rank, pieces, parameters, dtype, train, view, values)
    weights = serving_weights(local, pieces, dtype, quant)
    kv = sp.Add(*(sp.sympify(h.fact["per_token"]) * h.positions() for h in holders(local, "cache"))) * B * BYTES[dtype]
    state = sp.Add(*(sp.sympify(h.fact["size"]) * h.copies for h in holders(local, "state"))) * B * BYTES[dtype]
    parts = (("weights", *weights),
             ("kv_cache", sp.expand(kv.xreplace({S: S / layout.symbol("cp")})), "the KV cache of B sequences of S tokens (S/cp on each "
              "context-parallel rank), the rank's heads and layers"))
    parts += (("state", sp.expand(state), "fixed-size states (linear attention, SSM) of B sequences"),) if state != 0 else ()
    return Held(rank, rank.label(layout), parameters, parts)


def serving_weights(local: Model, pieces: list[Piece], dtype: str, quant: str | None) -> tuple[sp.Expr, str]:
    """The rank's weights: its tensors in the dtype, or as the checkpoint's quantized layout stores them."""
    from symparam.memory import DTYPES, storage

    layout = storage.layout(local, quant)
    if layout is not None:  # what the checkpoint stores beyond the model (an MTP layer) is not loaded to serve it
        return sp.expand(layout.total - layout.extras), f"the rank's tensors as the checkpoint stores them ({layout.title})"
    return sp.expand(sp.Add(*(p.count * p.numel for p in pieces)) * DTYPES[dtype].bytes), f"the rank's parameters in {dtype}"


def data_terms(layout: Layout, rank: Rank, pieces: list[Piece], opt: Any, act: str, at: Mapping[sp.Symbol, sp.Integer],
               assumed: list) -> dict[str, sp.Expr]:
    """Weights, gradients, optimizer states and what the optimizer step makes, split as the data-parallel convention
    splits them: dense tensors over dp*cp ranks, routed experts under expert parallelism over dp*cp*tp/ep."""
    from symparam.memory.ops import BYTES
    from symparam.memory.training import entry_bytes, shared_bytes, step_bytes

    spec = layout.data
    align = int(spec.get("align", 1))
    names = {str(k): v for k, v in at.items()}
    terms = dict.fromkeys(("weights", "gradients", "optimizer_states", "optimizer_step"), ZERO)
    stepped: list[Piece] = []  # what the rank's optimizer steps (its share of each trainable tensor)
    for expert in (False, True):
        trained = [p for p in pieces if p.expert == expert and p.trainable]
        frozen = [p for p in pieces if p.expert == expert and not p.trainable]
        degree = group_degree(layout, expert)
        split = lambda how, group=trained: split_numel(group, how, degree, align, rank.dp_rank, at, assumed)  # noqa: E731
        terms["weights"] += (split(spec["weights"]) + split("whole", frozen)) * BYTES[opt.dtype(opt.weights, act)]
        terms["gradients"] += split(spec["gradients"]) * BYTES[opt.dtype(opt.gradients, act)]
        seen = split_pieces(trained, spec["states"], degree, align, rank.dp_rank, at, assumed)
        terms["optimizer_states"] += sp.Add(*(p.count * entry_bytes(opt.states, p, act, names) for p in seen)) + shared_bytes(opt.states, seen, names)
        stepped += seen
        terms["optimizer_step"] += sp.Add(*(split(e["split"]) * BYTES[e["dtype"]] for e in spec.get("step", [])))
    terms["optimizer_step"] += step_bytes(opt, stepped, lambda p: act, names)
    return terms


def training_holds(local: Model, layout: Layout, plan: Plan, rank: Rank, pieces: list[Piece], parameters: sp.Expr,
                   dtype: str, train: Any, view: Activation, values: Mapping[sp.Symbol, sp.Integer]) -> Held:
    """A training rank: the data-parallel convention's terms and what it adds (DDP's buckets, where there are data
    ranks), the activations of the micro-batches in flight on its stage, and the moments they are live together: on
    the rank that computes the loss with one micro-batch in flight, training.py's moments over its view of the trace."""
    from symparam.memory.activations import Activations, kept
    from symparam.memory.activations import parts as module_parts
    from symparam.memory.trace import Mode
    from symparam.memory.training import _moments, optimizer

    opt = optimizer(train.optimizer)
    act = opt.dtype(opt.weights, dtype)
    spec = layout.data
    at = {**values, **rank.stage.values}
    terms = data_terms(layout, rank, pieces, opt, act, at, plan.assumed)
    replicas = layout.dp * layout.cp > 1  # one data-parallel rank runs no data-parallel wrapper
    extras = [(e["name"], sp.expand(terms[e["of"]]), e["what"]) for e in spec.get("extra", []) if replicas and e["split"] == "whole"]
    extra = sp.Add(*(e for _, e, _ in extras))
    flight = in_flight(layout, rank.stage)
    activations = view.bytes(rank)
    accumulated = terms["gradients"] if layout.steps > 1 else ZERO
    later = ", the gradients accumulated over earlier micro-batches" if layout.steps > 1 else ""
    parts = (
        ("weights", sp.expand(terms["weights"]), f"{opt.dtype(opt.weights, act)} weights, {spec['weights']} over the data-parallel ranks"),
        ("gradients", sp.expand(terms["gradients"]), f"{opt.dtype(opt.gradients, act)} gradients, {spec['gradients']} over the data-parallel ranks"),
        ("optimizer_states", sp.expand(terms["optimizer_states"]), f"{opt.name}'s states, {spec['states']} over the data-parallel ranks"),
        *extras,
        ("activations", sp.expand(flight * activations), f"what autograd keeps for {flight.xreplace(at)} micro-batch(es) in flight ({layout.schedule}), the rank's share"),
        ("loss_peak", view.loss_peak(rank) if rank.stage.last else ZERO, "the loss head's fp32 gradients for a moment (the rank that computes the loss)"),
        ("optimizer_step", sp.expand(terms["optimizer_step"]), "what the optimizer step makes for a moment"),
    )
    if rank.stage.last and flight == 1:
        local_trace = view.local_trace(rank, {p.path: p.shape for p in pieces})
        kept_here = Activations(module_parts(kept(local_trace, view.checkpointing)), Mode(act=act), view.checkpointing, ())
        step = _moments(local, local_trace, opt, act, terms["weights"], terms["gradients"], terms["optimizer_states"], terms["optimizer_step"], kept_here)
        adds = {"loss backward": (extra + accumulated, later), "end of backward": (extra, ""), "optimizer step": (extra, "")}
        kept_too = ", what the data-parallel convention keeps" if extra != 0 else ""
        moments = tuple((name, sp.expand(e + adds[name][0]), what + kept_too + adds[name][1]) for name, e, what in step.moments)
    else:
        base = terms["weights"] + terms["optimizer_states"] + extra
        moments = (("backward", sp.expand(base + flight * activations + accumulated), "weights, optimizer states, the activations of the micro-batches in flight" + later),
                   ("optimizer step", sp.expand(base + terms["gradients"] + terms["optimizer_step"]), "weights, optimizer states, every gradient and what the step makes"))
    return Held(rank, rank.label(layout), parameters, parts, moments, view.modules(rank))


def in_flight(layout: Layout, stage: Stage) -> sp.Expr:
    """Micro-batches whose activations a stage holds at once under the schedule: at most the step's micro-batches."""
    if layout.pp == 1:
        return ONE
    spec = convention("schedule", layout.schedule, "--schedule")
    count = parse(str(spec["in_flight"]), {"pp": PP, "stage": STAGE, "microbatches": MICRO})
    return sp.Min(count, MICRO).xreplace({STAGE: sp.Integer(stage.index)})


# ---------------------------------------------------------------- activations seen from a rank


@dataclass(frozen=True)
class Traced:
    """The single-device training forward of a model at one (B, S) and how its layers checkpoint."""

    trace: Any
    checkpointing: str


def traced(model: Model, dtype: str, train: Any, context: Mapping[sp.Symbol, int]) -> Traced:
    """The training forward as training.py traces it (a checkpointed layer runs without a cache)."""
    from symparam.memory.activations import checked_trace
    from symparam.memory.trace import Mode
    from symparam.memory.training import optimizer

    opt = optimizer(train.optimizer)
    act = opt.dtype(opt.weights, dtype)
    use_cache = False if train.checkpointing != "none" else None
    return Traced(checked_trace(model, Mode(act=act, attention=train.attention, use_cache=use_cache, checkpointing=train.checkpointing != "none"), context), train.checkpointing)


class Activation:
    """The single-device training forward's trace (memory.trace), each storage seen from a rank: the sizes a tensor
    split divides inside the modules computing on the rank's share, the sequence over context-parallel ranks (and over
    tensor ranks where the layout is sequence-parallel), the layers of the rank's stage."""

    def __init__(self, model: Model, layout: Layout, plan: Plan, found: Traced):
        summed = sorted(name for name in model.values or {} if name in model.recipe.symbols and model.recipe.symbols[name].summed)
        if layout.pp > 1 and summed:  # a stage's share of a sum over every layer (Inkling 2's block states) is not described
            raise SymparamError(f"--pp {layout.pp}: {model.recipe.title}'s activations read sizes summed over the layers "
                                f"({', '.join(summed)}), which a pipeline stage's share of the layers does not describe")
        self.trace, self.checkpointing = found.trace, found.checkpointing
        self.model, self.layout, self.plan = model, layout, plan
        self.where = places(model)
        self.assumed = list(self.trace.assumed)
        self.sequence = layout.tp > 1 and "sequence_parallel" in layout.tensor

    def subs(self, module: str, rank: Rank) -> dict[sp.Symbol, sp.Expr]:
        """The sizes code in `module` sees on a rank: its scopes' shares, and the sequence it holds."""
        out = dict(scope_of(self.plan.scopes(rank.tp_rank), module))
        sequence = S / self.layout.symbol("cp")
        under = module.startswith(self.where.shared + ".") and self.where.stage_of(module) != "every"
        if self.sequence and under and not any(k != V for k in out):
            sequence = sequence / TP
        out[S] = sequence
        return out

    def on(self, rank: Rank, module: str, op: str = "") -> bool:
        """Whether the rank's stage runs the code of `module` (the batch: token ids on the first, labels on the last)."""
        if self.layout.pp == 1:
            return True
        home = ("first" if op == "token ids" else "last") if module == "(inputs)" else self.where.stage_of(module)
        return home in ("stack", "every") or home == "first" and rank.stage.first or home == "last" and rank.stage.last

    def local_trace(self, rank: Rank, shapes: Mapping[str, tuple[sp.Expr, ...]] | None = None) -> Any:
        """The trace as the rank sees it: its stage's operations and storages, each with the sizes its module computes
        on (parameters in their local `shapes`), the decoder layers counted for the stage."""
        from symparam.memory.ops import Op
        from symparam.memory.trace import LayerCall, Trace

        piped, shapes = self.layout.pp > 1, shapes or {}
        mapped: dict[int, Any] = {}

        def storage(s: Any) -> Any:
            if s.ident not in mapped:
                numel = sp.Mul(*shapes[s.module]) if s.param and s.module in shapes else s.numel if s.param else sp.sympify(s.numel).xreplace(self.subs(s.module, rank))
                mapped[s.ident] = replace(s, numel=numel, copies=sp.sympify(s.copies).xreplace(rank.stage.renamed),
                                          owners=() if piped else s.owners, covers=tuple(storage(c) for c in s.covers))
            return mapped[s.ident]

        def value(v: Any) -> Any:
            shape = shapes.get(v.storage.module, v.shape) if v.param else tuple(sp.sympify(n).xreplace(self.subs(v.storage.module, rank)) for n in v.shape)
            return replace(v, shape=tuple(shape), storage=storage(v.storage))

        t = self.trace
        keep = [i for i, (s, _) in enumerate(t.saved) if self.on(rank, s.module, s.op)]
        within = lambda r: range(sum(i < r.start for i in keep), sum(i < r.stop for i in keep))  # noqa: E731  a range of saves, renumbered
        ops = [Op(o.name, o.module, tuple(map(value, o.inputs)), tuple(map(value, o.outputs)), within(o.saves)) for o in t.ops if self.on(rank, o.module)]
        layers = [LayerCall(c.path, sp.sympify(c.layers).xreplace(rank.stage.renamed), tuple(map(storage, c.inputs)), within(c.saves), tuple(map(storage, c.arguments)))
                  for c in t.layers]
        held = [storage(s) for s in t.held if self.on(rank, s.module, s.op)]
        return Trace([], [(storage(t.saved[i][0]), t.saved[i][1]) for i in keep], layers, list(t.assumed), dict(t.kernels), ops, held, dict(t.uncheckpointed),
                     t.untrained, frozenset(j for j, i in enumerate(keep) if i in t.dropped), frozenset(j for j, i in enumerate(keep) if i in t.lingering))

    def storages(self, rank: Rank) -> list[Any]:
        """The storages autograd keeps on the rank, with the sizes and copies it holds."""
        from symparam.memory.activations import kept

        return kept(self.local_trace(rank), self.checkpointing)

    def bytes(self, rank: Rank) -> sp.Expr:
        return sp.expand(sp.Add(*(s.copies * s.bytes for s in self.storages(rank))))

    def modules(self, rank: Rank) -> tuple[tuple[str, sp.Expr, sp.Expr], ...]:
        from symparam.memory.activations import parts

        return tuple((p.module, p.layers, p.bytes) for p in parts(self.storages(rank)))

    def loss_peak(self, rank: Rank) -> sp.Expr:
        """The loss head's fp32 gradients (training.py's loss peak) as the rank computing the loss holds them."""
        return sp.expand(sp.Add(*self.trace.loss_gradients).xreplace(self.subs("", rank)) + 4)


# ---------------------------------------------------------------- report


LEAVES_OUT = ("the CUDA context, the caching allocator's fragmentation and communication buffers (NCCL, DeepSpeed's "
              "buckets, FSDP's all-gathered layers, expert all-to-all): `symparam fit` counts them as a labelled reserve")


def conventions(layout: Layout, training: bool = True) -> list[dict[str, str]]:
    """Each convention the layout uses, named, with its title and source."""
    used = [("data", layout.sharding, layout.data)] if training else []
    if layout.tp > 1:
        used.append(("tensor", layout.tp_plan, layout.tensor))
    if layout.pp > 1:
        used.append(("pipeline", layout.pp_split, convention("pipeline", layout.pp_split, "--pp-split")))
        used += [("schedule", layout.schedule, convention("schedule", layout.schedule, "--schedule"))] if training else []
    if layout.ep > 1:
        used.append(("expert", "ep", table()["expert"]))
    if layout.cp > 1:
        used.append(("context", "cp", table()["context"]))
    return [{"kind": kind, "name": name, "title": spec["title"], "source": spec["source"]} for kind, name, spec in used]


def as_dict(result: PerRank) -> dict[str, Any]:
    """The per-rank figures for JSON: the layout and its conventions, every kind of rank, the most loaded named."""
    def rank(held: Held) -> dict[str, Any]:
        exact = lambda e: result.exact(held, e)  # noqa: E731
        peak = max(held.moments, key=lambda m: exact(m[1])) if held.moments else None
        return {
            "rank": held.label,
            "parameters": exact(held.parameters),
            "bytes": result.bytes(held),
            "formula": str(peak[1] if peak else sp.expand(held.total)),
            **({"at": peak[0]} if peak else {}),
            "layers": {str(l): v for _, l, v in held.rank.stage.counts},
            "parts": {name: {"bytes": exact(e), "formula": str(e), "what": what} for name, e, what in held.parts},
            "moments": [{"at": name, "bytes": exact(e), "formula": str(e), "live": what} for name, e, what in held.moments],
            "activations": [{"module": m, "layers": exact(c), "bytes": exact(c * b), "formula": str(sp.expand(c * b))} for m, c, b in held.modules if exact(c * b)],
        }

    layout = result.layout
    return {
        "convention": layout.named(result.training),
        "gpus": layout.gpus,
        "degrees": {"dp": layout.dp, "tp": layout.tp, "pp": layout.pp, "ep": layout.ep, "cp": layout.cp, "microbatches": layout.steps},
        "conventions": conventions(layout, result.training),
        "most_loaded": rank(result.most_loaded),
        "ranks": [rank(h) for h in result.ranks],
        "assumes": [str(a) for a in result.assumed],
        "leaves_out": LEAVES_OUT,
    }


def text_lines(r: dict[str, Any], row: Callable[[str, dict[str, Any]], str]) -> list[str]:
    """The per-rank figures as labelled lines: the layout, one line per kind of rank, the most loaded with its terms."""
    pad = " " * 11
    training = any(rank["moments"] for rank in r["ranks"])
    columns = ("weights", "gradients", "optimizer_states", "activations", "loss_peak") if training else ("weights", "kv_cache")
    heads = {"weights": "weights", "gradients": "gradients", "optimizer_states": "opt. states", "activations": "activations",
             "loss_peak": "loss peak", "kv_cache": "KV cache"}
    width = max(len(rank["rank"]) for rank in r["ranks"])
    lines = [f"per GPU    {r['convention']}"]
    lines += [f"{pad}{c['kind']} ({c['name']}): {c['title']}" for c in r["conventions"]]
    lines.append(f"{pad}{'':<{width}}  " + "  ".join(f"{heads[c]:>17}" for c in columns) + f"  {'bytes':>17}")
    for rank in r["ranks"]:
        lines.append(f"{pad}{rank['rank']:<{width}}  " + "  ".join(f"{rank['parts'].get(c, {}).get('bytes', 0):>17,}" for c in columns)
                     + f"  {rank['bytes']:>17,}")
    most = r["most_loaded"]
    lines.append(row("most loaded", {"bytes": most["bytes"]}) + f"    {most['rank']}" + (f", at {most['at']}" if "at" in most else ""))
    lines.append(f"{pad}= {most['formula']}")
    if most["layers"]:
        lines.append(f"{pad}where " + ", ".join(f"{k} = {v}" for k, v in most["layers"].items()) + " (the stage's decoder layers by kind)")
    for name, part in most["parts"].items():
        if part["bytes"]:
            lines.append(f"{pad}{name}: {part['bytes']:,} = {part['formula']} ({part['what']})")
    lines += [f"{pad}{m['at']}: {m['bytes']:,} ({m['live']})" for m in most["moments"]]
    if r["assumes"]:
        lines.append(f"{pad}assumes {', '.join(r['assumes'])}")
    lines.append(f"{pad}leaves out {r['leaves_out']}")
    return lines


__all__ = ["Layout", "Piece", "Plan", "Stage", "Rank", "Held", "PerRank", "DP", "TP", "PP", "EP", "CP", "table", "entries", "tensors", "split",
           "stages", "places", "per_rank", "as_dict", "text_lines", "conventions"]
