"""A model's tree as a top-down derivation: steps, closed forms under stated assumptions, the documents' estimate."""

from __future__ import annotations

from typing import Any

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import sympy as sp

from symparam.components import ONE, ZERO, Term, leaves
from symparam.errors import SymparamError
from symparam.model import Count, Model
from symparam.symbols import N, V, d, d_ff, evaluate, g, h, h_d, h_kv

# The documents' FFN multiplier d_ff/d: a ratio, not a dimension, so it lives here and not in the vocabulary.
M = sp.Symbol("M", positive=True)


@dataclass(frozen=True)
class Assumption:
    """A relation between symbols under which an expression simplifies, and the substitution it licenses."""

    key: str  # catalog key of its wording, e.g. "heads_tile_d"
    lhs: sp.Expr
    rhs: sp.Expr
    subs: tuple[tuple[sp.Symbol, sp.Expr], ...]  # what it lets us replace, in order
    needs: sp.Symbol  # it only speaks to expressions in this symbol (MLA has h but no h_kv)


# Applied in this order: first h_d = d/h, then h = g*h_kv; together they give attention = d^2(2 + 2/g).
ASSUMPTIONS: tuple[Assumption, ...] = (
    Assumption("heads_tile_d", h * h_d, d, ((h_d, d / h),), h_d),
    Assumption("grouped_heads", h, g * h_kv, ((h, g * h_kv),), h_kv),
)


@dataclass(frozen=True)
class Check:
    """An assumption read against a config: whether both sides agree, with their values."""

    assumption: Assumption
    lhs: int
    rhs: int

    @property
    def holds(self) -> bool:
        return self.lhs == self.rhs


@dataclass(frozen=True)
class ClosedForm:
    """An expression, its simplified form under the assumptions that change it, and how a config fares."""

    general: sp.Expr
    simplified: sp.Expr  # written form (.doit() for the plain expression)
    assumptions: tuple[Assumption, ...]  # the ones that changed the expression
    checks: tuple[Check, ...]  # empty without values
    value: int | None  # the general form at the config's values
    simplified_value: sp.Rational | None  # what the simplified form would give there

    @property
    def applies(self) -> bool | None:
        """True or False with values; None when purely symbolic."""
        return all(c.holds for c in self.checks) if self.checks else None

    @property
    def broken(self) -> tuple[Check, ...]:
        return tuple(c for c in self.checks if not c.holds)


@dataclass(frozen=True)
class Factor:
    """One parameter tensor inside a step: its label, shape, element count and what it is."""

    label: str  # LaTeX, e.g. "W_{Q}"
    note: str  # which matrix
    shape: tuple[sp.Expr, ...]
    count: sp.Expr  # elements; zero for a tied tensor
    tied: bool
    value: int | None


@dataclass(frozen=True)
class Ref:
    """A sub-step used inside a step's formula, `times` times (`active_times` for one token)."""

    step: int | None  # index into Derivation.steps; None when the config has no copies (e.g. N_dense = 0)
    title: str
    placeholder: sp.Symbol
    times: sp.Expr
    active_times: sp.Expr

    @property
    def absent(self) -> bool:
        """The config has no copies of it (e.g. N_dense = 0), so it is named but not derived."""
        return self.step is None


@dataclass(frozen=True)
class Step:
    """One module of the model: its factors and sub-steps, the formula they compose, and its number."""

    index: int
    path: str  # module path, e.g. "model.layers.self_attn"
    title: str  # the component bucket or the module's label, e.g. "attention"
    placeholder: sp.Symbol  # P_i, the name other steps use for this one
    active_placeholder: sp.Symbol  # P_i^act, one token's share of it
    factors: tuple[Factor, ...]
    refs: tuple[Ref, ...]
    formula: sp.Expr  # factors and placeholders, written in module order
    expanded: sp.Expr  # in the vocabulary's symbols, one copy
    written: sp.Expr  # the same, written in module order
    active_formula: sp.Expr
    active_expanded: sp.Expr
    active_written: sp.Expr
    substituted: sp.Expr | None  # the written form with numbers in place, unevaluated
    value: int | None
    active_value: int | None
    closed: ClosedForm | None  # where an assumption simplifies it

    @property
    def has_active(self) -> bool:
        return sp.expand(self.active_expanded - self.expanded) != 0


