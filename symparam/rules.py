"""Rules that read a config: switches and layer selectors, written as a small, safe subset of Python expressions."""

from __future__ import annotations

import ast
import json
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from symparam.errors import SymparamError
from symparam.files import shown

_COMPARE: dict[type, Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
    ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
}
_ARITHMETIC: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
    ast.Div: operator.truediv,  # Python's float arithmetic, as transformers computes sizes (int(d * qk_dim_factor))
}
_NODES = (ast.Expression, ast.Name, ast.Constant, ast.Attribute, ast.Subscript, ast.Compare, ast.BoolOp, ast.UnaryOp,
          ast.BinOp, ast.IfExp, ast.List, ast.Tuple, ast.Call, ast.Load, ast.And, ast.Or, ast.Not, ast.USub,
          *_COMPARE, *_ARITHMETIC)
MAX_LAYERS = 10**6  # a layer rule that reads i is applied to each layer: beyond this, no real model
MAX_ITEMS = MAX_LAYERS  # entries of a list or string a rule makes (["mamba"] * i)
MAX_BITS = 8_192  # bits of an integer a rule makes (a product of config values): no size comes near
MAX_TEXT = 2_000  # characters of a rule or formula (the longest built-in rule has 507)
MAX_DEPTH = 50  # levels of its syntax tree (the deepest built-in rule has 12): evaluation recurses this deep, no deeper
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "len": len, "bool": bool, "any": any, "all": all, "int": int, "round": round, "min": min, "max": max,
    "nth": lambda value, i: value[i] if isinstance(value, list) else value,  # a size given once or per layer (Gemma 3n's intermediate_size)
}


def syntax(text: str, what: str) -> ast.Expression:
    """`text` parsed as one Python expression, refused beyond MAX_TEXT characters or MAX_DEPTH levels (a sum of 20,000
    terms) before anything walks it; errors start with `what` ("formula 'd*'", "recipe.toml: [switches] x")."""
    if len(text) > MAX_TEXT:
        raise SymparamError(f"{what}: longer than {MAX_TEXT:,} characters")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):  # ValueError: a NUL byte, or an integer Python does not read
        raise SymparamError(f"{what}: not an expression") from None
    level = [(tree, 0)]
    while level:
        node, depth = level.pop()
        if depth > MAX_DEPTH:
            raise SymparamError(f"{what}: nested more than {MAX_DEPTH} levels deep")
        level.extend((child, depth + 1) for child in ast.iter_child_nodes(node))
    return tree


