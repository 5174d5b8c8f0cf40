"""Storage: the tensors a checkpoint stores for a model under a quantization format (conventions/formats.toml), each a
formula in the model's symbols, their sum as a formula and as exact bytes; and what a published checkpoint stores
beyond the model transformers builds (a recipe's [checkpoint] table: DeepSeek-V3's MTP layer)."""

from __future__ import annotations

import fnmatch
import re
import string
import tomllib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from functools import cache
from importlib import resources
from typing import Any

import sympy as sp

from symparam.components import Term
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.rules import compile_rule, lookup_in
from symparam.safetensors import DTYPE_BYTES, DTYPE_NAMES
from symparam.symbols import evaluate, make, parse

LINEAR = ("linear", "conv1d")  # module kinds whose `weight` is one matrix [d_out, d_in]
D_OUT, D_IN = sp.Symbol("d_out", positive=True, integer=True), sp.Symbol("d_in", positive=True, integer=True)
NONE = "none"  # --quant none: the config's quantization_config ignored, no stored layout
GGUF = "gguf:"  # --quant gguf:TYPE names a llama.cpp type, sized by memory/gguf.py


@dataclass(frozen=True)
class Part:
    """One tensor of the checkpoint, layer and expert indices left out: what it stores, its dtype, its shape per copy,
    its copies (layers x experts) and its bytes per copy, each a formula."""

    name: str  # checkpoint name: model.layers.self_attn.q_a_proj.weight_scale_inv
    stores: str  # the parameter (or buffer) it stores: model.layers.self_attn.q_a_proj.weight
    dtype: str  # as safetensors (or GGUF) spells it: F8_E4M3, F32, Q4_K
    shape: tuple[sp.Expr, ...]
    copies: sp.Expr
    bytes: sp.Expr  # per copy
    extra: str = ""  # what the checkpoint stores beyond the model transformers builds, where this part is such
    resident: bool = True  # held in memory once loaded (false: metadata only the file holds, bitsandbytes' JSON quant_state)
    stored: bool = True  # in the file (false: only in memory: fused experts transformers 5 loads unquantized)

    @property
    def total(self) -> sp.Expr:
        return self.copies * self.bytes


@dataclass(frozen=True)
class Stored:
    """A model as a checkpoint stores it: the format, every part, the modules kept unquantized (with why), notes."""

    format: str  # the entry of formats.toml (fp8, mxfp4, ...) or a GGUF type
    title: str
    parts: tuple[Part, ...]
    kept: tuple[tuple[str, tuple[str, ...]], ...]  # (why, tensors kept for that reason)
    notes: tuple[str, ...] = ()
    settings: dict[str, Any] = field(default_factory=dict)  # what the format was read with (quantization_config or --quant)
    per_matrix: sp.Expr | None = None  # bytes of one quantized matrix [d_out, d_in]: the storage rule in one formula
    source: str = ""  # "quantization_config" or "--quant NAME"

    @property
    def total(self) -> sp.Expr:
        """Bytes the checkpoint stores, summed over every part: copies x bytes per copy."""
        return sp.Add(*(p.total for p in self.parts if p.stored))

    @property
    def resident(self) -> sp.Expr:
        """Bytes the loaded model holds in memory in this format: the stored parts but the file's own metadata."""
        return sp.Add(*(p.total for p in self.parts if p.resident))

    @property
    def extras(self) -> sp.Expr:
        return sp.Add(*(p.total for p in self.parts if p.extra))

    def tensors(self) -> sp.Expr:
        """How many tensors the checkpoint holds: every part's copies."""
        return sp.Add(*(p.copies for p in self.parts if p.stored))

    def report(self, values: Mapping[str, int]) -> dict[str, Any]:
        """The layout at a config's values: exact bytes and tensor count, with formulas; parts and kept modules listed."""
        def exact(expr: sp.Expr) -> int:
            return evaluate(expr, values, f"{self.format}: {expr}")

        return {
            "format": self.format, "title": self.title, "source": self.source, "bytes": exact(self.total), "formula": str(self.total),
            "tensor_count": exact(self.tensors()), "extra_bytes": exact(self.extras),
            "per_matrix": str(self.per_matrix) if self.per_matrix is not None else None,
            "tensors": [{"name": p.name, "stores": p.stores, "dtype": p.dtype, "shape": [str(s) for s in p.shape], "dims": [exact(s) for s in p.shape],
                         "copies": str(p.copies), "count": exact(p.copies), "bytes_per_copy": str(p.bytes), "bytes": exact(p.total),
                         **({"extra": p.extra} if p.extra else {})} for p in self.parts if exact(p.copies) and p.stored],
            "kept": [{"why": why, "tensors": list(names)} for why, names in self.kept],
            "notes": list(self.notes),
        }


