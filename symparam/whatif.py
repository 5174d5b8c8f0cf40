"""What-if: solve the total for one symbol, sensitivities d(total)/d(symbol), and exact vectorised sweeps over configs."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import sympy as sp

from symparam.config import resolve
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.recipes import Recipe
from symparam.symbols import BY_NAME, SYMBOLS, TABLE, parse, symbol as lookup

# Divisibility a design must keep: (symbol, the symbol it must be a multiple of, why).
CONSTRAINTS = (
    ("d", "h", "the hidden size splits into h query heads"),
    ("h", "h_kv", "query heads come in groups of g = h/h_kv per key/value head"),
)
INT64_MAX = 2**63 - 1
MAX_STEPS = 100_000  # how far solve walks from a root to the nearest value meeting the constraints


def derived(recipe: Recipe, config: Mapping[str, Any] | None = None, sets: Mapping[str, int] | None = None) -> dict[str, sp.Expr]:
    """Symbols the config leaves to their default formula (h_d = d/h, h_kv = h, d_ff = 4d): they follow their inputs."""
    merged, sets = {**recipe.defaults, **(config or {})}, sets or {}
    return {
        s.name: parse(s.fallback)
        for s in TABLE
        if s.fallback and s.name not in sets and not any(merged.get(k) is not None for k in s.keys)
    }


def follow(expr: sp.Expr, formulas: Mapping[str, sp.Expr], only: set[str] | None = None) -> sp.Expr:
    """`expr` with derived symbols replaced by their formulas (those depending on `only`, if given), to a fixed point."""
    for _ in range(len(formulas) + 1):
        subs = {SYMBOLS[name]: f for name, f in formulas.items() if SYMBOLS[name] in expr.free_symbols and (only is None or _depends(name, formulas, only))}
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


# --- solve -----------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Solution:
    """The integer values of one symbol closest to a target total, and the equation solved."""

    symbol: str
    target: int
    equation: sp.Expr  # total as a function of the symbol alone, the other values substituted
    general: sp.Expr  # the model's total in all symbols
    roots: list[float]  # real positive solutions of equation = target
    candidates: list[tuple[int, int]]  # (value, exact total), nearest valid values on each side of each root
    fixed: dict[str, int]  # the other symbols' values
    follows: dict[str, sp.Expr]  # derived symbols that move with the solved one

    @property
    def best(self) -> tuple[int, int]:
        return min(self.candidates, key=lambda c: (abs(c[1] - self.target), c[0]))

    def as_dict(self) -> dict[str, Any]:
        return {
            "symbol": self.symbol, "target": self.target, "equation": str(self.equation), "general": str(self.general),
            "roots": self.roots, "best": {"value": self.best[0], "total": self.best[1]},
            "candidates": [{"value": v, "total": t, "off": t - self.target} for v, t in self.candidates],
            "fixed": self.fixed, "follows": {k: str(v) for k, v in self.follows.items()},
        }


def solve(recipe: Recipe, symbol: str, target: int, config: Mapping[str, Any] | None = None, sets: Mapping[str, int] | None = None) -> Solution:
    """Integer values of `symbol` whose exact total is closest to `target`, keeping CONSTRAINTS and the config's rules."""
    sym, config, sets = lookup(symbol), dict(config or {}), {k: v for k, v in (sets or {}).items() if k != symbol}
    if target <= 0:
        raise SymparamError(f"--target: expected a positive number of parameters, got {target}")
    formulas = derived(recipe, config, {**sets, symbol: 0})
    base = _resolve_around(recipe, config, sets, symbol)
    model = Model(recipe, base.flags)
    if sym not in follow(model.total, formulas).free_symbols:
        raise SymparamError(f"--for {symbol}: the {recipe.title} total does not depend on {symbol}")
    moving = {name for name in formulas if _depends(name, formulas, {symbol})}
    fixed = {k: v for k, v in base.values.items() if k != symbol and k not in moving}
    equation = follow(model.total, formulas, {symbol}).xreplace({SYMBOLS[k]: sp.Integer(v) for k, v in fixed.items()})
    x = sp.Symbol(symbol, positive=True)  # real, not integer: sympy would drop the non-integer roots
    roots = sorted(float(r) for r in sp.solve(sp.Eq(equation.xreplace({sym: x}), target), x) if r.is_real and r > 0)
    if not roots:
        raise SymparamError(f"--for {symbol}: no positive {symbol} gives {target:,} parameters")

    def exact(value: int) -> int | None:
        """The total at `value` by the full path (config resolution, exact count), or None if the value is not allowed."""
        if value < 1:
            return None
        trial = {**fixed, symbol: value, **{m: _value(formulas[m], {**fixed, symbol: value}) for m in moving}}
        if meets({k: v for k, v in trial.items() if v is not None}) or any(trial[m] is None for m in moving):
            return None
        try:
            total = Model.from_resolved(resolve(config, recipe, {**sets, symbol: value})).count().total
        except SymparamError:
            return None
        assert total == int(equation.xreplace({sym: value})), "solve: the equation and the exact count disagree"
        return total

    candidates = {}
    for root in roots:
        for start, step in ((math.floor(root), -1), (math.ceil(root), 1)):
            value = start
            for _ in range(MAX_STEPS):
                total = exact(value)
                if total is not None:
                    candidates[value] = total
                    break
                if value < 1:
                    break
                value += step
    if not candidates:
        raise SymparamError(f"--for {symbol}: no value near {roots[0]:.1f} meets the constraints")
    return Solution(symbol, target, equation, model.total, roots, sorted(candidates.items()), fixed, {m: formulas[m] for m in moving})