@dataclass(frozen=True)
class Chain:
    """The document-style chain from the model down to its closed form and number: each line equals the one before."""

    lhs: sp.Symbol  # P_model or P_model^act
    lines: tuple[tuple[sp.Expr, ...], ...]  # each line's summands: one per layer kind, then the rest
    value: int | None


@dataclass(frozen=True)
class Row:
    """A line of the component table: total and active, with shares of the model's totals."""

    component: str
    formula: sp.Expr  # written by layer kind
    total: int | None  # None when purely symbolic
    active: int | None
    share: Fraction | None
    active_share: Fraction | None
    tied: bool


@dataclass(frozen=True)
class EstimateCheck:
    """One simplification the documents' estimate makes, and whether this model breaks it."""

    key: str  # catalog key of its wording
    broken: bool | None  # None when there is no config to check against
    amount: int | None = None  # parameters it leaves out or puts in, where one number says it


@dataclass(frozen=True)
class Estimate:
    """The documents' estimate 2Vd + N(4d^2 + 3Md^2), M = d_ff/d, beside the exact count."""

    formula: sp.Expr
    multiplier: Fraction | None  # M at the config
    value: Fraction | None
    exact: int | None
    checks: tuple[EstimateCheck, ...]

    @property
    def relative_error(self) -> Fraction | None:
        """(estimate - exact) / exact."""
        return None if self.value is None else (self.value - self.exact) / self.exact


@dataclass(frozen=True)
class Storage:
    """How a checkpoint stores the model under a quantization format: one packed matrix's bytes, the model's, the value."""

    format: str  # the entry of memory/conventions/formats.toml
    title: str  # its words (translated through the derivation's own table)
    source: str  # "quantization_config" or "--quant NAME"
    per_matrix: sp.Expr  # bytes of one packed matrix [d_out, d_in]
    total: sp.Expr  # bytes of every stored tensor, in the model's symbols
    value: int | None  # at the config's values
    tensors: int | None  # tensors the checkpoint holds


@dataclass(frozen=True)
class Derivation:
    """Everything a write-up of one model needs, computed; templates only lay it out."""

    name: str
    family: str
    title: str
    flags: dict[str, bool]
    values: dict[str, int] | None
    symbols: tuple[sp.Symbol, ...]
    chain: Chain
    active_chain: Chain | None  # for a mixture of experts
    steps: tuple[Step, ...]
    total: sp.Expr
    active: sp.Expr
    closed: ClosedForm
    total_value: int | None
    active_value: int | None
    active_without_embedding: int | None
    rows: tuple[Row, ...]
    estimate: Estimate
    notes: tuple[tuple[str, dict[str, str]], ...]  # how the config was read (catalog phrase, fields)
    meanings: dict[str, str]  # symbol name -> its meaning in this family
    translations: dict[str, dict[str, str]]  # language -> this family's own words (components, labels, notes, meanings)
    storage: Storage | None = None  # the stored layout, where the config carries a quantization_config or --quant names one
    memory: Any = None  # the training step (memory.explain.MemoryDerivation), where --memory asks for it

    @property
    def moe(self) -> bool:
        return self.active_chain is not None

    @property
    def active_figures(self) -> bool:
        """Whether one token's figures are shown beside the totals: a mixture of experts whose config sets k."""
        return self.moe and self.active_value is not None

    @property
    def tied(self) -> bool:
        return bool(self.flags.get("tied"))


def exact(expr: sp.Expr, values: Mapping[sp.Symbol, int] | None, what: str = "") -> int | None:
    """An expression's integer value at the given values, or None without values; a fraction is a SymparamError."""
    return None if values is None else evaluate(expr, values, what)


def exact_active(expr: sp.Expr, values: Mapping[sp.Symbol, int] | None, what: str = "") -> int | None:
    """A figure of one token at the given values: None also where it needs k that the config does not set."""
    return None if values is None or sp.sympify(expr).free_symbols - set(values) else evaluate(expr, values, what)


