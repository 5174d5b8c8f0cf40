"""What-if: solve the total for one symbol, sensitivities d(total)/d(symbol), and exact vectorised sweeps over configs."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import sympy as sp

from symparam.config import resolve
from symparam.errors import SymparamError
from symparam.files import read_text, shown
from symparam.model import Model
from symparam.recipes import Recipe
from symparam.rules import compile_rule, lookup_in, message_text
from symparam.symbols import BY_NAME, MAX_RESULT, MAX_VALUE, SYMBOLS, make, parse, symbol as lookup
from symparam.symbols import evaluate as exactly

# Divisibility a design must keep: (symbol, the symbol it must be a multiple of, why).
CONSTRAINTS = (
    ("d", "h", "the hidden size splits into h query heads"),
    ("h", "h_kv", "query heads come in groups of g = h/h_kv per key/value head"),
)
INT64_MAX = 2**63 - 1
MAX_STEPS = 100_000  # how far solve walks from a root to the nearest value meeting the constraints
MAX_COUNTS = 400  # exact counts (each a config resolution, ~20 ms) solve makes at most: an answer within seconds
MAX_TARGET = 10**18  # the largest total solve aims at: a million times today's largest models
MAX_ROWS = 1_000_000  # rows of a sweep (a grid's combinations, a CSV's rows): 10^6 rows take about a second and 100 MB
MAX_CSV = 256 * 2**20  # bytes of a CSV of rows read at most

__all__ = ["solve", "Solution", "sensitivity", "sensitivities", "Sensitivity", "sweep", "sweep_config", "compile_count", "evaluate",
           "grid", "derived", "follow", "CONSTRAINTS"]


def derived(recipe: Recipe, config: Mapping[str, Any] | None = None, sets: Mapping[str, Any] | None = None) -> dict[str, sp.Expr]:
    """Symbols the config leaves to their default formula (h_d = d/h, h_kv = h, d_ff = 4d): they follow their inputs."""
    merged, sets = {**recipe.defaults, **(config or {})}, sets or {}
    return {
        s.name: parse(s.fallback, known=make)
        for s in recipe.symbols.values()
        if s.fallback and s.name not in sets and not any(merged.get(k) is not None for k in s.keys)
    }


def rules(recipe: Recipe) -> dict[str, set[str]]:
    """Layer-count symbols (N_dense, N_swa, N_linear, ...) and the symbols their rules read: N, and those read from the
    config keys the rule names (N_swa reads W through sliding_window). They change with those, not polynomially."""
    return {name: {"N"} | {s for s, d in recipe.symbols.items() if set(d.keys) & set(rule.reads)} for name, rule in recipe.layer_symbols.items()}


def follow(expr: sp.Expr, formulas: Mapping[str, sp.Expr], only: set[str] | None = None) -> sp.Expr:
    """`expr` with derived symbols replaced by their formulas (those depending on `only`, if given), to a fixed point."""
    for _ in range(len(formulas) + 1):
        subs = {make(name): f for name, f in formulas.items() if make(name) in expr.free_symbols and (only is None or _depends(name, formulas, only))}
        if not subs:
            return expr
        expr = expr.xreplace(subs)
    raise SymparamError("derived symbols refer to each other in a cycle")


def _depends(name: str, formulas: Mapping[str, sp.Expr], on: set[str], seen: frozenset = frozenset()) -> bool:
    """Whether derived symbol `name` depends, through the formulas, on any symbol in `on`."""
    if name in seen:
        return False
    inputs = {str(s) for s in formulas[name].free_symbols}
    return bool(inputs & on) or any(_depends(i, formulas, on, seen | {name}) for i in inputs if i in formulas)


def meets(values: Mapping[str, int]) -> list[str]:
    """The constraints `values` break, in words (empty when all hold)."""
    return [
        f"{a} = {values[a]} is not a multiple of {b} = {values[b]} ({why})"
        for a, b, why in CONSTRAINTS
        if a in values and b in values and values[a] % values[b]
    ]


def _ruled(recipe: Recipe, model: Model, values: Mapping[str, int], given: set[str], inputs: set[str]) -> list[str]:
    """Symbols config.resolve sets by a layout rule reading any of `inputs`, that the counts use and nobody gave."""
    used = {str(s) for s in model.symbols}
    return [s for s, reads in rules(recipe).items() if s in values and s in used and s not in given and reads & inputs]


# --- solve -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solution:
    """The integer values of one symbol closest to a target total, and the equation solved."""

    symbol: str
    target: int
    equation: sp.Expr  # total as a function of the symbol alone, the other values substituted
    general: sp.Expr  # the model's total in all symbols
    roots: list[float]  # real positive solutions of equation = target
    candidates: list[tuple[int, int]]  # (value, exact total): the closest allowed values and their allowed neighbours
    fixed: dict[str, int]  # the other symbols' values
    follows: dict[str, sp.Expr]  # derived symbols that move with the solved one
    rules: dict[str, int] = field(default_factory=dict)  # symbols a layout rule sets from the solved one (N_dense), at the best value

    @property
    def best(self) -> tuple[int, int]:
        return min(self.candidates, key=lambda c: (abs(c[1] - self.target), c[0]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol, "target": self.target, "equation": str(self.equation), "general": str(self.general),
            "roots": self.roots, "best": {"value": self.best[0], "total": self.best[1]},
            "candidates": [{"value": v, "total": t, "off": t - self.target} for v, t in self.candidates],
            "fixed": self.fixed, "follows": {k: str(v) for k, v in self.follows.items()}, "rules": self.rules,
        }


def solve(recipe: Recipe, symbol: str, target: int, config: Mapping[str, Any] | None = None, sets: Mapping[str, int] | None = None) -> Solution:
    """Integer values of `symbol` whose exact total is closest to `target`, keeping CONSTRAINTS and the config's rules.

    Every candidate is counted by the ordinary path (config.resolve with the value set, then Model.count). The equation
    gives the starting points; when a layout rule sets a symbol from the solved one (N_dense from N), the total is only
    piecewise a polynomial, so the start comes from a search over exact counts instead. From each start, the search moves
    to an allowed neighbour while that is strictly closer to the target.
    """
    sym, config, sets = lookup(symbol), dict(config or {}), {k: v for k, v in (sets or {}).items() if k != symbol}
    if not 0 < target <= MAX_TARGET:
        raise SymparamError(f"--target: expected a number of parameters from 1 to {MAX_TARGET:.0e}, got {target:.3e}")
    fixed_by = _fixed_by(recipe, config, symbol)
    if fixed_by is not None:
        raise SymparamError(f"--for {symbol}: fixed by the config: its {fixed_by[0]} has {fixed_by[1]} entries, one per layer; "
                            f"solve on a config without {fixed_by[0]} to let {symbol} change")
    formulas = derived(recipe, config, {**sets, symbol: 0})
    base = _resolve_around(recipe, config, sets, symbol)
    model = Model(recipe, base.flags)
    if sym not in follow(model.total, formulas).free_symbols:
        raise SymparamError(f"--for {symbol}: the {recipe.title} total does not depend on {symbol}")
    moving = {name for name in formulas if _depends(name, formulas, {symbol})}
    ruled = _ruled(recipe, model, base.values, set(sets) | {symbol}, {symbol})
    fixed = {k: v for k, v in base.values.items() if k != symbol and k not in moving and k not in ruled}
    general = follow(model.total, formulas, {symbol}).xreplace({make(k): sp.Integer(v) for k, v in fixed.items()})
    counted: dict[int, tuple[int, dict[str, int]] | None] = {}
    resolved = [0]  # configs resolved so far (each ~20 ms): at most MAX_COUNTS

    def exact(value: int) -> int | None:
        """The total at `value` by the full path (config resolution, exact count), or None if the value is not allowed."""
        if value < 1 or value > MAX_VALUE:
            return None
        if value not in counted:
            trial = {**fixed, symbol: value, **{m: _value(formulas[m], {**fixed, symbol: value}) for m in moving}}
            counted[value] = None
            if not any(trial[m] is None for m in moving) and not meets(trial):  # cheap checks before resolving
                resolved[0] += 1
                if resolved[0] > MAX_COUNTS:
                    raise SymparamError(f"--for {symbol}: no answer within {MAX_COUNTS} exact counts (the config refuses most values of {symbol} near {value:,})")
                try:
                    r = resolve(config, recipe, {**sets, symbol: value})
                    counted[value] = (Model.from_resolved(r).count().total if r.flags != base.flags else model.count(r.values).total,
                                      {s: r.values[s] for s in ruled})
                except SymparamError:
                    pass
        hit = counted[value]
        return None if hit is None else hit[0]

    def step(value: int, direction: int) -> tuple[int, int] | None:
        """The nearest allowed value beyond `value` in `direction`, with its exact total."""
        for _ in range(MAX_STEPS):
            value += direction
            if value < 1:
                return None
            total = exact(value)
            if total is not None:
                return value, total
        return None

    def closest(start: int) -> tuple[int, int] | None:
        """From `start`, move to an allowed neighbour while it is strictly closer to the target (ties to the smaller)."""
        here = (start, exact(start)) if exact(start) is not None else None
        around = [c for c in (step(start, -1), step(start, 1)) if c is not None]
        if here is None:
            if not around:
                return None
            here = min(around, key=lambda c: (abs(c[1] - target), c[0]))
        for _ in range(MAX_STEPS):
            nearer = [c for c in (step(here[0], -1), step(here[0], 1)) if c is not None and (abs(c[1] - target), c[0]) < (abs(here[1] - target), here[0])]
            if not nearer:
                return here
            here = min(nearer, key=lambda c: (abs(c[1] - target), c[0]))
        return here

    if ruled:
        starts = [_crossing(exact, target)]
    else:
        equation = general
        roots = _roots(equation, sym, target)
        if not roots:
            raise SymparamError(f"--for {symbol}: no positive {symbol} gives {target:,} parameters")
        starts = [max(1, round(r)) for r in roots]
    candidates: dict[int, int] = {}
    for start in dict.fromkeys(starts):
        found = closest(start)
        if found is None:
            continue
        candidates[found[0]] = found[1]
        for direction in (-1, 1):
            neighbour = step(found[0], direction)
            if neighbour is not None:
                candidates[neighbour[0]] = neighbour[1]
    if not candidates:
        raise SymparamError(f"--for {symbol}: no allowed value near {starts[0]} meets the constraints")
    best = min(candidates.items(), key=lambda c: (abs(c[1] - target), c[0]))
    rules = counted[best[0]][1]
    equation = general.xreplace({make(s): sp.Integer(v) for s, v in rules.items()})
    if ruled:
        roots = _roots(equation, sym, target)
        if not roots:
            raise SymparamError(f"--for {symbol}: no positive {symbol} gives {target:,} parameters")
    if equation.xreplace({sym: best[0]}) != best[1]:
        raise SymparamError(f"--for {symbol}: the equation gives {equation.xreplace({sym: best[0]})} at {symbol} = {best[0]}, the exact count {best[1]:,}")
    return Solution(symbol, target, equation, model.total, roots, sorted(candidates.items()), fixed, {m: formulas[m] for m in moving}, rules)


def _fixed_by(recipe: Recipe, config: Mapping[str, Any], symbol: str) -> tuple[str, int] | None:
    """The config's per-layer list that fixes `symbol`, and its length: a [lists] entry whose length is a formula in the
    symbol, or (for N, the layers) a list a layer rule reads at layer i (layer_types[i], hybrid_override_pattern[i])."""
    read = lookup_in({**recipe.defaults, **config})
    keys = [key for key, spec in recipe.lists.items() if make(symbol) in parse(spec["length"], known=make).free_symbols]
    if symbol == "N":
        keys += [key for rule in (*recipe.layer_symbols.values(), *recipe.per_layer_symbols.values()) for key in rule.indexed]
    return next(((key, len(read(key))) for key in dict.fromkeys(keys) if isinstance(read(key), (list, str))), None)


def _roots(equation: sp.Expr, sym: sp.Symbol, target: int) -> list[float]:
    """Real positive solutions of equation = target."""
    x = sp.Symbol(str(sym), positive=True)  # real, not integer: sympy would drop the non-integer roots
    return sorted(float(r) for r in sp.solve(sp.Eq(equation.xreplace({sym: x}), target), x) if r.is_real and r > 0)


def _crossing(exact, target: int) -> int:
    """Where the exact total first reaches `target`, searching doubling then halving (the total grows with the layers)."""
    low, high = 1, 1
    for _ in range(64):
        total = exact(high)
        if total is not None and total >= target:
            break
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        total = exact(middle)
        if total is not None and total >= target:
            high = middle
        else:
            low = middle
    return high


def _value(formula: sp.Expr, values: Mapping[str, int]) -> int | None:
    """A derived symbol's value, or None when its formula is not a whole positive number there."""
    try:
        result = exactly(formula, {k: v for k, v in values.items() if str(k) in SYMBOLS})
    except SymparamError:
        return None
    return result if result > 0 else None


