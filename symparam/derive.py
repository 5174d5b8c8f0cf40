"""A model's tree as a top-down derivation: steps, closed forms under stated assumptions, the documents' estimate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction

import sympy as sp

from symparam.components import Term, leaves
from symparam.model import Model
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
    simplified: sp.Expr
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
    factors: tuple[Factor, ...]
    refs: tuple[Ref, ...]
    formula: sp.Expr  # factors and placeholders
    expanded: sp.Expr  # in the vocabulary's symbols, one copy
    active_formula: sp.Expr
    active_expanded: sp.Expr
    substituted: sp.Expr | None  # the expanded form with numbers in place, unevaluated
    value: int | None
    active_value: int | None
    closed: ClosedForm | None  # where an assumption simplifies it

    @property
    def has_active(self) -> bool:
        return sp.simplify(self.active_expanded - self.expanded) != 0


@dataclass(frozen=True)
class Row:
    """A line of the component table: total and active, with shares of the model's totals."""

    component: str
    formula: sp.Expr
    total: int
    active: int
    share: Fraction
    active_share: Fraction
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
class Derivation:
    """Everything a write-up of one model needs, computed; templates only lay it out."""

    name: str
    family: str
    title: str
    flags: dict[str, bool]
    values: dict[str, int] | None
    symbols: tuple[sp.Symbol, ...]
    steps: tuple[Step, ...]
    total: sp.Expr
    active: sp.Expr
    closed: ClosedForm
    total_value: int | None
    active_value: int | None
    active_without_embedding: int | None
    rows: tuple[Row, ...]
    estimate: Estimate

    @property
    def moe(self) -> bool:
        return sp.simplify(self.total - self.active) != 0

    @property
    def tied(self) -> bool:
        return bool(self.flags.get("tied"))


def exact(expr: sp.Expr, values: Mapping[sp.Symbol, int] | None, what: str = "") -> int | None:
    """An expression's integer value at the given values, or None without values; a fraction is a SymparamError."""
    return None if values is None else evaluate(expr, values, what)


def substituted(expr: sp.Expr, values: Mapping[sp.Symbol, int]) -> sp.Expr:
    """The expression with each symbol replaced by its number, kept unevaluated to show the step."""
    return sp.expand(expr).xreplace({s: sp.UnevaluatedExpr(sp.Integer(v)) for s, v in values.items()})


def simplify_under(expr: sp.Expr, assumptions=ASSUMPTIONS) -> tuple[sp.Expr, tuple[Assumption, ...]]:
    """The expression after each assumption's substitution that changes it, and which ones did."""
    used = []
    for a in assumptions:
        if a.needs not in expr.free_symbols:
            continue
        after = sp.expand(expr.subs(dict(a.subs)))
        if after != expr:
            expr, used = after, used + [a]
    return tidy(expr), tuple(used)


def tidy(expr: sp.Expr) -> sp.Expr:
    """Grouped the way the documents write it: by N, then by d^2."""
    return sp.collect(sp.expand(expr), N, func=lambda part: sp.collect(part, d**2))


def with_g(values: Mapping[sp.Symbol, int]) -> dict[sp.Symbol, int]:
    """The config's values plus g = h / h_kv where both are known."""
    out = dict(values)
    if h in out and h_kv in out:
        out[g] = out[h] // out[h_kv]
    return out


def closed_form(expr: sp.Expr, values: Mapping[sp.Symbol, int] | None, what: str = "") -> ClosedForm:
    simplified, used = simplify_under(sp.expand(expr))
    checks: tuple[Check, ...] = ()
    simplified_value = None
    if values is not None:
        full = with_g(values)
        checks = tuple(Check(a, int(a.lhs.xreplace(full)), int(a.rhs.xreplace(full))) for a in used)
        simplified_value = sp.Rational(simplified.xreplace(full))
    return ClosedForm(expr, simplified, used, checks, exact(expr, values, what), simplified_value)


def is_step(t: Term, bucket: str | None, root: bool = False) -> bool:
    """A module gets its own step when it is the model, repeated, a new component, or holds such modules."""
    if t.is_leaf:
        return False
    new_bucket = t.component is not None and t.component != bucket
    return root or t.times != 1 or new_bucket or any(is_step(c, t.component or bucket) for c in t.children)


def title(t: Term) -> str:
    """What a step is called: its component bucket where it starts one, else the module's label."""
    return t.component if t.component and t.component != "LM head" else t.label