def _value(formula: sp.Expr, values: Mapping[str, int]) -> int | None:
    """A derived symbol's value, or None when its formula is not a whole number there."""
    result = formula.xreplace({SYMBOLS[k]: sp.Integer(v) for k, v in values.items() if k in SYMBOLS})
    return int(result) if result.is_Integer and result > 0 else None


def _resolve_around(recipe: Recipe, config: dict[str, Any], sets: dict[str, int], symbol: str):
    """The config resolved with a stand-in value for the solved symbol (one that passes the config's checks)."""
    given = [v for v in sets.values() if v > 0]
    guesses = [config_value for config_value in (_config_value(recipe, config, symbol),) if config_value] + [math.prod(given) if given else 1, 1, *given]
    first = None
    for guess in dict.fromkeys(guesses):
        try:
            return resolve(config, recipe, {**sets, symbol: guess})
        except SymparamError as e:
            first = first or e
    raise first


def _config_value(recipe: Recipe, config: Mapping[str, Any], symbol: str) -> int | None:
    merged = {**recipe.defaults, **config}
    return next((merged[k] for k in BY_NAME[symbol].keys if type(merged.get(k)) is int), None)


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
    values = {SYMBOLS[k]: sp.Integer(v) for k, v in model.values.items() if k in SYMBOLS}
    at = derivative.xreplace(values)
    here, there = total.xreplace(values), total.xreplace({**values, sym: values[sym] + 1})
    elasticity = float(at * values[sym] / here) if here else None
    return Sensitivity(symbol, derivative, sp.nsimplify(at), int(there - here) if (there - here).is_Integer else None, elasticity)


def sensitivities(model: Model, formulas: Mapping[str, sp.Expr] | None = None, symbols: list[str] | None = None) -> list[Sensitivity]:
    """Sensitivity to each independent symbol of the model (derived ones follow their inputs)."""
    formulas = formulas or {}
    free = follow(model.total, formulas).free_symbols
    names = symbols or [str(s) for s in SYMBOLS.values() if s in free]
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
        top = [max(1, int(np.max(np.abs(columns[s]))) if len(columns[s]) else 1) for s in self.symbols]
        return sum(abs(c) * math.prod(t**e for t, e in zip(top, exps)) for c, exps in self.monomials)


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
    if bound <= INT64_MAX:
        args = [np.asarray(columns[s], dtype=np.int64) for s in compiled.symbols]
        size = max((len(a) for a in args), default=1)
        return np.broadcast_to(np.asarray(compiled.function(*args), dtype=np.int64), (size,)).copy()
    if on_overflow == "raise":
        raise SymparamError(f"sweep: intermediates could reach {bound:.3e}, beyond int64 ({INT64_MAX:.3e}); use exact Python integers (on_overflow='fallback')")
    args = [np.array([int(x) for x in columns[s]], dtype=object) for s in compiled.symbols]
    return np.asarray(compiled.function(*args), dtype=object)


def fill(model: Model, columns: Mapping[str, Any], formulas: Mapping[str, sp.Expr] | None = None) -> dict[str, np.ndarray]:
    """Every symbol the model needs as an array: given columns, then derived formulas over them, then the model's values."""
    size = max((len(np.atleast_1d(v)) for v in columns.values()), default=1)
    out = {name: _column(name, v, size) for name, v in columns.items()}
    for name in columns:
        lookup(name)
    formulas = formulas or {}
    for name in [str(s) for s in model.symbols]:
        if name in out:
            continue
        if name in formulas and {str(s) for s in formulas[name].free_symbols} & set(out):
            out[name] = _derive(name, formulas[name], out, model.values or {}, size)
        elif model.values and name in model.values:
            out[name] = np.full(size, model.values[name], dtype=np.int64 if abs(model.values[name]) <= INT64_MAX else object)
        else:
            raise SymparamError(f"sweep: no values for {name}; add a column or --set {name}=...")
    return out