def merged(terms) -> list[sp.Expr]:
    """Like terms added up, each where it first appears (module order): V d + d + V d -> 2 V d + d."""
    out: dict[sp.Expr, sp.Expr] = {}
    for term in terms:
        coeff, rest = term.as_coeff_Mul()
        out[rest] = out.get(rest, ZERO) + coeff
    return [c * rest for rest, c in out.items() if c != 0]


def monomials(parts) -> list[sp.Expr]:
    """The monomials of a sum of parts, like terms merged, in the order they first appear (module order)."""
    return merged(term for part in parts for term in sp.Add.make_args(sp.expand(part)))


def degree(term: sp.Expr) -> int:
    """A monomial's degree in the symbols (denominators not counted): 2 d h h_d has 3, d^2 (2 + 2/g) has 2."""
    return sum(int(e) for b, e in (f.as_base_exp() for f in sp.Mul.make_args(term)) if b.is_Symbol and e > 0)


def polynomial(parts) -> list[sp.Expr]:
    """Monomials as a person writes a polynomial: highest degree first, module order among equals."""
    return sorted(monomials(parts), key=lambda t: -degree(t))


def written(terms) -> sp.Expr:
    """A sum kept in the given order (an UnevaluatedExpr the printers lay out as it stands); .doit() gives the plain sum."""
    terms = [t for t in terms if t != 0]
    if not terms:
        return ZERO
    return terms[0] if len(terms) == 1 else sp.UnevaluatedExpr(sp.Add(*terms, evaluate=False))


def size(term: sp.Expr) -> int:
    """How many symbol factors a monomial has, numerator and denominator, with multiplicity: 2 d^2/g has 3."""
    return sum(abs(int(e)) for b, e in (f.as_base_exp() for f in sp.Mul.make_args(term)) if b.is_Symbol)


def applicable(expr: sp.Expr) -> tuple[Assumption, ...]:
    """The assumptions that speak of an expression: every symbol they relate is in it (JetMoE's count has h_d but no h,
    so h h_d = d would bring in a symbol the model does not have)."""
    return tuple(a for a in ASSUMPTIONS if (a.lhs.free_symbols | a.rhs.free_symbols) - {g} <= expr.free_symbols)


def assume(term: sp.Expr, assumptions: tuple[Assumption, ...] = ASSUMPTIONS) -> tuple[sp.Expr, tuple[Assumption, ...]]:
    """A monomial under the assumptions, where they make it no longer (2 d h h_d -> 2d^2, but 2h_d stays 2h_d)."""
    out, used = term, ()
    for a in assumptions:
        if a.needs in out.free_symbols:
            after = sp.expand(out.subs(dict(a.subs)))
            if after != out:
                out, used = after, used + (a,)
    return (out, used) if used and size(out) <= size(term) else (term, ())


def by_ratio(terms) -> list[sp.Expr]:
    """Terms that differ only in powers of g written together, as the documents do: 2d^2 + 2d^2/g = d^2(2 + 2/g)."""
    groups: dict[sp.Expr, list[sp.Expr]] = {}
    for term in terms:
        independent, ratio = term.as_independent(g, as_Add=False)
        coeff, key = independent.as_coeff_Mul()
        groups.setdefault(key, []).append(coeff * ratio)
    return [key * sp.Add(*parts) if len(parts) > 1 else key * parts[0] for key, parts in groups.items()]


def simplify_under(terms, assumptions: tuple[Assumption, ...] = ASSUMPTIONS) -> tuple[list[sp.Expr], tuple[Assumption, ...]]:
    """Monomials (in order) under the assumptions, grouped by g, and which assumptions changed them."""
    out, used = [], set()
    for term in terms:
        after, by = assume(term, assumptions)
        out.append(after)
        used.update(by)
    return sorted(by_ratio(monomials(out)), key=lambda t: -degree(t)), tuple(a for a in ASSUMPTIONS if a in used)