def _resolve_around(recipe: Recipe, config: dict[str, Any], sets: dict[str, int], symbol: str):
    """The config resolved with a stand-in value for the solved symbol (one that passes the config's checks)."""
    given = [v for v in sets.values() if v > 0]
    guesses = [config_value for config_value in (_config_value(recipe, config, symbol),) if config_value] + [1, math.prod(given) if given else 1, *given]
    first = None
    for guess in dict.fromkeys(guesses):
        try:
            return resolve(config, recipe, {**sets, symbol: guess})
        except SymparamError as e:
            first = first or e
    raise first


def _config_value(recipe: Recipe, config: Mapping[str, Any], symbol: str) -> int | None:
    merged = {**recipe.defaults, **config}
    return next((merged[k] for k in recipe.config_keys(symbol) if type(merged.get(k)) is int), None)


# --- sensitivity -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sensitivity:
    """d(total)/d(symbol): the formula, and at a config its value, the exact change for +1, and the elasticity."""

    symbol: str
    derivative: sp.Expr
    at: sp.Rational | None  # the derivative at the config
    step: int | None  # total(symbol + 1) - total(symbol), exact
    elasticity: float | None  # % change of the total per 1 % change of the symbol

    def as_dict(self) -> dict[str, Any]:
        return {"symbol": self.symbol, "derivative": str(self.derivative), "at": None if self.at is None else str(self.at),
                "step": self.step, "elasticity": self.elasticity}