# --- the table ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Format:
    """One entry of formats.toml."""

    name: str
    spec: dict[str, Any]

    def __getattr__(self, key: str) -> Any:
        try:
            return self.spec[key]
        except KeyError:
            raise AttributeError(key) from None


@cache
def table() -> dict[str, Any]:
    """formats.toml as data."""
    text = resources.files("symparam.memory").joinpath("conventions", "formats.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def formats() -> dict[str, Format]:
    return {name: Format(name, {"defaults": {}, "names": {}, "params": {}, "checks": {}, "require": {}, "notes": [], **spec})
            for name, spec in table()["formats"].items()}


def quant_names() -> list[str]:
    """Every --quant name the table knows (a pattern written as it is: gptq-{bits}bit-g{group_size})."""
    patterns = [re.sub(r"\{(?:\w+\.)*(\w+)\}", r"{\1}", f.pattern) for f in formats().values() if "pattern" in f.spec]
    return [n for f in formats().values() for n in f.names] + patterns


# --- settings ----------------------------------------------------------------------------------------------------


def merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """`over` on `base`, tables merged key by key (a config's group settings over a format's defaults)."""
    out = dict(base)
    for key, value in over.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def from_config(model: Model) -> tuple[Format, dict[str, Any]]:
    """The format and settings a model's quantization_config names; an unknown method or scheme is a one-line error."""
    qc = model.quantization or {}
    method = qc.get("quant_method")
    candidates = [f for f in formats().values() if f.method == method]
    if not candidates:
        known = sorted({f.method for f in formats().values()})
        raise SymparamError(f"quantization_config.quant_method: unknown {method!r}; symparam knows {', '.join(known)} (--quant none ignores it)")
    for f in candidates:
        settings = with_group(f, qc, "quantization_config")
        if "select" not in f.spec or compile_rule(f.select, f"formats.toml {f.name}.select")(lookup_in(settings)):
            return f, settings
    raise SymparamError(f"quantization_config: a {method} scheme symparam does not know (its layouts: {', '.join(f.name for f in candidates)})")


def with_group(f: Format, qc: Mapping[str, Any], where: str) -> dict[str, Any]:
    """The settings: the format's defaults under the config; a per-group table (config_groups) read as its one group."""
    settings = merged(f.defaults, {k: v for k, v in qc.items() if k != f.spec.get("groups")})
    groups = qc.get(f.groups) if "groups" in f.spec else None
    if groups is not None:
        if not isinstance(groups, dict) or not groups or not all(isinstance(g, dict) for g in groups.values()):
            raise SymparamError(f"{where}.{f.groups}: expected a table of scheme groups")
        schemes = {repr(sorted((k, repr(v)) for k, v in g.items() if k != "targets")) for g in groups.values()}
        if len(schemes) > 1:
            raise SymparamError(f"{where}.{f.groups}: {len(groups)} groups with different schemes; symparam reads one scheme per model")
        settings["group"] = next(iter(groups.values()))  # the config's own scheme, not merged with a default one
    return settings


def nested(flat: Mapping[str, Any]) -> dict[str, Any]:
    """{"group.weights.num_bits": 4} as {"group": {"weights": {"num_bits": 4}}}."""
    out: dict[str, Any] = {}
    for key, value in flat.items():
        *outer, last = key.split(".")
        here = out
        for part in outer:
            here = here.setdefault(part, {})
        here[last] = value
    return out


def from_name(name: str) -> tuple[Format, dict[str, Any]]:
    """The format and settings a --quant name stands for (a fixed name, or a pattern such as gptq-4bit-g128)."""
    for f in formats().values():
        if name in f.names:
            return f, merged(f.defaults, f.names[name])
        if "pattern" in f.spec:
            fields = re.findall(r"\{([\w.]+)\}", f.pattern)
            regex = re.escape(f.pattern)
            for i, key in enumerate(fields):
                regex = regex.replace(re.escape(f"{{{key}}}"), f"(?P<f{i}>-?\\d+)")
            match = re.fullmatch(regex, name)
            if match:
                return f, merged(f.defaults, nested({key: int(match[f"f{i}"]) for i, key in enumerate(fields)}))
    raise SymparamError(f"--quant: unknown format {name!r}; known: {', '.join(quant_names())}, {GGUF}TYPE, {NONE}")


# --- reading one format ------------------------------------------------------------------------------------------


class Reader:
    """A format's settings, its params (on demand), its checks and its parts, with errors that name the field."""

    def __init__(self, f: Format, settings: dict[str, Any], where: str, model: Model):
        self.f = f
        self.where = where  # "quantization_config" or "--quant NAME"
        torch_name = model.dtype if model.dtype in DTYPE_NAMES else "bfloat16"
        self.settings = {**settings, "torch_name": torch_name, "dtype": DTYPE_NAMES[torch_name]}
        self.read = lookup_in(self.settings)
        self._params: dict[str, sp.Expr] = {}

    def field(self, key: str) -> str:
        return f"{self.where}: {key}" if self.where.startswith("--quant") else f"{self.where}.{key}"

    def fail(self, message: str) -> SymparamError:
        """A check's message starts with the field it names ("bits: ..."): said with where it was read."""
        head, sep, rest = message.partition(": ")
        return SymparamError(f"{self.field(head)}: {rest}" if sep else f"{self.where}: {message}")

    def words(self, text: str, extra: Mapping[str, Any] | None = None) -> str:
        return _Formatter(lambda key: (extra or {}).get(key, self.read(key))).format(text)

    def check(self) -> None:
        for text, message in self.f.checks.items():
            try:
                ok = compile_rule(text, f"formats.toml {self.f.name}")(self.read)
            except SymparamError:
                ok = False
            if not ok:
                raise self.fail(self.words(message))

    def on(self, rule: str | None) -> bool:
        return True if rule is None else bool(compile_rule(rule, f"formats.toml {self.f.name}")(self.read))

    def param(self, name: str) -> sp.Expr:
        """A param's value: a positive integer from the settings, or a formula in d_out/d_in."""
        if name not in self._params:
            rule = compile_rule(self.f.params[name], f"formats.toml {self.f.name}.params")
            key = next(iter(rule.reads), name)
            try:
                value = rule(self.read)
            except SymparamError:
                value = None
            if isinstance(value, str):
                self._params[name] = self.formula(value)
            elif type(value) is int and value > 0:
                self._params[name] = sp.Integer(value)
            else:
                raise SymparamError(f"{self.field(key)}: expected a positive whole number, got {value!r} ({self.read(key)!r})")
        return self._params[name]

    def formula(self, text: str | int) -> sp.Expr:
        names = {"d_out": D_OUT, "d_in": D_IN}

        def known(name: str) -> sp.Expr:
            if name in self.f.params:
                return self.param(name)
            raise SymparamError(f"formats.toml {self.f.name}: unknown name {name!r} in {text!r}")

        return parse(text, names, known)

    def parts(self) -> list[dict[str, Any]]:
        """The format's parts for one matrix that its settings switch on, with shapes as formulas in d_out, d_in."""
        out = []
        for spec in self.f.parts:
            if not self.on(spec.get("when")):
                continue
            dtype = self.words(spec["dtype"])
            if dtype not in DTYPE_BYTES:
                raise SymparamError(f"formats.toml {self.f.name}: dtype {dtype!r} is not a safetensors dtype")
            shape = tuple(self.formula(s) for s in spec["shape"])
            out.append({"name": spec["name"], "dtype": dtype, "shape": shape, "bytes": sp.Mul(*shape) * DTYPE_BYTES[dtype], "resident": spec.get("resident", True)})
        return out

    def require(self, d_out: int, d_in: int, tensor: str) -> None:
        """The format's conditions on one matrix (a group that must divide its rows)."""
        for text, message in self.f.require.items():
            names = {"d_out": d_out, "d_in": d_in, **{p: self.number(p, d_out, d_in) for p in self.f.params}}
            if not compile_rule(text, f"formats.toml {self.f.name}.require")(names.get):
                raise self.fail(self.words(message, {**names, "tensor": tensor}))

    def number(self, name: str, d_out: int, d_in: int) -> int | None:
        try:
            value = self.param(name).xreplace({D_OUT: d_out, D_IN: d_in})
        except SymparamError:
            return None
        return int(value) if value.is_Integer else None


class _Formatter(string.Formatter):
    """str.format with dotted settings keys ({group.weights.num_bits})."""

    def __init__(self, read: Callable[[str], Any]):
        self.read = read

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> tuple[Any, str]:
        return self.read(field_name), field_name


# --- the model's tensors -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    """A tensor of the tree with what the formats read: its path, copies, module kind, experts count, stack membership."""

    term: Term
    path: str
    copies: sp.Expr
    kind: str  # nearest module kind: linear, experts, head, embedding, router, or other
    module: str  # the path of that module (for a linear weight: the Linear)
    experts: sp.Expr  # copies that are experts (n), 1 outside experts
    in_layers: bool  # inside the decoder stack


def walk(term: Term, stack: str, path: str = "", mult: sp.Expr = sp.Integer(1), kind: str = "other", module: str = "",
         experts: sp.Expr = sp.Integer(1)) -> Iterator[Leaf]:
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    mult = mult * term.times
    if term.module:
        kind, module = term.module, path
        if term.module == "experts":
            experts = term.times
    if term.is_leaf:
        yield Leaf(term, path, mult, kind, module, experts, path.startswith(stack + ".") or path == stack)
        return
    for child in term.children:
        yield from walk(child, stack, path, mult, kind, module, experts)


def stack_path(model: Model) -> str:
    """The dotted path of the decoder-layer stack (model.layers), from the recipe's entry with layers = true."""
    blocks = model.recipe.blocks

    def visit(name: str, prefix: str) -> str | None:
        for _, spec in blocks[name].entries:
            for e in spec if isinstance(spec, tuple) else (spec,):
                if e.block is None:
                    continue
                here = f"{prefix}.{e.key}" if prefix else e.key
                if e.layers:
                    return here
                found = visit(e.block, here)
                if found:
                    return found
        return None

    return visit("causal_lm", "") or ""


# --- matching the modules a config leaves unquantized ------------------------------------------------------------

MATCHERS: dict[str, Callable[[str, str], bool]] = {
    # transformers' should_convert_module: a prefix up to a module boundary, a regex with the same boundary, or a suffix
    "transformers": lambda key, name: bool(re.match(rf"(?:{key})(?:(?<=\.)|(?=\.|$))", name)) or name.endswith(key),
    # compressed-tensors' ignore: "re:" a regex matched from the start, else the module's name
    "compressed-tensors": lambda key, name: bool(re.match(key[3:], name)) if key.startswith("re:") else name == key or name.endswith("." + key),
    # ModelOpt's exclude_modules / ignore: fnmatch patterns on module names
    "glob": lambda key, name: fnmatch.fnmatchcase(name, key),
}


def skipped(reader: Reader, module: str, stack: str, experts: bool) -> bool:
    """Whether the config lists this module as left unquantized, matched on its name with layer (and expert) indices.
    A pattern that names some layers only is refused: symparam applies a format to every layer of a kind."""
    spec = reader.f.spec.get("skip")
    if spec is None:
        return False
    patterns = reader.read(spec["key"]) or []
    if not isinstance(patterns, list) or not all(isinstance(p, str) for p in patterns):
        raise SymparamError(f"{reader.field(spec['key'])}: expected a list of module names, got {patterns!r}")
    match = MATCHERS[spec["match"]]

    def name(i: int) -> str:
        full = module if not stack or not module.startswith(stack + ".") else f"{stack}.{i}.{module[len(stack) + 1:]}"
        return re.sub(r"\.experts\.", f".experts.{i}.", full) if experts else full

    for pattern in patterns:
        try:
            hits = {match(pattern, name(i)) for i in (0, 7, 12345)}
        except re.error as e:
            raise SymparamError(f"{reader.field(spec['key'])}: {pattern!r} is not a regex ({e})") from None
        if hits == {True}:
            return True
        if len(hits) > 1:
            raise SymparamError(f"{reader.field(spec['key'])}: {pattern!r} names some layers only ({module}); symparam applies a format to every layer of a kind")
    return False


# --- the layout --------------------------------------------------------------------------------------------------


def layout(model: Model, quant: str | None = None) -> Stored | None:
    """The model as its checkpoint stores it: under the format --quant names, else its config's quantization_config;
    None when neither (or --quant none)."""
    if quant == NONE or (quant is None and model.quantization is None):
        return None
    if quant is not None and quant.startswith(GGUF):
        return gguf_layout(model, quant[len(GGUF):])
    f, settings = from_name(quant) if quant is not None else from_config(model)
    reader = Reader(f, settings, f"--quant {quant}" if quant is not None else "quantization_config", model)
    reader.check()
    return build(model, reader)


def gguf_layout(model: Model, kind: str) -> Stored:
    """The GGUF file llama.cpp makes of the model with llama-quantize's type or mix (memory/gguf.py): each tensor padded
    to the file's alignment as written; the header and vocabulary, which a config does not fix, a labelled estimate."""
    from symparam.memory import gguf

    lay = gguf.layout(model, kind, masks=gguf.layer_masks(model.config, model))
    parts = tuple(Part(t.name, t.hf, t.dtype, t.shape, t.copies, t.padded_each) for t in lay.tensors)
    head = gguf.header_estimate(lay)
    header = (f"before the tensor data: {head['header_and_tensor_infos']:,} bytes of header and tensor infos (exact) and "
              f"about {head['metadata_and_vocabulary_estimate']:,} bytes of metadata and vocabulary (estimated: {head['note']})")
    title = f"GGUF {gguf.resolve_mix(kind)} ({'llama.cpp architecture ' + lay.arch if lay.arch else 'no llama.cpp converter for this family'})"
    return Stored(lay.format, title, parts, (), (*lay.notes, header), {"type": kind}, None, f"--quant {GGUF}{kind}")


def build(model: Model, reader: Reader) -> Stored:
    """Every part, kept module and note of the model (and of its checkpoint's extras) under one format."""
    stack = stack_path(model)
    specs = reader.parts()
    values = model.values or {}
    f = reader.f
    parts: list[Part] = []
    kept: dict[str, list[str]] = {}

    def place(leaves: list[Leaf], extra: str) -> None:
        decisions = [(leaf, reason(leaf, reader, stack)) for leaf in leaves if not leaf.term.tied]
        packed = {leaf.module for leaf, why in decisions if why is None}
        for leaf, why in decisions:
            if why is None and leaf.kind == "experts" and f.spec.get("loaded_experts") == "plain":  # packed in the file, not once loaded
                parts.extend(replace(p, resident=False) for p in quantized(leaf, reader, specs, values, extra))
                parts.append(replace(plain(leaf, reader.settings["dtype"], extra), stored=False))
                continue
            if why is None:
                parts.extend(quantized(leaf, reader, specs, values, extra))
                continue
            kept.setdefault(why, []).append(leaf.path)
            bias = leaf.kind in LINEAR and leaf.term.key == "bias" and leaf.module in packed
            parts.append(plain(leaf, leaf.term.dtype or (f.spec["bias"] if bias and "bias" in f.spec else reader.settings["dtype"]), extra))

    place(list(walk(model.tree, stack)), "")
    for path, what, term in model.recipe.build_extras(model.flags):
        place(list(walk(term, stack, path)), what)
    kept_words = tuple((words, tuple(dict.fromkeys(names))) for words, names in kept.items())
    per_matrix = sp.Add(*(p["bytes"] for p in specs))
    notes = tuple(reader.words(n) for n in f.notes)
    return Stored(f.name, f.title, tuple(parts), kept_words, notes, dict(reader.settings), per_matrix, reader.where)


def reason(leaf: Leaf, reader: Reader, stack: str) -> str | None:
    """Why a tensor is kept as it is, or None when the format packs it."""
    f, words = reader.f, table()["kept"]
    matrix = len(leaf.term.shape) == 2 and (leaf.term.key == "weight" if leaf.kind in LINEAR else leaf.term.matmul)
    if leaf.term.buffer or not matrix or leaf.kind not in (*LINEAR, "experts"):
        return words.get(leaf.kind if leaf.kind in ("head", "embedding", "router", "kept") else "other")
    if leaf.kind not in f.quantizes:
        return f"{leaf.kind} layers: {f.title} packs only {', '.join(f.quantizes)}"
    if f.spec.get("layers_only") and not leaf.in_layers:
        return words["outside"]
    if skipped(reader, leaf.module, stack, leaf.kind == "experts"):
        return words["skipped"] + f" ({f.skip['key']})"
    return None


def quantized(leaf: Leaf, reader: Reader, specs: list[dict[str, Any]], values: Mapping[str, int], extra: str) -> list[Part]:
    """The parts one packed matrix (or one expert's matrices, split as checkpoints store them) is stored as."""
    f = reader.f
    d_out, d_in = leaf.term.shape
    if leaf.kind in LINEAR:
        matrices = [(leaf.module, d_out)]
    elif f.experts == "fused":
        matrices = [(leaf.path, d_out)]
    else:
        split = table()["split"].get(leaf.term.key, [leaf.term.key])
        matrices = [(f"{leaf.module}.{name}", d_out / len(split)) for name in split]
    out = []
    for module, rows in matrices:
        if values:
            at = {make(k): v for k, v in values.items()}
            reader.require(int(rows.xreplace(at)), int(d_in.xreplace(at)), module)
        fused = f.experts == "fused" and leaf.kind == "experts"
        for spec in specs:
            subs = {D_OUT: rows, D_IN: d_in}
            shape = tuple(s.xreplace(subs) for s in spec["shape"])
            name = reader.words(spec["name"], {"m": module})
            copies, prefix = (leaf.copies / leaf.experts, (leaf.experts,)) if fused else (leaf.copies, ())
            out.append(Part(name, leaf.path, spec["dtype"], prefix + shape, copies, sp.Mul(*prefix) * spec["bytes"].xreplace(subs), extra, spec["resident"]))
    return out


def plain(leaf: Leaf, dtype: str, extra: str) -> Part:
    """A tensor stored as it is, in `dtype` (a Conv1D weight as transformers' Conv1D holds it, [d_in, d_out])."""
    shape = leaf.term.shape[::-1] if leaf.kind == "conv1d" and leaf.term.key == "weight" else leaf.term.shape
    return Part(leaf.path, leaf.path, dtype, shape, leaf.copies, sp.Mul(*shape) * DTYPE_BYTES[dtype], extra)


# --- what count says ---------------------------------------------------------------------------------------------


def checkpoint_extras(model: Model) -> list[dict[str, Any]]:
    """Values a published checkpoint stores beyond the parameters: buffers of the model (router score-correction
    biases) and the recipe's [checkpoint] extras (DeepSeek-V3's MTP layer), each with what it is."""
    from symparam.components import leaves

    values = model.values or {}
    out = []
    buffers = [(leaf, copies, path) for leaf, copies, _, path in leaves(model.tree) if leaf.buffer]
    for leaf, copies, path in buffers:
        out.append({"what": f"{leaf.note or leaf.label}", "tensor": path, "formula": str(copies * sp.Mul(*leaf.shape)),
                    "values": evaluate(copies * sp.Mul(*leaf.shape), values) if values else None})
    for path, what, term in model.recipe.build_extras(model.flags):
        elements = sp.Add(*(copies * sp.Mul(*leaf.shape) for leaf, copies, _, _ in leaves(term) if not leaf.tied))
        out.append({"what": what, "tensor": path, "formula": str(sp.expand(elements)), "values": evaluate(elements, values) if values else None})
    return [e for e in out if e["values"] != 0]


__all__ = ["Part", "Stored", "Format", "formats", "quant_names", "layout", "checkpoint_extras", "NONE", "GGUF"]