def _column(name: str, values: Any, size: int) -> np.ndarray:
    """One column as int64 (objects holding Python ints beyond int64); floats and negatives are errors."""
    array = np.atleast_1d(np.asarray(values))
    if array.dtype.kind in "iu":  # already integers: no per-row Python work
        if array.size and array.min() < 0:
            raise SymparamError(f"sweep: column {name} has a negative value")
        if array.dtype.kind == "u" and array.size and array.max() > INT64_MAX:
            array = array.astype(object)
        else:
            array = array.astype(np.int64, copy=False)
        return np.broadcast_to(array, (size,)) if len(array) == 1 else array
    array = np.atleast_1d(np.asarray(values, dtype=object))
    if not all(type(x) is int or isinstance(x, np.integer) for x in array):
        raise SymparamError(f"sweep: column {name} must hold integers")
    ints = [int(x) for x in array]
    if any(x < 0 for x in ints):
        raise SymparamError(f"sweep: column {name} has a negative value")
    fits = all(x <= INT64_MAX for x in ints)
    array = np.array(ints, dtype=np.int64 if fits else object)
    return np.broadcast_to(array, (size,)) if len(array) == 1 else array


def _derive(name: str, formula: sp.Expr, columns: dict[str, np.ndarray], values: Mapping[str, int], size: int) -> np.ndarray:
    """A derived symbol per row, exactly: numerator and denominator as integers, and a check that it divides."""
    num, den = sp.fraction(sp.together(formula))
    parts = []
    for piece in (num, den):
        syms = sorted(piece.free_symbols, key=str)
        args = [columns[str(s)] if str(s) in columns else np.full(size, values[str(s)], dtype=np.int64) for s in syms]
        parts.append(np.broadcast_to(np.asarray(sp.lambdify(syms, piece, "numpy")(*args), dtype=np.int64), (size,)))
    top, bottom = parts
    if np.any(top % bottom):
        row = int(np.argmax(top % bottom != 0))
        raise SymparamError(f"sweep: row {row}: {name} = {formula} is not a whole number; add a {name} column")
    return top // bottom


def sweep(model: Model, columns: Mapping[str, Any], formulas: Mapping[str, sp.Expr] | None = None, on_overflow: str = "fallback") -> dict[str, np.ndarray]:
    """Exact total and active counts for every row of `columns` (symbol -> array), vectorised."""
    values = fill(model, columns, formulas)
    total = evaluate(compile_count(model.total), values, on_overflow)
    active = total if model.active == model.total else evaluate(compile_count(model.active), values, on_overflow)
    return {"total": total, "active": active}


def grid(specs: Mapping[str, str]) -> dict[str, np.ndarray]:
    """Columns for every combination of `symbol -> "a:b:step"` (b included) or `"x,y,z"`."""
    axes = {}
    for name, spec in specs.items():
        lookup(name)
        try:
            if ":" in spec:
                start, stop, *step = (int(x) for x in spec.split(":"))
                axes[name] = list(range(start, stop + 1, step[0] if step else 1))
            else:
                axes[name] = [int(x) for x in spec.split(",")]
        except ValueError:
            raise SymparamError(f"--grid {name}={spec}: expected START:STOP[:STEP] or a,b,c of integers") from None
        if not axes[name]:
            raise SymparamError(f"--grid {name}={spec}: no values")
    mesh = np.meshgrid(*[np.array(v, dtype=np.int64) for v in axes.values()], indexing="ij")
    return {name: m.ravel() for name, m in zip(axes, mesh)}


__all__ = ["solve", "Solution", "sensitivity", "sensitivities", "Sensitivity", "sweep", "compile_count", "evaluate", "grid", "derived", "follow", "CONSTRAINTS"]


# --- text and CSV for the command line --------------------------------------------------------------------------


def solution_text(sol: Solution) -> str:
    """A solution as lines: the equation, its roots, the nearest allowed values with their exact totals."""
    lines = [f"solve total({sol.symbol}) = {sol.target:,}", f"general:  total = {sol.general}"]
    if sol.follows:
        lines.append("follows:  " + ", ".join(f"{k} = {v}" for k, v in sol.follows.items()) + " (not set in the config)")
    lines.append(f"fixed:    " + ", ".join(f"{k}={v}" for k, v in sol.fixed.items() if SYMBOLS[k] in sol.general.free_symbols))
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

    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except FileNotFoundError:
        raise SymparamError(f"{path}: no such file") from None
    if not rows:
        raise SymparamError(f"{path}: empty CSV; expected a header of symbol names")
    header, body = [h.strip() for h in rows[0]], [r for r in rows[1:] if r]
    for name in header:
        lookup(name)
    columns = {}
    for i, name in enumerate(header):
        try:
            columns[name] = [int(r[i]) for r in body]
        except (ValueError, IndexError):
            raise SymparamError(f"{path}: column {name}: every row needs an integer") from None
    return columns


def csv_text(columns: Mapping[str, Any], results: Mapping[str, np.ndarray]) -> str:
    """Columns and results as CSV text, header first."""
    names = list(columns) + list(results)
    arrays = [np.asarray(columns[n]) for n in columns] + [results[n] for n in results]
    size = max(len(a) for a in arrays)
    arrays = [np.broadcast_to(a, (size,)) for a in arrays]
    body = ["," .join(str(int(a[i])) for a in arrays) for i in range(size)]
    return "\n".join([",".join(names)] + body)