def sensitivity(model: Model, symbol: str, formulas: Mapping[str, sp.Expr] | None = None) -> Sensitivity:
    """d(total)/d(symbol), with derived symbols (h_d = d/h, ...) following their inputs; at the model's values if it has them."""
    sym = lookup(symbol)
    total = follow(model.total, formulas or {})
    derivative = sp.simplify(sp.diff(total, sym))
    if model.values is None:
        return Sensitivity(symbol, derivative, None, None, None)
    values = {make(k): sp.Integer(v) for k, v in model.values.items() if k in SYMBOLS}
    at = derivative.xreplace(values)
    here, there = total.xreplace(values), total.xreplace({**values, sym: values[sym] + 1})
    elasticity = float(at * values[sym] / here) if here else None
    return Sensitivity(symbol, derivative, sp.nsimplify(at), int(there - here) if (there - here).is_Integer else None, elasticity)


def sensitivities(model: Model, formulas: Mapping[str, sp.Expr] | None = None, symbols: list[str] | None = None) -> list[Sensitivity]:
    """Sensitivity to each independent symbol of the model (derived ones follow their inputs)."""
    formulas = formulas or {}
    free = follow(model.total, formulas).free_symbols
    names = symbols or [str(s) for s in SYMBOLS.values() if s in free]
    for name in names:
        if lookup(name) not in free:
            depends = ", ".join(str(s) for s in SYMBOLS.values() if s in free)
            why = f"{name} follows {formulas[name]} (not set in the config)" if name in formulas else f"the {model.recipe.title} total does not depend on {name}"
            raise SymparamError(f"--for {name}: {why}; it depends on {depends}")
    return [sensitivity(model, name, formulas) for name in names]


