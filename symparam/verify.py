"""Verify a model against a safetensors checkpoint: read the headers only, group tensors by component, explain mismatches."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import sympy as sp
from sympy.printing.str import StrPrinter

from symparam.components import Term, leaves
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.safetensors import DTYPE_BYTES, DTYPE_NAMES, Tensor, header_tensors, locate, read_index, tensors
from symparam.symbols import evaluate, make

# transformers' naming that every family shares; what one family names its own way is in its recipe's [names] tables.
PREFIXES = ("model.", "transformer.")  # base-model wrappers in front of the module path; lm_head sits outside them
LAYER = re.compile(r"^(\w+)\.(\d+)\.")  # the decoder layer list (layers.3., GPT-2's h.3.)
INDEX = re.compile(r"\.\d+(?=\.|$)")  # expert and other indices, left out of names as the model's tree leaves them out

# Quantisation formats that pack several parameters into one stored element, whatever the family: tensor-name suffix ->
# (format, parameters per stored element). Their scales are quantisation state, in COMMON_NOT_PARAMETERS.
PACKED_FORMATS = {"_blocks": ("MXFP4", 2)}  # two 4-bit values per byte

# Renames every family shares (regex -> replacement), applied before the family's own [names.rename], on the name with
# prefixes, packed-format suffixes and expert indices removed (layer indices still in: `layers.3.`).
# "{a,b}" in a replacement: one stored tensor holds both (fused experts in transformers 5).
COMMON_RENAME = {  # Hub checkpoints store routed experts one by one; transformers 5 stacks them in one tensor per projection
    r"\.experts\.(gate_proj|up_proj)\.weight$": ".experts.gate_up_proj",
    r"\.experts\.down_proj\.weight$": ".experts.down_proj",
}
# Stored tensors that are not parameters (regex on the stored name -> why); a family adds its own in [names.not_parameters].
COMMON_NOT_PARAMETERS = {
    r"rotary_emb\.(original_)?inv_freq$": "rotary inv_freq buffer, recomputed at load",
    r"(weight_scale_inv|weight_scale|input_scale|_scales|\.absmax|\.quant_map|\.nested_absmax|\.nested_quant_map|\.SCB)$": "quantisation scale",
    r"\.quant_state\.": "quantisation state",
}
# Solved symbol values that have a name of their own: (symbol, the symbol its value equals) -> what it means.
EXPLANATIONS = {
    ("h_kv", "h"): "the checkpoint uses full multi-head attention, the config says grouped-query",
}


def parameters_in(t: Tensor) -> int:
    """Parameters a stored tensor holds: its elements, times the packing of a quantisation format."""
    return t.elements * next((per for suffix, (_, per) in PACKED_FORMATS.items() if t.name.endswith(suffix)), 1)


@dataclass
class Expected:
    """One tensor name of the model (indices left out): its bucket, and its shape and copies (layers x experts) in each
    layer kind that has it (Gemma 4's FFN is wider in some layers than in others; Zamba's shared block is stored in one
    layer kind and tied in the others)."""

    name: str
    bucket: str
    kinds: list[tuple[tuple[sp.Expr, ...], sp.Expr, bool]]  # (shape, copies, tied) per layer kind

    @property
    def stored(self) -> list[tuple[tuple[sp.Expr, ...], sp.Expr]]:
        """(shape, copies) of the kinds that store the tensor (a tied copy is stored elsewhere)."""
        return [(shape, copies) for shape, copies, tied in self.kinds if not tied]

    @property
    def tied(self) -> bool:
        return not self.stored

    @property
    def expr(self) -> sp.Expr:
        return sp.expand(sp.Add(*(copies * sp.Mul(*shape) for shape, copies in self.stored)))

    @property
    def shape(self) -> tuple[sp.Expr, ...] | None:
        """The one shape of every stored copy, or None where layer kinds differ."""
        shapes = {shape for shape, _ in self.stored}
        return shapes.pop() if len(shapes) == 1 else None

    @property
    def copies(self) -> sp.Expr:
        return sp.expand(sp.Add(*(copies for _, copies in self.stored)))


@dataclass(frozen=True)
class Report:
    """What verify found: totals, per-component figures, mismatches in words, and tensors that are not parameters."""

    source: str
    expected: int
    found: int
    match: bool
    mismatches: list[str]
    components: dict[str, dict[str, int]]  # bucket -> {"expected": .., "found": ..}
    not_parameters: list[dict[str, str]]  # {"tensor", "shape", "reason"}
    notes: list[str] = field(default_factory=list)
    unit: str = "parameters"  # "bytes" when only an index file was read

    def as_dict(self) -> dict[str, Any]:
        return {
            "source": self.source, "unit": self.unit, "expected": self.expected, "found": self.found, "match": self.match,
            "mismatches": self.mismatches, "components": self.components, "not_parameters": self.not_parameters, "notes": self.notes,
        }


# --- the model side --------------------------------------------------------------------------------------------


def strip(name: str) -> str:
    """A name without the base-model prefix (model., transformer.): checkpoints differ in whether they keep it."""
    while name.startswith(PREFIXES):
        name = name.split(".", 1)[1]
    return name


def expected_tensors(tree: Term) -> dict[str, Expected]:
    """Every tensor the model has, by name as transformers gives it (prefix and indices left out), copies summed over layer kinds."""
    found: dict[str, Expected] = {}
    for leaf, copies, bucket, path in leaves(tree):
        if leaf.buffer:
            continue
        name = strip(path)
        found.setdefault(name, Expected(name, bucket or "", [])).kinds.append((leaf.shape, copies, leaf.tied))
    return found


def buffers(tree: Term) -> dict[str, str]:
    """Checkpoint names of the model's buffers (stored, not parameters) as patterns -> what they are."""
    return {re.escape(strip(path)).replace(r"\.", r"(\.\d+)?\.") + "$": f"{leaf.note or leaf.label} (a buffer, not a parameter)"
            for leaf, _, _, path in leaves(tree) if leaf.buffer}


