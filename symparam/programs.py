"""Forward programs: what a block's forward computes, written as a small, safe subset of Python (parsed, never run).

A recipe block's `forward` (and a `[functions]` entry) is one `def` in the syntax transformers' modeling files use:
assignments, `return`, `if`/`else`, `for i in range(n):`, `with no_grad():`, calls of operations, child modules and functions
(one layer of a stack: `layers[i](x)`), arithmetic on tensors and sizes.
symparam.memory.trace interprets it over symbolic shapes; nothing here executes code.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache

from symparam.errors import SymparamError

MAX_PROGRAM = 20_000  # characters: a forward is a few lines, a function a few dozen
STATEMENTS = (ast.Assign, ast.Return, ast.If, ast.For, ast.Expr, ast.Pass, ast.With)
EXPRESSIONS = (ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Call, ast.BinOp, ast.UnaryOp, ast.BoolOp,
               ast.Compare, ast.IfExp, ast.Tuple, ast.List, ast.Slice, ast.keyword, ast.Load, ast.Store, ast.withitem,
               ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult, ast.USub, ast.Not,
               ast.And, ast.Or, ast.Eq, ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Is, ast.IsNot)


@dataclass(frozen=True)
class Program:
    """One parsed `def`: its name, parameters (with defaults), whether it takes **kwargs, and its statements."""

    name: str
    params: tuple[str, ...]
    defaults: dict[str, ast.expr] = field(compare=False)  # parameter -> its default expression
    kwargs: bool  # takes **kwargs: keyword arguments it does not name are ignored (as transformers' forwards do)
    body: tuple[ast.stmt, ...] = field(compare=False)
    where: str = ""  # the recipe entry it came from, for error messages


def compile_program(text: str, where: str) -> Program:
    """A program from its text; a syntax error or a construct outside the subset is a one-line error naming `where`."""
    return _compile(text, where)


@lru_cache(maxsize=None)
def _compile(text: str, where: str) -> Program:
    if not isinstance(text, str) or len(text) > MAX_PROGRAM:
        raise SymparamError(f"{where}: expected a program of at most {MAX_PROGRAM} characters (def forward(x): ...)")
    try:
        tree = ast.parse(_dedent(text))
    except SyntaxError as e:
        raise SymparamError(f"{where}: not a program ({e.msg}, line {e.lineno})") from None
    except (ValueError, RecursionError, MemoryError):  # a NUL byte; Python's parser on 15,000 nested minus signs
        raise SymparamError(f"{where}: not a program (nested too deeply for Python's parser)") from None
    if len(tree.body) != 1 or not isinstance(tree.body[0], ast.FunctionDef):
        raise SymparamError(f"{where}: expected exactly one `def name(...):`")
    fn = tree.body[0]
    a = fn.args
    if a.vararg or a.posonlyargs or fn.decorator_list:
        raise SymparamError(f"{where}: parameters are plain names, with defaults and an optional **kwargs")
    for node in (n for stmt in fn.body for n in ast.walk(stmt)):
        if isinstance(node, ast.stmt) and not isinstance(node, STATEMENTS):
            raise SymparamError(f"{where}: line {node.lineno}: {type(node).__name__} is not allowed in a forward program")
        if isinstance(node, ast.expr_context) or isinstance(node, ast.stmt):
            continue
        if not isinstance(node, EXPRESSIONS) and not isinstance(node, (ast.operator, ast.unaryop, ast.boolop, ast.cmpop)):
            raise SymparamError(f"{where}: line {getattr(node, 'lineno', '?')}: {type(node).__name__} is not allowed in a forward program")
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) or isinstance(node.func, ast.Subscript) and isinstance(node.func.value, ast.Name)):
            raise SymparamError(f"{where}: line {node.lineno}: call functions by name (op(x), not x.op(); a stack's layers[i](x))")
        if isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            raise SymparamError(f"{where}: line {node.lineno}: no private attributes")
        if isinstance(node, ast.For) and not (isinstance(node.target, ast.Name) and isinstance(node.iter, ast.Call)
                                              and isinstance(node.iter.func, ast.Name) and node.iter.func.id == "range"
                                              and len(node.iter.args) in (1, 2) and not node.iter.keywords and not node.orelse):
            raise SymparamError(f"{where}: line {node.lineno}: loops are `for i in range(count):` or `for i in range(start, stop):` (no else)")
        if isinstance(node, ast.With) and not (len(node.items) == 1 and node.items[0].optional_vars is None
                                               and ast.dump(node.items[0].context_expr) == ast.dump(ast.parse("no_grad()", mode="eval").body)):
            raise SymparamError(f"{where}: line {node.lineno}: the one context is `with no_grad():`")
        if isinstance(node, ast.Assign) and not all(isinstance(t, (ast.Name, ast.Tuple)) for t in node.targets):
            raise SymparamError(f"{where}: line {node.lineno}: assign to names")
    params = tuple(p.arg for p in a.args + a.kwonlyargs)
    positional = a.args[len(a.args) - len(a.defaults):]
    defaults = {p.arg: d for p, d in zip(positional, a.defaults)}
    defaults |= {p.arg: d for p, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None}
    return Program(fn.name, params, defaults, a.kwarg is not None, tuple(fn.body), where)


def _dedent(text: str) -> str:
    """TOML multi-line strings keep the indentation they are written with: strip the common leading blanks."""
    import textwrap

    return textwrap.dedent(text.strip("\n"))


__all__ = ["Program", "compile_program"]