# --- sweeps ----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Compiled:
    """A polynomial count compiled to numpy, with what the overflow guard needs: its monomials."""

    expr: sp.Expr
    symbols: tuple[str, ...]
    monomials: tuple[tuple[int, tuple[int, ...]], ...]  # (coefficient, exponent per symbol)
    function: Any

    def bound(self, columns: Mapping[str, np.ndarray]) -> int:
        """An upper bound on |every intermediate| of the evaluation: sum over monomials of |c| * prod max(|x|, 1)^e."""
        top = [max(1, _largest(columns[s])) for s in self.symbols]
        return sum(abs(c) * math.prod(t**e for t, e in zip(top, exps)) for c, exps in self.monomials)


def _largest(column: np.ndarray) -> int:
    """max |x| over a column (one look for a broadcast constant)."""
    column = np.asarray(column)
    if not column.size:
        return 0
    if column.ndim == 1 and column.strides == (0,):
        return abs(int(column[0]))
    return int(np.max(np.abs(column)))


@functools.lru_cache(maxsize=64)
def compile_count(expr: sp.Expr) -> Compiled:
    """`expr` (a polynomial with integer coefficients) as a numpy function of its symbols, in vocabulary order."""
    names = tuple(str(s) for s in SYMBOLS.values() if s in expr.free_symbols)
    syms = [SYMBOLS[n] for n in names]
    poly = sp.Poly(sp.expand(expr), *syms) if syms else None
    if poly is not None and not all(c.is_Integer for c in poly.coeffs()):
        raise SymparamError(f"sweep: {expr} has fractional coefficients; give the derived symbols as columns")
    monomials = tuple((int(c), m) for m, c in poly.terms()) if poly is not None else ((int(expr), ()),)
    return Compiled(expr, names, monomials, sp.lambdify(syms, sp.expand(expr), "numpy"))


def evaluate(compiled: Compiled, columns: Mapping[str, np.ndarray], on_overflow: str = "fallback") -> np.ndarray:
    """The compiled count over columns: int64 when the bound fits, else exact Python ints (object) or an error."""
    missing = [s for s in compiled.symbols if s not in columns]
    if missing:
        raise SymparamError(f"sweep: no values for {', '.join(missing)}")
    bound = compiled.bound(columns)
    if bound.bit_length() > MAX_RESULT:
        raise SymparamError(f"sweep: {compiled.expr} could reach {bound.bit_length():,} bits at these rows; no model is that large (at most {MAX_RESULT:,} bits)")
    if bound <= INT64_MAX:
        args = [np.asarray(columns[s], dtype=np.int64) for s in compiled.symbols]
        size = max((len(a) for a in args), default=1)
        return np.broadcast_to(np.asarray(compiled.function(*args), dtype=np.int64), (size,)).copy()
    if on_overflow == "raise":
        raise SymparamError(f"sweep: intermediates could reach {bound:.3e}, beyond int64 ({INT64_MAX:.3e}); use exact Python integers (on_overflow='fallback')")
    args = [np.array([int(x) for x in columns[s]], dtype=object) for s in compiled.symbols]
    return np.asarray(compiled.function(*args), dtype=object)