# --- the checkpoint side ---------------------------------------------------------------------------------------


def name_tables(model: Model) -> tuple[dict[str, str], dict[str, str]]:
    """(renames, not-parameter rules): the shared ones, the family's [names.rename] / [names.not_parameters], its buffers."""
    names = model.recipe.names
    rules = {**COMMON_NOT_PARAMETERS, **buffers(model.tree), **names.get("not_parameters", {})}
    return {**names.get("rename", {}), **COMMON_RENAME}, rules


def not_parameter(name: str, layer: int | None, rules: dict[str, str], layers: int | None) -> str | None:
    """Why a stored tensor is not a parameter (a rule, or a layer past num_hidden_layers), or None."""
    why = next((why for pattern, why in rules.items() if re.search(pattern, name)), None)
    if why is None and layer is not None and layers is not None and layer >= layers:
        why = f"layer {layer} is beyond num_hidden_layers = {layers} (a multi-token-prediction layer)"
    return why


def normalise(name: str, renames: dict[str, str]) -> tuple[int | None, list[str]]:
    """(layer index or None, model names) for a stored name: prefix, indices and family spellings removed."""
    name = strip(name)
    for suffix in PACKED_FORMATS:
        name = name.removesuffix(suffix)
    layer = LAYER.match(name)
    name = INDEX.sub("", name)
    for pattern, replacement in renames.items():
        name = re.sub(pattern, replacement, name)
    fused = re.search(r"\{([^}]*)\}", name)
    names = [name[: fused.start()] + part + name[fused.end():] for part in fused.group(1).split(",")] if fused else [name]
    return (int(layer.group(2)) if layer else None), names


def pattern(name: str) -> str:
    """A stored name with its layer and expert indices as *, to list many tensors as one line."""
    return re.sub(r"\.\d+\.", ".*.", name)


# --- comparing -------------------------------------------------------------------------------------------------


class _Values(StrPrinter):
    """Prints an expression with each symbol replaced by its value, keeping the formula's order: d*h_d*h_kv -> 4096*128*8."""

    def __init__(self, values: dict[str, int]):
        super().__init__()
        self.values = values

    def _print_Symbol(self, expr: sp.Symbol) -> str:
        return str(self.values[expr.name])


def with_values(expr: sp.Expr, values: dict[str, int]) -> str:
    return _Values(values).doprint(expr)


def fits(expr: sp.Expr, target: int, values: dict[str, int]) -> list[tuple[str, int]]:
    """(symbol, value) pairs, one symbol changed, that make `expr` equal `target`: what the checkpoint's shape says."""
    out = []
    for sym in sorted(expr.free_symbols, key=str):
        others = {make(k): sp.Integer(v) for k, v in values.items() if k != sym.name}
        x = sp.Symbol(sym.name, positive=True)  # real: an integer symbol would hide roots from solve
        for root in sp.solve(sp.Eq(expr.xreplace(others).xreplace({sym: x}), target), x):
            if root.is_Integer and root > 0 and int(root) != values.get(sym.name):
                out.append((sym.name, int(root)))
    return out