def split(t: Term, active: bool = False, bucket: str | None = None, mult: sp.Expr = ONE, layer: Term | None = None):
    """Every tensor's count per copy of its layer kind (the outermost repeated group), in module order: (layer, count, bucket)."""
    bucket = t.component or bucket
    if layer is None and t.times != 1:
        layer, mult = t, ONE
    else:
        mult = mult * (t.active_times if active else t.times)
    if t.is_leaf:
        yield layer, mult * t.each, bucket
    for c in t.children:
        yield from split(c, active, bucket, mult, layer)


def by_layer(tree: Term, active: bool = False, bucket: str | None = None) -> dict[Term | None, list[sp.Expr]]:
    """Monomials per copy of each layer kind, and those outside any (key None), in module order."""
    layers: dict[int, Term | None] = {}
    parts: dict[int, list[sp.Expr]] = {}
    for layer, count, b in split(tree, active):
        if bucket is None or b == bucket:
            layers[id(layer)] = layer
            parts.setdefault(id(layer), []).append(count)
    return {layers[i]: terms for i, p in parts.items() if (terms := polynomial(p))}


def copies(layer: Term, active: bool) -> sp.Expr:
    return layer.active_times if active else layer.times


def grouped(tree: Term, active: bool = False, bucket: str | None = None, rewrite=None, model: bool = False) -> sp.Expr:
    """The count written by layer kind: N(...) per kind in module order, then the rest; a model's embedding and head terms factored, d(2V + 1)."""
    rewrite = rewrite or (lambda terms: terms)
    parts = by_layer(tree, active, bucket)
    out = [product(copies(layer, active), written(rewrite(terms))) for layer, terms in parts.items() if layer is not None]
    if None in parts:
        rest = rewrite(parts[None])
        out.append(sp.factor_terms(sp.Add(*rest)) if model and out else written(rest))
    return written(out)


def product(times: sp.Expr, expr: sp.Expr) -> sp.Expr:
    """times x expr with a count that is a sum, or a sum, written first, "(N - N_dense)(...)"; .doit() multiplies."""
    if times == 1:
        return expr
    if isinstance(expr, sp.UnevaluatedExpr) or expr.is_Add:
        return sp.UnevaluatedExpr(sp.Mul(times, expr, evaluate=False))
    if times.is_Add:  # 3 (N - N_dense) d d_moe n
        coeff, rest = expr.as_coeff_Mul()
        return sp.UnevaluatedExpr(sp.Mul(*([coeff] if coeff != 1 else []), times, *sp.Mul.make_args(rest), evaluate=False))
    return times * expr


def substituted(expr: sp.Expr, values: Mapping[sp.Symbol, int]) -> sp.Expr:
    """The expression with each symbol replaced by its number, kept unevaluated to show the step."""
    return expr.xreplace({s: sp.UnevaluatedExpr(sp.Integer(v)) for s, v in values.items()})


def with_g(values: Mapping[sp.Symbol, int]) -> dict[sp.Symbol, int]:
    """The config's values plus g = h / h_kv where both are known."""
    out = dict(values)
    if h in out and h_kv in out:
        out[g] = out[h] // out[h_kv]
    return out


def closed_form(general: sp.Expr, tree: Term, values: Mapping[sp.Symbol, int] | None, what: str = "", model: bool = False) -> ClosedForm:
    """The closed form of `general`, the count of `tree`, written by layer kind."""
    used: set[Assumption] = set()
    allowed = applicable(general)

    def rewrite(part):
        out, by = simplify_under(part, allowed)
        used.update(by)
        return out

    simplified = grouped(tree, rewrite=rewrite, model=model)
    assumptions = tuple(a for a in ASSUMPTIONS if a in used)
    checks: tuple[Check, ...] = ()
    simplified_value = None
    if values is not None:
        full = with_g(values)
        checks = tuple(Check(a, int(a.lhs.xreplace(full)), int(a.rhs.xreplace(full))) for a in assumptions)
        simplified_value = sp.Rational(simplified.doit().xreplace(full))
    return ClosedForm(general, simplified, assumptions, checks, exact(general, values, what), simplified_value)