def fill(model: Model, columns: Mapping[str, Any], formulas: Mapping[str, sp.Expr] | None = None,
         given: Mapping[str, Any] | None = None, names: set[str] | None = None) -> dict[str, np.ndarray]:
    """Every symbol the model needs (or `names`) as an array: the columns, then derived formulas over them, then `given`
    (scalars or per-row arrays; default the model's values). A derived symbol that is not a whole number is an error."""
    out, size = _columns(columns)
    formulas = formulas or {}
    formulas = {name: follow(f, formulas, set(out)) for name, f in formulas.items()}
    given = (model.values or {}) if given is None else given
    wanted = [str(s) for s in model.symbols] if names is None else [s for s in SYMBOLS if s in names]
    for name in wanted:
        if name in out:
            continue
        if name in formulas and {str(s) for s in formulas[name].free_symbols} & set(out):
            out[name] = _derive(name, formulas[name], {**_broadcast(given, formulas[name], size), **out}, size)
        elif name in given:
            out[name] = _full(given[name], size)
        else:
            raise SymparamError(f"sweep: no values for {name}; add a column or --set {name}=...")
    return out


def _columns(columns: Mapping[str, Any]) -> tuple[dict[str, np.ndarray], int]:
    """The columns as arrays of one length, each value an allowed integer for its symbol (N_dense may be 0, N not)."""
    out = {}
    for name, values in columns.items():
        lookup(name)
        out[name] = _column(name, values)
    sizes = {len(a) for a in out.values() if len(a) != 1}
    if len(sizes) > 1:
        raise SymparamError(f"sweep: columns of different lengths ({', '.join(f'{n}: {len(a)}' for n, a in out.items())})")
    size = sizes.pop() if sizes else 1
    if size > MAX_ROWS:
        raise SymparamError(f"sweep: {size:,} rows; a sweep takes at most {MAX_ROWS:,}")
    if any(len(a) == 0 for a in out.values()) or not out:
        raise SymparamError("sweep: no rows")
    return {name: np.broadcast_to(a, (size,)) if len(a) == 1 else a for name, a in out.items()}, size


def _column(name: str, values: Any) -> np.ndarray:
    """One column as int64; a value that is not an integer, below the symbol's least (N_dense may be 0, N not) or above
    MAX_VALUE is an error naming its row."""
    array = np.atleast_1d(np.asarray(values))
    if array.dtype.kind not in "iu":
        array = np.atleast_1d(np.asarray(values, dtype=object))
        if not all(type(x) is int or isinstance(x, np.integer) for x in array):
            raise SymparamError(f"sweep: column {name} must hold integers")
    low = 0 if BY_NAME[name].zero else 1
    bad = (array < low) | (array > MAX_VALUE)
    if array.size and bad.any():
        row = int(np.argmax(bad))
        raise SymparamError(f"sweep: row {row}: {name} = {shown(str(array[row]))}: expected a {'non-negative' if low == 0 else 'positive'} integer "
                            f"of at most {MAX_VALUE:,} ({BY_NAME[name].meaning})")
    return array.astype(np.int64)


def _full(value: Any, size: int) -> np.ndarray:
    """A scalar as a column (int64, or exact objects beyond it); an array as it is."""
    if isinstance(value, np.ndarray):
        return value
    return np.broadcast_to(np.array(value, dtype=np.int64 if abs(value) <= INT64_MAX else object), (size,))  # no copy


def _broadcast(given: Mapping[str, Any], expr: sp.Expr, size: int) -> dict[str, np.ndarray]:
    return {str(s): _full(given[str(s)], size) for s in expr.free_symbols if str(s) in given}


def _ratio(expr: sp.Expr) -> tuple[Compiled, Compiled]:
    """Numerator and denominator of `expr` as compiled integer polynomials."""
    num, den = sp.fraction(sp.together(expr))
    return compile_count(num), compile_count(den)