def explain(symbol: str, value: int, values: dict[str, int], model: Model) -> str:
    """A solved value in words: the config key to change, and what the value means where it has a name."""
    keys = model.recipe.config_keys(symbol)
    said = f"{keys[0]} = {values[symbol]}" if keys and symbol in values else f"{symbol} = {values.get(symbol)}"
    named = next((text for (s, other), text in EXPLANATIONS.items() if s == symbol and values.get(other) == value), None)
    base = f"fits {symbol} = {value} ({model.recipe.symbols[symbol].meaning}; the config says {said})"
    return f"{base}: {named}" if named else base


def per_copy(copies: sp.Expr, model: Model) -> str:
    """Words for one copy of a multiplicity: " per layer", " per expert per layer", or ""."""
    names = {str(s) for s in copies.free_symbols}
    words = (["expert"] if "n" in names else []) + (["layer"] if names & ({"N"} | set(model.recipe.layer_symbols)) else [])
    return "".join(f" per {w}" for w in words)


@dataclass
class Unit:
    """Canonical names a set of stored tensors covers (one, or several for a fused tensor), and what is stored."""

    names: set[str] = field(default_factory=set)
    stored: list[Tensor] = field(default_factory=list)


def group_units(model_tensors: dict[str, Expected], stored: list[tuple[Tensor, list[str]]]) -> list[Unit]:
    """Join canonical names that share stored tensors (fused experts) into units; every expected name is in one."""
    owner: dict[str, Unit] = {}
    for name in model_tensors:
        owner[name] = Unit({name})
    for tensor, names in stored:
        units = {id(owner[n]): owner[n] for n in names if n in owner}
        merged = Unit({n for u in units.values() for n in u.names} | set(names), [t for u in units.values() for t in u.stored])
        merged.stored.append(tensor)
        for n in merged.names:
            owner[n] = merged
    return list({id(u): u for u in owner.values()}.values())


def diagnose(units: list[tuple[Unit, sp.Expr, int]], values: dict[str, int]) -> dict[int, tuple[str, int]]:
    """For each mismatched unit, the one-symbol change that makes most units match, if any."""
    mismatched = [(i, expr, found) for i, (unit, expr, found) in enumerate(units) if found and evaluate(expr, values) != found]
    candidates = {c for _, expr, found in mismatched for c in fits(expr, found, values)}

    def score(candidate: tuple[str, int]) -> int:
        trial = {**values, candidate[0]: candidate[1]}
        return sum(evaluate(expr, trial) == found for _, expr, found in units)

    ranked = sorted(candidates, key=lambda c: (-score(c), c))
    best = {}
    for i, expr, found in mismatched:
        options = [c for c in ranked if c in set(fits(expr, found, values))]
        if options:
            best[i] = options[0]
    return best


def describe(unit: Unit, model_tensors: dict[str, Expected], expected: int, found: int, fit: tuple[str, int] | None, model: Model) -> str:
    """One mismatch in words: the tensor, what the config implies, what the checkpoint holds, and what to change."""
    values = model.values or {}
    parts = [model_tensors[n] for n in sorted(unit.names) if n in model_tensors]
    label = " + ".join(sorted(unit.names))
    bucket = parts[0].bucket if parts else "not in the model"
    stored_as = sorted({pattern(t.name) for t in unit.stored})
    where = f" (stored as {', '.join(stored_as)})" if stored_as and stored_as != [label] else ""
    if not parts or expected == 0 and not any(p.tied for p in parts):
        return f"{label}: stored ({len(unit.stored)} tensors, {found:,} values) but not part of the {model.recipe.title} model{where}{_switch_hint(model, label)}"
    if any(p.tied for p in parts) and found:
        key = _tie_key(model)
        return (f"{label} ({bucket}): stored ({found:,} values) but the config ties the head to the input embedding "
                f"({key} = true): if the head is trained separately, set {key} to false; if it is a copy, the file stores it twice")
    uniform = all(p.shape is not None for p in parts) and all(p.copies == parts[0].copies for p in parts)
    per_copy_expr = sp.Add(*(sp.Mul(*p.shape) for p in parts)) if uniform else sp.Integer(0)
    copies = parts[0].copies if uniform else None
    if copies is None or per_copy_expr.free_symbols == set():
        formula = sp.Add(*(p.expr for p in parts))
        said = f"expected {formula} = {expected:,}"
    else:
        each = per_copy(copies, model)
        said = f"expected {per_copy_expr} = {with_values(per_copy_expr, values)}{each} (x{evaluate(copies, values):,})"
    if not found:
        tieable = bool(_tie_key(model)) and parts[0].bucket == "LM head"
        hint = f": the checkpoint ties the head to the input embedding; set {_tie_key(model)} to true" if tieable else _switch_hint(model, label)
        return f"{label} ({bucket}): {said}, not stored{hint}"
    if fit is None:
        shapes = ", ".join(sorted({str(list(t.shape)) for t in unit.stored}))
        return f"{label} ({bucket}): {said}, found {found:,} values in {len(unit.stored)} tensors of shape {shapes}{where}"
    symbol, value = fit
    trial = {**values, symbol: value}
    if copies is not None and make(symbol) in per_copy_expr.free_symbols:
        got = f"found {with_values(per_copy_expr, trial)}{per_copy(copies, model)}"
    else:
        got = f"found {found:,}"
    return f"{label} ({bucket}): {said}, {got}{where}: {explain(symbol, value, values, model)}"