def is_step(t: Term, bucket: str | None, root: bool = False) -> bool:
    """A module gets its own step when it is the model, repeated, a new component, or holds such modules."""
    if t.is_leaf:
        return False
    new_bucket = t.component is not None and t.component != bucket
    return root or t.times != 1 or new_bucket or any(is_step(c, t.component or bucket) for c in t.children)


def title(t: Term) -> str:
    """What a step is called: its component bucket where it starts one, else the module's label."""
    return t.component if t.component and t.component != "LM head" and t.times == 1 else t.label


class _Walker:
    """Builds the steps in document order (pre-order), one step per distinct module."""

    def __init__(self, name: str, values: Mapping[sp.Symbol, int] | None):
        self.name = name
        self.values = values
        self.steps: list[Step | None] = []
        self.seen: dict[tuple[Term, str | None], int] = {}
        self.of: dict[int, int] = {}  # id of a module -> its step

    def placeholder(self, t: Term, active: bool = False) -> sp.Symbol | None:
        """The name of a module's step (one token's share where that differs), or None when it has none."""
        step = self.steps[self.of[id(t)]] if id(t) in self.of else None
        if step is None:
            return None
        return step.active_placeholder if active and step.has_active else step.placeholder

    def walk(self, t: Term, path: str, bucket: str | None) -> int:
        key = (t, bucket)
        if key in self.seen:
            self.of[id(t)] = self.seen[key]
            return self.seen[key]
        index = len(self.steps)
        self.seen[key] = self.of[id(t)] = index
        self.steps.append(None)
        bucket = t.component or bucket
        factors: list[Factor] = []
        refs: list[Ref] = []
        parts: list[sp.Expr] = []
        active_parts: list[sp.Expr] = []
        self._collect(t, path, bucket, factors, refs, parts, active_parts)
        one = Term(t.key, t.label, t.note, t.shape, t.children, component=t.component, tied=t.tied)
        expanded, active_expanded = sp.expand(one.expr), sp.expand(one.active)
        model = index == 0
        terms = grouped(one, model=model)
        what = f"{self.name}: {path}"
        closed = closed_form(expanded, one, self.values, what, model) if simplify_under(monomials([expanded]), applicable(expanded))[1] else None
        self.steps[index] = Step(
            index=index,
            path=path,
            title=title(t),
            placeholder=sp.Symbol(f"P_{index}"),
            active_placeholder=sp.Symbol(f"P_{index}^act"),
            factors=tuple(factors),
            refs=tuple(refs),
            formula=written(merged(parts)),
            expanded=expanded,
            written=terms,
            active_formula=written(merged(active_parts)),
            active_expanded=active_expanded,
            active_written=grouped(one, active=True, model=model),
            substituted=substituted(terms, self.values) if self.values is not None else None,
            value=exact(expanded, self.values, what),
            active_value=exact_active(active_expanded, self.values, f"{what} (active)"),
            closed=closed,
        )
        return index

    def _collect(self, t: Term, path: str, bucket: str | None, factors: list[Factor], refs: list[Ref], parts: list[sp.Expr], active_parts: list[sp.Expr]) -> None:
        for c in t.children:
            sub = ".".join(p for p in (path, c.key) if p)
            if is_step(c, bucket):
                what = f"{self.name}: copies of {sub}"
                times, active_times = exact(c.times, self.values, what), exact_active(c.active_times, self.values, f"{what} (active)")
                step = None if times == 0 == active_times else self.walk(c, sub, bucket)
                placeholder = self.steps[step].placeholder if step is not None and self.steps[step] else sp.Symbol(f"P_{len(self.steps)}_{len(refs)}")
                refs.append(Ref(step, title(c), placeholder, c.times, c.active_times))
                parts.append(product(c.times, placeholder))
                active_parts.append(product(c.active_times, self.placeholder(c, active=True) or placeholder))
            elif c.is_leaf:
                count = c.each
                factors.append(Factor(c.label, c.note, c.shape, count, c.tied, exact(count, self.values, f"{self.name}: {sub}")))
                parts.append(count)
                active_parts.append(count)
            else:
                self._collect(c, sub, c.component or bucket, factors, refs, parts, active_parts)