def _derive(name: str, formula: sp.Expr, columns: Mapping[str, np.ndarray], size: int) -> np.ndarray:
    """A derived symbol per row, exactly: numerator and denominator as integers, and a check that it divides."""
    top, bottom = (np.broadcast_to(evaluate(c, columns), (size,)) for c in _ratio(formula))
    bad = top % bottom != 0
    if np.any(bad):
        row = int(np.argmax(bad))
        used = ", ".join(f"{s}={columns[str(s)][row]}" for s in sorted(formula.free_symbols, key=str))
        raise SymparamError(f"sweep: row {row}: {name} = {formula} is not a whole number at {used}; add a {name} column")
    return top // bottom


def _needed(model: Model, unknown: Mapping[str, str], columns: Mapping[str, Any]) -> set[str]:
    """The symbols config.resolve gives a value and checks for this model (as resolve's `needed`): what only `active`
    needs and the config does not set (k) is left out unless a column gives it."""
    needed = {str(s) for s in model.tree.expr.free_symbols | model.tree.active.free_symbols} - (set(unknown) - set(columns))
    return needed | {name for rule in model.recipe.checks for name in compile_rule(rule, "check").reads if name in model.recipe.symbols and name in (model.values or {})}


def _fractional_shapes(model: Model) -> list[tuple[str, sp.Expr]]:
    """(path, dimension) for every tensor dimension that is a fraction (d*h_kv/h), each once."""
    found: dict[sp.Expr, str] = {}

    def walk(term, path: str) -> None:
        path = f"{path}.{term.key}" if path else term.key
        for dim in term.shape:
            if dim not in found and sp.fraction(sp.together(dim))[1] != 1:
                found[dim] = path
        for child in term.children:
            walk(child, path)

    walk(model.tree, "")
    return [(path, dim) for dim, path in found.items()]


def check(model: Model, values: Mapping[str, np.ndarray], used: set[str]) -> None:
    """Every row as config.resolve checks one config: heads divide, k <= n, N_dense <= N, whole tensor sizes."""

    def refuse(bad: np.ndarray, text) -> None:
        if np.any(bad):
            row = int(np.argmax(bad))
            raise SymparamError(f"sweep: row {row}: {text(row)}")

    for text, message in model.recipe.checks.items():
        rule = compile_rule(text, "check")
        if set(rule.reads) <= used & set(values):
            columns = {name: np.asarray(values[name]) for name in rule.reads}
            try:  # comparisons and arithmetic work on whole columns
                held = np.broadcast_to(np.asarray(rule(columns.get), dtype=bool), (len(next(iter(values.values()))),))
            except (SymparamError, ValueError):  # and/or and chained comparisons need one row at a time
                held = np.array([bool(rule(lambda k, i=i: columns[k][i])) for i in range(len(next(iter(values.values()))))])
            refuse(~held, lambda i: message_text(message, {name: int(c[i]) for name, c in columns.items()}))
    for name in set(model.recipe.layer_symbols) & used & set(values):
        if "N" in values:
            layers, counted = values["N"], values[name]
            refuse(counted > layers, lambda i: f"{name} = {counted[i]} {model.recipe.symbols[name].meaning} is more than the N = {layers[i]} layers")
    for path, dim in _fractional_shapes(model):
        if {str(s) for s in dim.free_symbols} <= set(values):
            top, bottom = (evaluate(c, values) for c in _ratio(dim))
            refuse(top % bottom != 0, lambda i: f"{path}: its size {dim} is not a whole number at "
                   + ", ".join(f"{s}={values[str(s)][i]}" for s in sorted(dim.free_symbols, key=str)))


def _counts(model: Model, values: Mapping[str, np.ndarray], on_overflow: str) -> dict[str, np.ndarray | None]:
    """Total and active per row; active is None where it needs a symbol no row gives (k of a config without it). A row
    whose values contradict each other into a negative count is an error (checked rows never do: the last guard, as in
    Model.count)."""
    total = evaluate(compile_count(model.total), values, on_overflow)
    if {str(s) for s in model.active.free_symbols} - set(values):
        active = None
    else:
        active = total if model.active == model.total else evaluate(compile_count(model.active), values, on_overflow)
    for name, column in (("total", total), ("active", active)):
        if column is None:
            continue
        below = np.asarray(column < 0, dtype=bool)
        if below.any():
            row = int(np.argmax(below))
            raise SymparamError(f"sweep: row {row}: {name} is {int(column[row]):,}; its values contradict each other (a layer count above N?)")
    return {"total": total, "active": active}


def sweep(model: Model, columns: Mapping[str, Any], formulas: Mapping[str, sp.Expr] | None = None, on_overflow: str = "fallback") -> dict[str, np.ndarray]:
    """Exact total and active counts for every row of `columns` (symbol -> array), vectorised, each row checked.

    A row is the model's values with the row's columns put in, as `model.count(values)` takes them; derived `formulas`
    (h_d = d/h, ...) follow their inputs. What the config's layout rules set (N_dense, N_swa) stays as the model has it:
    for exactly what `symparam count` gives with each row set, use `sweep_config`.
    """
    needed = _needed(model, model.unknown, columns)
    values = fill(model, columns, formulas, names=needed | {str(s) for s in model.symbols} - (set(model.unknown) - set(columns)))
    check(model, values, needed | set(columns))
    return _counts(model, values, on_overflow)