def _tie_key(model: Model) -> str:
    """The config key that ties the head to the embedding ("tie_word_embeddings"), if the family reads one."""
    rule = model.recipe.switches.get("tied")
    return rule.text if rule is not None and rule.reads == (rule.text,) else ""


def _switch_hint(model: Model, label: str) -> str:
    """For a bias stored but not expected (or the reverse): the config keys that switch biases."""
    if not label.endswith(".bias"):
        return ""
    keys = [f"{rule.text} = {str(model.flags.get(name)).lower()}" for name, rule in model.recipe.switches.items()
            if "bias" in name and rule.reads == (rule.text,)]
    return f": check the bias switches ({', '.join(keys)})" if keys else ": the family has no bias here"


def compare(model: Model, stored: list[Tensor], source: str) -> Report:
    """Expected tensors of `model` against the stored tensors, grouped into components; a checkpoint whose config
    carries a quantization_config is compared part by part against its stored layout (compare_stored)."""
    from symparam.memory import storage

    layout = storage.layout(model)
    if layout is not None:
        return compare_stored(model, layout, stored, source)
    values = model.values or {}
    renames, rules = name_tables(model)
    layers = values.get("N")
    model_tensors = expected_tensors(model.tree)
    kept = {strip(path): f"{leaf.note or leaf.label} (a buffer, not a parameter)" for leaf, _, _, path in leaves(model.tree) if leaf.buffer}
    skipped, params, seen_layers = [], [], set()  # a buffer is known by its stored name, or by the name a rename gives it
    for t in stored:
        layer, names = normalise(t.name, renames)
        why = not_parameter(t.name, layer, rules, layers) or next((kept[n] for n in names if n in kept), None)
        if why:
            skipped.append({"tensor": t.name, "shape": str(list(t.shape)), "dtype": t.dtype, "reason": why})
            continue
        if layer is not None:
            seen_layers.add(layer)
        params.append((t, names))
    units = group_units(model_tensors, params)
    rows = [(u, sp.Add(*(model_tensors[n].expr for n in u.names if n in model_tensors)), sum(parameters_in(t) for t in u.stored)) for u in units]
    fit = diagnose(rows, values)
    mismatches, components = [], defaultdict(lambda: {"expected": 0, "found": 0})
    for i, (unit, expr, found) in enumerate(rows):
        expected = evaluate(expr, values)
        bucket = next((model_tensors[n].bucket for n in sorted(unit.names) if n in model_tensors), "not in the model")
        components[bucket]["expected"] += expected
        components[bucket]["found"] += found
        if expected != found:
            mismatches.append(describe(unit, model_tensors, expected, found, fit.get(i), model))
    if layers is not None and seen_layers and len(seen_layers) < layers:
        missing = sorted(set(range(layers)) - seen_layers)
        mismatches.append(f"layers: the checkpoint stores {len(seen_layers)} decoder layers, the config says {layers} (num_hidden_layers); missing: {_ranges(missing)}")
    expected_total, found_total = model.count().total, sum(parameters_in(t) for t, _ in params)
    order = list(model.components) + ["not in the model"]
    table = {b: components[b] for b in order if b in components}
    return Report(source, expected_total, found_total, not mismatches and expected_total == found_total, mismatches, table, skipped)