def chain(tree: Term, walker: _Walker, lhs: sp.Symbol, value: int | None, active: bool = False) -> Chain:
    """P = N P_layer + 2Vd + d = N(P_norms + P_attention + P_FFN) + 2Vd + d = N(2d + ...) + d(2V + 1), per layer kind."""
    parts = by_layer(tree, active)
    layers = [layer for layer in parts if layer is not None]
    outside = parts.get(None, [])

    def inside(layer: Term) -> sp.Expr:
        out = []
        for c in layer.children:
            p = walker.placeholder(c, active)
            out.append(product(copies(c, active), p) if p is not None else written(polynomial(n * leaf.each for leaf, n, _, _ in leaves(c, active))))
        return written(out)

    def line(per_layer, rest) -> tuple[sp.Expr, ...]:
        return tuple(product(copies(layer, active), per_layer(layer)) for layer in layers) + ((rest,) if rest != 0 else ())

    lines = [
        line(lambda layer: walker.placeholder(layer, active) or written(parts[layer]), written(outside)),
        line(inside, written(outside)),
        line(lambda layer: written(parts[layer]), sp.factor_terms(sp.Add(*outside))),
    ]
    unique = [x for i, x in enumerate(lines) if i == 0 or x != lines[i - 1]]
    return Chain(lhs, tuple(unique), value)


def matmuls(model: Model, attention: bool) -> sp.Expr:
    """Weights of the layers' matrices: attention's, or the rest (FFN, experts, mixers); embeddings and head left out."""
    return sp.expand(sum((copies * leaf.each for leaf, copies, bucket, _ in leaves(model.tree)
                          if len(leaf.shape) == 2 and not leaf.lookup and bucket not in OUTSIDE_LAYERS and (bucket == "attention") == attention), sp.Integer(0)))


def _differs(model: Model, expr: sp.Expr, expected: sp.Expr) -> bool:
    subs = model.substitution()
    return sp.expand(expr - expected).xreplace(subs) != 0


OUTSIDE_LAYERS = ("input embedding", "LM head")  # the 2Vd of the estimate
# What the estimate 2Vd + N(4d^2 + 3Md^2) takes for granted; each test says whether a model (with values) breaks it.
ESTIMATE_CHECKS: tuple[tuple[str, Callable[[Model], bool]], ...] = (
    ("untied_head", lambda m: bool(m.flags.get("tied"))),
    ("mha_attention", lambda m: _differs(m, matmuls(m, attention=True), 4 * N * d**2)),
    ("gated_ffn", lambda m: d_ff not in m.total.free_symbols or _differs(m, matmuls(m, attention=False), 3 * N * d * d_ff)),
    ("minor_terms", lambda m: True),
)


def minor_terms(model: Model) -> sp.Expr:
    """Biases, norms, sinks and position tables: what the estimate leaves out (every tensor but matrices and the token table)."""
    return sp.expand(sum((copies * leaf.each for leaf, copies, bucket, _ in leaves(model.tree)
                          if len(leaf.shape) != 2 or (leaf.lookup and bucket not in OUTSIDE_LAYERS)), sp.Integer(0)))


ESTIMATE = 2 * V * d + N * (4 * d**2 + 3 * M * d**2)


def estimate(model: Model, subs: Mapping[sp.Symbol, int] | None, exact_total: int | None) -> Estimate:
    """The documents' estimate with M = d_ff/d, its value, and the simplifications this model breaks."""
    checks = []
    for key, broken in ESTIMATE_CHECKS:
        amount = exact(minor_terms(model), subs, f"{model.name}: minor terms") if key == "minor_terms" else None
        checks.append(EstimateCheck(key, broken(model) if subs is not None else None, amount))
    if subs is None or any(name not in (model.values or {}) for name in ("N", "V", "d", "d_ff")):  # HRM has no N, xLSTM no d_ff
        return Estimate(ESTIMATE, None, None, exact_total, tuple(checks))
    subs = {**subs, d_ff: model.values["d_ff"]}  # the config's d_ff, even where no dense layer is built (M of the estimate)
    multiplier = Fraction(subs[d_ff], subs[d])
    value = ESTIMATE.xreplace({**subs, M: sp.Rational(subs[d_ff], subs[d])})
    return Estimate(ESTIMATE, multiplier, Fraction(int(value.p), int(value.q)), exact_total, tuple(checks))