def sweep_config(recipe: Recipe, config: Mapping[str, Any], columns: Mapping[str, Any], sets: Mapping[str, int] | None = None,
                 on_overflow: str = "fallback") -> dict[str, np.ndarray]:
    """Exact total and active counts for every row, each what `resolve(config, recipe, {**sets, **row})` counts to.

    Default formulas (h_d = d/h, d_ff = 4d, h_kv = h) over the columns are computed per row; symbols a layout rule sets
    (N_dense from N) are resolved once per distinct value of the columns the rule reads; every row is checked as resolve
    checks a config, and an error names the row.
    """
    cols, size = _columns(columns)
    config, sets = dict(config), {k: v for k, v in (sets or {}).items() if k not in cols}
    base = _resolve_row(config, recipe, sets, cols, 0)
    model = Model(recipe, base.flags)  # every layer kind: a row may have layers the first row has none of
    follows = rules(recipe)
    reads = {i for s in _ruled(recipe, model, base.values, set(sets) | set(cols), set(cols)) for i in follows[s]} & set(cols)
    firsts, inverse = _distinct([cols[k] for k in sorted(reads)], size)
    resolved = [base if i == 0 else _resolve_row(config, recipe, sets, cols, i) for i in firsts]
    given = {}
    for name in base.values:
        column = [r.values[name] for r in resolved]
        given[name] = column[0] if len(set(column)) == 1 else np.array(column, dtype=object if max(map(abs, column)) > INT64_MAX else np.int64)[inverse]
    formulas = {k: f for k, f in derived(recipe, config, {**sets, **cols}).items() if k in base.values}
    needed = _needed(model, base.unknown, cols)
    values = fill(model, cols, formulas, given, needed | {str(s) for s in model.symbols} - (set(base.unknown) - set(cols)))
    check(model, values, needed | set(sets) | set(cols))
    return _counts(model, values, on_overflow)


def _resolve_row(config: dict[str, Any], recipe: Recipe, sets: Mapping[str, int], cols: Mapping[str, np.ndarray], row: int):
    try:
        return resolve(config, recipe, {**sets, **{name: int(col[row]) for name, col in cols.items()}})
    except SymparamError as e:
        raise SymparamError(f"sweep: row {row}: {e}") from None


def _distinct(keys: list[np.ndarray], size: int) -> tuple[list[int], np.ndarray]:
    """The first row of each distinct combination of `keys` (in row order), and each row's combination index."""
    if not keys:
        return [0], np.zeros(size, dtype=np.intp)
    if all(k.dtype != object for k in keys):
        code = keys[0]
        for key in keys[1:]:  # one int64 code per combination: np.unique over rows (axis=0) is many times slower
            seen, which = np.unique(key, return_inverse=True)
            code = np.unique(code, return_inverse=True)[1].reshape(-1) * len(seen) + which.reshape(-1)
        _, firsts, inverse = np.unique(code, return_index=True, return_inverse=True)
        inverse = inverse.reshape(-1)
    else:
        index: dict[tuple[int, ...], int] = {}
        inverse = np.array([index.setdefault(tuple(int(k[i]) for k in keys), len(index)) for i in range(size)], dtype=np.intp)
        firsts = np.array([int(np.argmax(inverse == j)) for j in range(len(index))])
    order = np.argsort(firsts, kind="stable")
    rank = np.empty_like(order)
    rank[order] = np.arange(len(order))
    return [int(firsts[j]) for j in order], rank[inverse]