def compare_stored(model: Model, layout: Any, stored: list[Tensor], source: str) -> Report:
    """A quantized checkpoint part by part: every tensor of the stored layout (packed weights, scales, zero points, group
    indices, tensors kept as they are, the checkpoint's extras) by name with layer and expert indices left out, with its
    count, shape and dtype; bytes per component. Scales and zeros are expected tensors, not mismatches."""
    values = model.values or {}
    renames = model.recipe.names.get("rename", {})
    rules = {**{k: v for k, v in COMMON_NOT_PARAMETERS.items() if "scale" not in v and "state" not in v}, **model.recipe.names.get("not_parameters", {})}
    report = layout.report(values)
    buckets = {name: e.bucket for name, e in expected_tensors(model.tree).items()}
    expected: dict[str, Counter] = defaultdict(Counter)
    bucket_of: dict[str, str] = {}
    for t in report["tensors"]:
        name = strip(t["name"])
        expected[name][(tuple(t["dims"]), t["dtype"])] += t["count"]
        bucket_of[name] = "checkpoint extras" if "extra" in t else buckets.get(strip(t["stores"]), "other")
    found: dict[str, Counter] = defaultdict(Counter)
    components: dict[str, dict[str, int]] = defaultdict(lambda: {"expected": 0, "found": 0})
    for t in report["tensors"]:
        components[bucket_of[strip(t["name"])]]["expected"] += t["bytes"]
    skipped, mismatches = [], []
    for t in stored:
        name = INDEX.sub("", strip(t.name))
        for pattern, replacement in renames.items():
            name = re.sub(pattern, replacement, name)
        why = None if name in expected else next((why for pattern, why in rules.items() if re.search(pattern, t.name)), None)
        if why:
            skipped.append({"tensor": t.name, "shape": str(list(t.shape)), "dtype": t.dtype, "reason": why})
            continue
        found[name][(t.shape, t.dtype)] += 1
        components[bucket_of.get(name, "not in the layout")]["found"] += t.bytes or 0
    for name in sorted(set(expected) | set(found)):
        if expected[name] != found[name]:
            mismatches.append(f"{name}: expected {_parts(expected[name]) or 'nothing'}, found {_parts(found[name]) or 'nothing'}")
    found_bytes = sum(t.bytes or 0 for t in stored if not any(s["tensor"] == t.name for s in skipped))
    note = f"stored as {layout.title} (from {layout.source}): compared part by part, {report['tensor_count']:,} tensors expected"
    return Report(source, report["bytes"], found_bytes, not mismatches and found_bytes == report["bytes"], mismatches, dict(components), skipped, [note], unit="bytes")


def _parts(counts: Counter) -> str:
    """{((12, 56), "F32"): 61} as "61 x F32[12, 56]"."""
    return ", ".join(f"{n:,} x {dtype}{list(shape)}" for (shape, dtype), n in sorted(counts.items(), key=str))


def compare_index(model: Model, index_path: Path, dtype: str) -> Report:
    """Only an index: metadata.total_size against the parameter count times the bytes per parameter of `dtype`."""
    index = read_index(index_path)
    size = index.get("metadata", {}).get("total_size") if isinstance(index.get("metadata"), dict) else None
    if type(size) is not int or size < 0:
        raise SymparamError(f"{index_path}: metadata.total_size is missing or not a whole number of bytes")
    from symparam.memory import storage

    layout = storage.layout(model)
    if layout is not None:  # a quantized checkpoint: total_size against its stored layout, exactly
        expected = layout.report(model.values or {})["bytes"]
        words = [] if size == expected else [f"total_size: expected {expected:,} bytes stored as {layout.title}, found {size:,} bytes ({size - expected:+,})"]
        notes = [f"only the index was read: {len(index['weight_map'])} tensors named, no shapes; total_size compared with the stored layout ({layout.source})"]
        return Report(str(index_path), expected, size, not words, words, {}, [], notes, unit="bytes")
    code = DTYPE_NAMES.get(dtype, dtype)
    if code not in DTYPE_BYTES:
        raise SymparamError(f"--dtype: unknown {dtype!r}; known: {', '.join(DTYPE_NAMES)}")
    width, total = DTYPE_BYTES[code], model.count().total
    renames, rules = name_tables(model)
    layers = (model.values or {}).get("N")
    skipped = []
    for name in index["weight_map"]:
        layer, _ = normalise(name, renames)
        why = not_parameter(name, layer, rules, layers)
        if why:
            skipped.append({"tensor": name, "shape": "?", "dtype": "?", "reason": why})
    expected = total * width
    mismatches = []
    if size != expected:
        implied = size / width
        gap = size - expected
        words = f"total_size: expected {total:,} parameters x {width} bytes ({dtype}) = {expected:,} bytes, found {size:,} bytes ({implied:,.0f} parameters at {width} bytes, {'+' if gap > 0 else ''}{gap:,} bytes)"
        if skipped:
            words += f"; total_size includes {len(skipped)} stored tensors that are not parameters (listed), read the shards for an exact comparison"
        else:
            words += other_dtype(size / total, width) if total else ""
        mismatches.append(words)
    notes = [f"only the index was read: {len(index['weight_map'])} tensors named, no shapes; total_size compared at {width} bytes per parameter ({dtype})"]
    return Report(str(index_path), expected, size, not mismatches, mismatches, {}, skipped, notes, unit="bytes")