def path(node: ast.AST) -> str | None:
    """The config key a node reads ("sliding_window", "linear_attn_config.num_heads", "layer_types"), if it reads one."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):  # a dotted key; on an indexed value (per_layer_config[i].x) a computed one
        base = path(node.value) if not isinstance(node.value, ast.Subscript) else None
        return f"{base}.{node.attr}" if base else None
    if isinstance(node, ast.Subscript):
        return path(node.value)
    return None


class Uniform(Sequence):
    """The same answer for every one of `size` layers, however many."""

    def __init__(self, value: bool, size: int):
        self.value, self.size = value, size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i):
        if isinstance(i, slice) or not -self.size <= i < self.size:
            raise IndexError(i)
        return self.value

    def count(self, value: bool) -> int:
        return self.size if value == self.value else 0


ANY_LAYER = object()  # evaluate a layer rule without a layer: it raises NeedsLayer if its value depends on i


class NeedsLayer(Exception):
    """The rule read the layer index i (so its value may differ from layer to layer)."""


@dataclass(frozen=True)
class Rule:
    """A parsed rule such as "i < first_k_dense_replace" or "layer_types[i] == 'linear_attention'"."""

    text: str
    tree: ast.Expression = field(repr=False, compare=False)
    reads: tuple[str, ...] = ()  # top-level config keys (and `i`) it reads, in the order it is written
    indexed: tuple[str, ...] = ()  # config keys it reads at the layer index, key[i]: per-layer lists

    def __call__(self, lookup: Callable[[str], Any], i: Any = None) -> Any:
        """The rule's value; names are read through `lookup` (a dotted key -> its config value, None if unset)."""
        return self._eval(self.tree.body, lookup, i)

    def layers(self, lookup: Callable[[str], Any], count: int) -> Sequence[bool]:
        """For each of `count` layers, whether the rule selects it; one evaluation when its value does not read i
        (use_sliding_window false decides every layer at once)."""
        values = self.layers_values(lookup, count)
        return Uniform(bool(values.value), count) if isinstance(values, Uniform) else [bool(v) for v in values]

    def layers_values(self, lookup: Callable[[str], Any], count: int) -> Sequence[Any]:
        """The rule's value at each of `count` layers; one evaluation when it does not read i."""
        try:
            return Uniform(self(lookup, ANY_LAYER), count)
        except NeedsLayer:
            pass
        if count > MAX_LAYERS:
            raise SymparamError(f"num_hidden_layers: {count:,} layers are too many to apply the layer rule {self.text!r} one by one (at most {MAX_LAYERS:,})")
        return [self(lookup, i) for i in range(count)]

    def _eval(self, node: ast.AST, lookup: Callable[[str], Any], i: int | None) -> Any:
        ev = lambda n: self._eval(n, lookup, i)  # noqa: E731
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            if node.id == "i" and i is ANY_LAYER:
                raise NeedsLayer
            return i if node.id == "i" else FUNCTIONS.get(node.id) if node.id in FUNCTIONS else lookup(node.id)
        if isinstance(node, ast.Attribute):
            if path(node):
                return lookup(path(node))
            value = ev(node.value)  # an entry a table does not have reads as None, as an unset key does
            return value.get(node.attr) if isinstance(value, dict) else None if value is None else self._fail(node, "attribute of a value that is not a table")
        if isinstance(node, (ast.List, ast.Tuple)):
            return [ev(e) for e in node.elts]
        if isinstance(node, ast.BoolOp):  # Python's: the operand that decides ("mlp_only_layers or []" is the list)
            for value_node in node.values[:-1]:
                value = ev(value_node)
                if bool(value) != isinstance(node.op, ast.And):
                    return value
            return ev(node.values[-1])
        if isinstance(node, ast.UnaryOp):
            value = ev(node.operand)
            return (not value) if isinstance(node.op, ast.Not) else self._apply(node.operand, operator.neg, value)
        if isinstance(node, ast.IfExp):
            return ev(node.body) if ev(node.test) else ev(node.orelse)
        if isinstance(node, ast.Subscript):
            return self._index(node, ev(node.value), ev(node.slice), lookup)
        if isinstance(node, ast.BinOp):
            return self._apply(node, _ARITHMETIC[type(node.op)], ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare):
            left = ev(node.left)
            if len(node.ops) == 1:  # one comparison is its own value: elementwise on arrays (sweep checks whole columns)
                right_node = node.comparators[0]
                return self._apply(right_node if path(right_node) else node.left, _COMPARE[type(node.ops[0])], left, ev(right_node))
            for op, right_node in zip(node.ops, node.comparators):
                right = ev(right_node)
                if not self._apply(right_node if path(right_node) else node.left, _COMPARE[type(op)], left, right):
                    return False
                left = right
            return True
        if isinstance(node, ast.Call):
            return self._apply(node, ev(node.func), *(ev(a) for a in node.args))
        return self._fail(node, "unsupported")  # unreachable: compile() admits only _NODES

    def _index(self, node: ast.Subscript, container: Any, index: Any, lookup: Callable[[str], Any]) -> Any:
        key = path(node.value) or "value"
        if isinstance(container, dict):  # a table keyed by layer: JSON keys are strings ("2", "02"), as transformers reads int(key)
            return next((v for k, v in container.items() if k == index or (type(index) is int and str(k).isdigit() and int(k) == index)), None)
        if not isinstance(container, (list, str)):
            raise SymparamError(f"{key}: expected a list or a string, got {shown(json.dumps(container))} (read by the rule {self.text!r})")
        if type(index) is not int or not 0 <= index < len(container):
            raise SymparamError(f"{key}: has {len(container)} entries, too few for index {index} (read by the rule {self.text!r})")
        return container[index]

    def _apply(self, node: ast.AST, fn: Callable[..., Any], *args: Any) -> Any:
        if fn is operator.mul and len(args) == 2:
            self._bounded(node, *args)
        try:
            return fn(*args)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):  # OverflowError: int() of an infinite float
            values = ", ".join(shown(json.dumps(a)) if isinstance(a, (int, float, str, list, type(None), bool)) else type(a).__name__ for a in args)
            return self._fail(node, f"cannot be used with {values}")

    def _bounded(self, node: ast.AST, a: Any, b: Any) -> None:
        """A product is refused before it is made where it would exceed MAX_ITEMS entries or MAX_BITS bits."""
        sizes = [len(x) if isinstance(x, (list, str)) else abs(x).bit_length() if type(x) is int else None for x in (a, b)]
        if None in sizes or isinstance(a, (list, str)) and isinstance(b, (list, str)):
            return  # floats, arrays, a TypeError to come
        if isinstance(a, (list, str)) or isinstance(b, (list, str)):
            count = a if type(a) is int else b
            if sizes[0 if isinstance(a, (list, str)) else 1] * max(count, 0) > MAX_ITEMS:
                self._fail(node, f"would make more than {MAX_ITEMS:,} entries")
        elif sum(sizes) > MAX_BITS:
            self._fail(node, f"would make an integer of more than {MAX_BITS:,} bits")

    def _fail(self, node: ast.AST, why: str) -> Any:
        where = path(node) or ast.unparse(node)
        raise SymparamError(f"{where}: {why} (read by the rule {self.text!r})")