def grid(specs: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Columns for every combination of `symbol -> "a:b:step"` (b included) or `"x,y,z"`; at most MAX_ROWS of them,
    counted before anything is made."""
    axes: dict[str, Sequence[int]] = {}
    for name, spec in specs.items():
        lookup(name)
        try:
            if ":" in spec:
                start, stop, *step = (int(x) for x in spec.split(":"))
                axes[name] = range(start, stop + 1, step[0] if step else 1)
            else:
                axes[name] = [int(x) for x in spec.split(",")]
        except ValueError:
            raise SymparamError(f"--grid {name}={shown(spec)}: expected START:STOP[:STEP] or a,b,c of integers (a step other than 0)") from None
        if not axes[name]:
            raise SymparamError(f"--grid {name}={shown(spec)}: no values")
        values = axes[name]
        low, high = (min(values), max(values)) if isinstance(values, list) else sorted((values[0], values[-1]))  # a range's ends, not its items
        if low < 0 or high > MAX_VALUE:
            raise SymparamError(f"--grid {name}={shown(spec)}: values from 0 to {MAX_VALUE:,}")
    rows = math.prod(len(a) for a in axes.values())
    if rows > MAX_ROWS:
        raise SymparamError(f"--grid: {rows:,} combinations; a sweep takes at most {MAX_ROWS:,} rows (split the grid)")
    mesh = np.meshgrid(*[np.array(v, dtype=np.int64) for v in axes.values()], indexing="ij")
    return {name: m.ravel() for name, m in zip(axes, mesh)}


# --- text and CSV for the command line --------------------------------------------------------------------------


def solution_text(sol: Solution) -> str:
    """A solution as lines: the equation, its roots, the nearest allowed values with their exact totals."""
    lines = [f"solve total({sol.symbol}) = {sol.target:,}", f"general:  total = {sol.general}"]
    if sol.follows:
        lines.append("follows:  " + ", ".join(f"{k} = {v}" for k, v in sol.follows.items()) + " (not set in the config)")
    lines.append("fixed:    " + ", ".join(f"{k}={v}" for k, v in sol.fixed.items() if make(k) in sol.general.free_symbols))
    if sol.rules:
        lines.append("rules:    " + ", ".join(f"{k} = {v}" for k, v in sol.rules.items())
                     + f" at {sol.symbol} = {sol.best[0]} (the family's layout rule, recomputed at every {sol.symbol})")
    lines.append(f"equation: {sol.equation} = {sol.target}")
    lines.append(f"roots:    {', '.join(f'{sol.symbol} = {r:.4f}' for r in sol.roots)}")
    rules = [f"{a} a multiple of {b}" for a, b, _ in CONSTRAINTS]
    lines.append(f"nearest allowed values ({'; '.join(rules)}; checked by exact count):")
    for value, total in sol.candidates:
        mark = "  <- closest" if (value, total) == sol.best else ""
        lines.append(f"  {sol.symbol} = {value:<8} total {total:>20,}  ({100 * (total - sol.target) / sol.target:+.3f}%){mark}")
    return "\n".join(lines)


def sensitivity_text(items: list[Sensitivity], formulas: Mapping[str, sp.Expr]) -> str:
    """Sensitivities as a table: symbol, d(total)/d(symbol), its value, the exact +1 step, the elasticity."""
    lines = [f"{k} = {v} follows its inputs (not set in the config)" for k, v in formulas.items()]
    rows = [("symbol", "d(total)/d(symbol)", "at config", "+1 exact", "elasticity")]
    for s in items:
        rows.append((s.symbol, str(s.derivative), "" if s.at is None else f"{float(s.at):,.1f}" if not s.at.is_Integer else f"{int(s.at):,}",
                     "" if s.step is None else f"{s.step:,}", "" if s.elasticity is None else f"{s.elasticity:.4f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines += ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    return "\n".join(lines)


def read_csv(path: str) -> dict[str, np.ndarray]:
    """A CSV with a header of symbol names and integer rows, as columns (exact Python ints beyond int64)."""
    import csv
    import io

    text = read_text(path, MAX_CSV, "CSV file")
    try:
        rows = list(csv.reader(io.StringIO(text, newline="")))
    except csv.Error as e:
        raise SymparamError(f"{shown(path)}: not a CSV file ({e})") from None
    if not rows:
        raise SymparamError(f"{shown(path)}: empty CSV; expected a header of symbol names")
    if len(rows) - 1 > MAX_ROWS:
        raise SymparamError(f"{shown(path)}: {len(rows) - 1:,} rows; a sweep takes at most {MAX_ROWS:,}")
    header, body = [h.strip() for h in rows[0]], [r for r in rows[1:] if r]
    for name in header:
        lookup(name)
    columns = {}
    for i, name in enumerate(header):
        try:
            columns[name] = [int(r[i]) for r in body]
        except (ValueError, IndexError):
            raise SymparamError(f"{shown(path)}: column {name}: every row needs an integer") from None
    return columns


def csv_text(columns: Mapping[str, Any], results: Mapping[str, np.ndarray]) -> str:
    """Columns and results as CSV text, header first."""
    results = {n: r for n, r in results.items() if r is not None}  # active, where the config does not set k: no column
    names = list(columns) + list(results)
    arrays = [np.asarray(columns[n]) for n in columns] + [results[n] for n in results]
    size = max(len(a) for a in arrays)
    arrays = [np.broadcast_to(a, (size,)) for a in arrays]
    body = ["," .join(str(int(a[i])) for a in arrays) for i in range(size)]
    return "\n".join([",".join(names)] + body)