def table(model: Model, count: Count | None) -> tuple[Row, ...]:
    """The component table, formulas written by layer kind; with a config, empty buckets are left out and a tied head is kept and marked."""
    rows = []
    for c in model.components:
        tied = c == "LM head" and bool(model.flags.get("tied"))
        formula = grouped(model.tree, bucket=c)
        if count is None:
            rows.append(Row(c, formula, None, None, None, None, tied))
            continue
        n, a = count.components[c], count.active_components[c]
        if n or a or tied:
            rows.append(Row(c, formula, n, a, Fraction(n, count.total), None if a is None or count.active is None else Fraction(a, count.active), tied))
    return tuple(rows)


def storage(model: Model, quant: str | None) -> tuple[Storage | None, dict[str, str]]:
    """The stored layout as a derivation shows it (and the Chinese of its title), or None without a format."""
    from symparam.memory import storage as layouts

    layout = layouts.layout(model, quant)
    if layout is None:
        return None, {}
    report = layout.report(model.values) if model.values is not None else None
    per_matrix = layout.per_matrix if layout.per_matrix is not None else sp.Integer(0)
    found = Storage(layout.format, layout.title, layout.source, per_matrix, sp.expand(layout.total),
                    report["bytes"] if report else None, report["tensor_count"] if report else None)
    zh = layouts.formats()[layout.format].spec.get("zh") if layout.format in layouts.formats() else None
    return found, ({layout.title: zh} if zh else {})


def derive(model: Model, quant: str | None = None, memory: dict[str, Any] | None = None) -> Derivation:
    """The derivation of a model: symbolic always, with numbers when the model has values; with the stored layout
    where the config carries a quantization_config or `quant` names a format; with the training step's memory where
    `memory` gives its settings (seq, batch, dtype, attention, checkpointing, optimizer_name)."""
    stored, stored_zh = storage(model, quant)
    subs = model.substitution() if model.values is not None else None
    walker = _Walker(model.name, subs)
    walker.walk(model.tree, model.tree.key, None)
    count = model.count() if subs is not None else None
    total_value = count.total if count else None
    active_value = count.active if count else None
    root = walker.steps[0]
    moe = sp.expand(model.total - model.active) != 0
    return Derivation(
        name=model.name,
        family=model.recipe.family,
        title=model.recipe.title,
        flags=dict(model.flags),
        values=dict(model.values) if subs is not None else None,  # every value of the config (the estimate reads d_ff of an all-MoE model)
        symbols=tuple(model.symbols),
        chain=chain(model.tree, walker, root.placeholder, total_value),
        active_chain=chain(model.tree, walker, root.active_placeholder, active_value, active=True) if moe else None,
        steps=tuple(walker.steps),
        total=model.total,
        active=model.active,
        closed=closed_form(model.total, model.tree, subs, f"{model.name}: total", model=True),
        total_value=total_value,
        active_value=active_value,
        active_without_embedding=count.active_without_embedding if count else None,
        rows=table(model, count),
        estimate=estimate(model, subs, total_value),
        notes=model.notes,
        meanings={name: s.meaning for name, s in model.recipe.symbols.items()},
        translations={"zh": {**model.recipe.zh, **{s.meaning: s.zh for s in model.recipe.symbols.values() if s.zh}, **stored_zh}},
        storage=stored,
        memory=memory_section(model, memory),
    )


def memory_section(model: Model, settings: dict[str, Any] | None) -> Any:
    """The training step's memory, as memory.explain derives it, where asked for (it needs the config's values)."""
    if settings is None:
        return None
    if model.values is None:
        raise SymparamError("--memory: the training step needs a config's values (--model, --config or --set)")
    from symparam.memory.explain import memory_derivation

    return memory_derivation(model, **settings)


__all__ = ["ASSUMPTIONS", "Assumption", "Chain", "ClosedForm", "Derivation", "Storage", "Estimate", "Factor", "M", "Ref", "Row", "Step", "derive", "grouped"]