def compile_rule(text: Any, where: str) -> Rule:
    """A Rule from its text; anything beyond names, constants, comparisons, and/or/not, arithmetic,
    indexing, `x if c else y` and the FUNCTIONS is an error naming `where`."""
    if type(text) is bool:
        text = str(text)
    if not isinstance(text, str):
        raise SymparamError(f"{where}: expected a rule such as \"i < first_k_dense_replace\", got {text!r}")
    tree = syntax(text, f"{where}: {shown(repr(text))}")
    for node in ast.walk(tree):
        if not isinstance(node, _NODES) or (isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in FUNCTIONS)):
            raise SymparamError(f"{where}: {text!r} uses {type(node).__name__}, which rules do not allow")
    names = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Name) and n.id not in FUNCTIONS), key=lambda n: n.col_offset)
    reads = list(dict.fromkeys(n.id for n in names))  # in the order the rule is written: its first key names it in errors
    indexed = [path(n.value) for n in ast.walk(tree) if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Name) and n.slice.id == "i"]
    return Rule(text, tree, tuple(reads), tuple(dict.fromkeys(key for key in indexed if key)))


MESSAGE = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_]*)\}|[{}]")  # {{, }}, a {name} field, or a brace out of place


def message_fields(message: str, where: str) -> list[str]:
    """The {name} fields of a [checks] message; any other use of braces ({h.__class__}, {0}, {d:,}) is an error: a
    recipe shared by someone else must not read the program's internals through str.format."""
    fields = []
    for match in MESSAGE.finditer(message):
        if match[0] in "{}":
            raise SymparamError(f"{where}: a message may hold only {{symbol}} fields (and {{{{ }}}} for braces): {shown(repr(message))}")
        if match[1]:
            fields.append(match[1])
    return fields


def message_text(message: str, values: Mapping[str, Any]) -> str:
    """A [checks] message with its {name} fields set to `values` (a field without a value stays as written)."""
    return MESSAGE.sub(lambda m: m[0][0] if m[1] is None else str(values[m[1]]) if m[1] in values else m[0], message)


def lookup_in(config: Mapping[str, Any]) -> Callable[[str], Any]:
    """A reader of dotted keys ("a.b") in a config dict; an unset key reads as None."""

    def read(key: str) -> Any:
        value: Any = config
        for part in key.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        return value

    return read


__all__ = ["Rule", "compile_rule", "lookup_in", "message_text", "message_fields", "path", "syntax"]