# How close bytes per parameter must come to a whole width to read as another dtype: scales, buffers and a few
# parameters more or less move the ratio a little (DeepSeek-V3's fp8 block scales add 0.02%), never by 5%.
WHOLE_WIDTH = 0.05


def other_dtype(ratio: float, width: int) -> str:
    """A hint when total_size / parameters is (nearly) the whole width of a dtype other than the one assumed."""
    nearest = round(ratio)
    names = [name for name, code in DTYPE_NAMES.items() if DTYPE_BYTES[code] == nearest]
    if nearest == width or not names or abs(ratio - nearest) > WHOLE_WIDTH:
        return ""
    return f"; that is {ratio:.3f} bytes per parameter, the width of {', '.join(names)}: is the checkpoint in another dtype? pass --dtype"


def _ranges(indices: list[int]) -> str:
    """[3, 4, 5, 9] -> "3-5, 9"."""
    out, start = [], None
    for i, x in enumerate(indices):
        if start is None:
            start = x
        if i + 1 == len(indices) or indices[i + 1] != x + 1:
            out.append(f"{start}-{x}" if x != start else str(x))
            start = None
    return ", ".join(out)


def configured(model: Model) -> Model:
    if model.values is None:
        raise SymparamError("verify needs a configured model: --model NAME or --config FILE")
    return model


def verify(model: Model, path: str | Path, dtype: str = "bf16") -> Report:
    """Compare `model` (with values) against the checkpoint at `path`; `dtype` is used only when just an index is there."""
    configured(model)
    shards, index = locate(path)
    if not shards:
        return compare_index(model, index, dtype)
    stored = [t for shard in shards for t in tensors(shard)]
    return compare(model, stored, str(path))


def verify_remote(model: Model, target: str, revision: str) -> Report:
    """Compare `model` against a published checkpoint (a Hub id or a URL), reading only its safetensors headers over HTTP."""
    from symparam.hub import remote_checkpoint

    configured(model)
    checkpoint = remote_checkpoint(target, revision)
    stored = [t for name, header in checkpoint.headers for t in header_tensors(header, name)]
    report = compare(model, stored, checkpoint.label)
    read = f"read over HTTP: the headers of {len(checkpoint.headers)} safetensors file(s), {checkpoint.read:,} bytes, no tensor data"
    return replace(report, notes=[*report.notes, read])


def config_dtype(raw: dict[str, Any]) -> str:
    """The dtype a config.json names (torch_dtype or dtype), bf16 if it names none."""
    value = raw.get("torch_dtype") or raw.get("dtype") or "bf16"
    return str(value).removeprefix("torch.")


def text(report: Report) -> str:
    """The report as lines a user reads: a component table, tensors that are not parameters, mismatches, the verdict."""
    lines = [f"checkpoint: {report.source}"] + [f"note: {n}" for n in report.notes]
    if report.components:
        width = max(len(b) for b in report.components)
        lines.append(f"{'component':<{width}}  {'expected':>17}  {'found':>17}")
        for bucket, row in report.components.items():
            flag = "ok" if row["expected"] == row["found"] else "MISMATCH"
            lines.append(f"{bucket:<{width}}  {row['expected']:>17,}  {row['found']:>17,}  {flag}")
    lines.append(f"total {report.unit}: expected {report.expected:,}, found {report.found:,}")
    for item in report.not_parameters:
        lines.append(f"not a parameter (not counted): {item['tensor']} {item['shape']}: {item['reason']}")
    lines += [f"mismatch: {m}" for m in report.mismatches]
    lines.append("match" if report.match else f"MISMATCH ({len(report.mismatches)})")
    return "\n".join(lines)


__all__ = ["verify", "verify_remote", "compare", "compare_index", "Report", "expected_tensors", "normalise", "config_dtype", "text"]