class _Walker:
    """Builds the steps in document order (pre-order), one step per distinct module."""

    def __init__(self, name: str, values: Mapping[sp.Symbol, int] | None):
        self.name = name
        self.values = values
        self.steps: list[Step | None] = []
        self.seen: dict[tuple[Term, str | None], int] = {}

    def walk(self, t: Term, path: str, bucket: str | None) -> int:
        key = (t, bucket)
        if key in self.seen:
            return self.seen[key]
        index = len(self.steps)
        self.seen[key] = index
        self.steps.append(None)
        bucket = t.component or bucket
        factors: list[Factor] = []
        refs: list[Ref] = []
        self._collect(t, path, bucket, factors, refs, top=True)
        formula = sp.Add(*(f.count for f in factors), *(r.times * r.placeholder for r in refs))
        active_formula = sp.Add(*(f.count for f in factors), *(r.active_times * r.placeholder for r in refs))
        one = Term(t.key, t.label, t.note, t.shape, t.children, component=t.component, tied=t.tied)
        expanded, active_expanded = sp.expand(one.expr), sp.expand(one.active)
        what = f"{self.name}: {path}"
        closed = closed_form(expanded, self.values, what) if simplify_under(expanded)[1] else None
        self.steps[index] = Step(
            index=index,
            path=path,
            title=title(t),
            placeholder=sp.Symbol(f"P_{index}"),
            factors=tuple(factors),
            refs=tuple(refs),
            formula=formula,
            expanded=expanded,
            active_formula=active_formula,
            active_expanded=active_expanded,
            substituted=substituted(expanded, self.values) if self.values is not None else None,
            value=exact(expanded, self.values, what),
            active_value=exact(active_expanded, self.values, f"{what} (active)"),
            closed=closed,
        )
        return index

    def _collect(self, t: Term, path: str, bucket: str | None, factors: list[Factor], refs: list[Ref], top: bool) -> None:
        for c in t.children:
            sub = f"{path}.{c.key}"
            if is_step(c, bucket):
                what = f"{self.name}: copies of {sub}"
                times, active_times = exact(c.times, self.values, what), exact(c.active_times, self.values, f"{what} (active)")
                step = None if times == 0 == active_times else self.walk(c, sub, bucket)
                placeholder = self.steps[step].placeholder if step is not None and self.steps[step] else sp.Symbol(f"P_{len(self.steps)}_{len(refs)}")
                refs.append(Ref(step, title(c), placeholder, c.times, c.active_times))
            elif c.is_leaf:
                count = c.each
                factors.append(Factor(c.label, c.note, c.shape, count, c.tied, exact(count, self.values, f"{self.name}: {sub}")))
            else:
                self._collect(c, sub, c.component or bucket, factors, refs, top=False)


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
    if subs is None or "d_ff" not in (model.values or {}):
        return Estimate(ESTIMATE, None, None, exact_total, tuple(checks))
    subs = {**subs, d_ff: model.values["d_ff"]}  # the config's d_ff, even where no dense layer is built (M of the estimate)
    multiplier = Fraction(subs[d_ff], subs[d])
    value = ESTIMATE.xreplace({**subs, M: sp.Rational(subs[d_ff], subs[d])})
    return Estimate(ESTIMATE, multiplier, Fraction(int(value.p), int(value.q)), exact_total, tuple(checks))


def table(model: Model, total: int, active: int) -> tuple[Row, ...]:
    """The component table; empty buckets are left out, a tied head is kept and marked."""
    count = model.count()
    rows = []
    for c, n in count.components.items():
        a = count.active_components[c]
        tied = c == "LM head" and bool(model.flags.get("tied"))
        if n or a or tied:
            rows.append(Row(c, tidy(model.components[c]), n, a, Fraction(n, total), Fraction(a, active), tied))
    return tuple(rows)


def derive(model: Model) -> Derivation:
    """The derivation of a model: symbolic always, with numbers when the model has values."""
    subs = model.substitution() if model.values is not None else None
    walker = _Walker(model.name, subs)
    walker.walk(model.tree, "model", None)
    count = model.count() if subs is not None else None
    total_value = count.total if count else None
    active_value = count.active if count else None
    return Derivation(
        name=model.name,
        family=model.recipe.family,
        title=model.recipe.title,
        flags=dict(model.flags),
        values={str(s): int(v) for s, v in subs.items()} if subs is not None else None,
        symbols=tuple(model.symbols),
        steps=tuple(walker.steps),
        total=model.total,
        active=model.active,
        closed=closed_form(model.total, subs, f"{model.name}: total"),
        total_value=total_value,
        active_value=active_value,
        active_without_embedding=count.active_without_embedding if count else None,
        rows=table(model, total_value, active_value) if count else (),
        estimate=estimate(model, subs, total_value),
    )


__all__ = ["ASSUMPTIONS", "Assumption", "ClosedForm", "Derivation", "Estimate", "Factor", "M", "Ref", "Row", "Step", "derive"]
