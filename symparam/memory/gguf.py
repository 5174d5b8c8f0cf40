"""GGUF files as llama.cpp writes them: each tensor's GGUF name, ggml type and bytes for a model and a llama.cpp type or mix (Q4_K_M, ...), by the converter's and the quantizer's rules in conventions/gguf.toml."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import sympy as sp

from symparam.components import Term
from symparam.errors import SymparamError
from symparam.model import Model
from symparam.rules import Rule, compile_rule
from symparam.symbols import evaluate, make

TABLE_PATH = Path(__file__).parent / "conventions" / "gguf.toml"
ATTN_V_LIKE = ("attn_v", "attn_qkv", "attn_kv_b")


@cache
def table() -> dict[str, Any]:
    """conventions/gguf.toml, read once."""
    with TABLE_PATH.open("rb") as f:
        return tomllib.load(f)


@cache
def _rule(text: str) -> Rule:
    return compile_rule(text, f"{TABLE_PATH.name}: {text!r}")


@dataclass(frozen=True)
class GGUFTensor:
    """One row of a GGUF file's tensors: the copies (layers) of one GGUF tensor that share a type."""

    name: str  # GGUF name, layer index left out: "blk.attn_v.weight"
    hf: str  # the transformers parameter it stores, layer and expert indices left out
    dtype: str  # ggml type: "Q6_K"
    shape: tuple[sp.Expr, ...]  # one copy's shape, PyTorch order (a row of ncols = the last entry); experts lead
    copies: sp.Expr  # how many such tensors the file holds: N, floor(N/8) + ..., 1
    bytes_each: sp.Expr  # bytes of one copy: rows * ceiling(ncols/block) * bytes per block

    @property
    def bytes(self) -> sp.Expr:
        return self.copies * self.bytes_each

    @property
    def padded_each(self) -> sp.Expr:
        """One copy's bytes with the padding after it: GGUF starts each tensor at a multiple of the alignment."""
        align = table()["file"]["alignment"]
        return align * sp.ceiling(self.bytes_each / align)


@dataclass(frozen=True)
class Layout:
    """A model as one GGUF file: its tensors, the architecture llama.cpp gives it, and what the figures assume."""

    format: str  # "gguf:Q4_K_M"
    arch: str | None  # llama.cpp's architecture name, None for a family its converter does not convert
    tensors: tuple[GGUFTensor, ...]
    notes: tuple[str, ...]
    values: dict[str, int]
    files: tuple[tuple[str, str, int, tuple[int, ...]], ...]  # every tensor in llama.cpp's order: (name, type, bytes, shape)
    unmapped: tuple[str, ...] = ()  # tensors the name tables do not know: they keep their transformers names

    @property
    def formula(self) -> sp.Expr:
        """Tensor data bytes as the file lays them out (each tensor padded to the alignment)."""
        return sp.Add(*(t.copies * t.padded_each for t in self.tensors))

    @property
    def tensor_bytes(self) -> sp.Expr:
        """The tensors' own bytes, padding left out (what llama-quantize prints as the quant size)."""
        return sp.Add(*(t.bytes for t in self.tensors))

    def exact(self, expr: sp.Expr) -> int:
        return evaluate(expr, self.values, f"{self.format}: {expr}")

    @property
    def bytes(self) -> int:
        return self.exact(self.formula)


def type_bytes(dtype: str, ncols: sp.Expr) -> sp.Expr:
    """Bytes of one row of `ncols` weights in a ggml type: whole blocks."""
    t = table()["types"][dtype]
    return sp.ceiling(sp.sympify(ncols) / t["block"]) * t["bytes"]


def tensor_bytes(dtype: str, shape: Sequence[sp.Expr]) -> sp.Expr:
    """Bytes of one tensor: its rows (every dimension but the last) times one row."""
    return sp.Mul(*shape[:-1]) * type_bytes(dtype, shape[-1])


def _whole_bytes(dtype: str, shape: Sequence[int]) -> int:
    """tensor_bytes at whole numbers, without SymPy (a file has thousands of tensors)."""
    t = table()["types"][dtype]
    rows = 1
    for s in shape[:-1]:
        rows *= s
    return rows * -(-shape[-1] // t["block"]) * t["bytes"]


def resolve_mix(name: str) -> str:
    """A type or mix name as llama-quantize spells it (any case, Q4_K for Q4_K_M); an unknown one is an error."""
    t = table()
    key = name.upper()
    key = t["aliases"].get(key, key)
    if key not in t["mixes"]:
        raise SymparamError(f"--quant gguf:{name}: unknown llama.cpp type; known: {', '.join(t['mixes'])}")
    return key


# --- the model's tensors with their GGUF names --------------------------------------------------------------------


@dataclass(frozen=True)
class _Piece:
    """A transformers tensor as the converter writes it: one GGUF name, per-copy shape, layer count and positions."""

    gguf: str
    hf: str
    shape: tuple[sp.Expr, ...]
    layers: sp.Expr  # copies in the file: layers holding it (1 for a tensor outside the layers)
    in_layers: bool


def _pieces(model: Model, names: Mapping[str, Any]) -> tuple[list[_Piece], list[str], bool]:
    """Every stored tensor of the model with its GGUF name (unmapped ones keep their transformers name); whether the
    head is tied (no output.weight)."""
    pieces: list[_Piece] = []
    unmapped: list[str] = []
    tied = False

    def visit(term: Term, path: str, layers: sp.Expr, experts: sp.Expr, in_layers: bool) -> None:
        nonlocal tied
        path = f"{path}.{term.key}" if path and term.key else path or term.key
        if term.is_leaf:
            if term.tied:
                tied = True
                return
            target = names.get(path)
            if target is None:  # its transformers name, with the layer index and the suffix where llama.cpp puts them
                unmapped.append(path)
                target = (f"blk.{path}" if in_layers else path) + ("" if path.endswith((".weight", ".bias")) else ".weight")
            parts = [target] if isinstance(target, str) else list(target)
            shape = tuple(sp.sympify(s) for s in term.shape)
            for part in parts:
                if isinstance(part, str):  # the rows split evenly between the parts (a fused gate_up)
                    each = (shape[0] / len(parts), *shape[1:]) if len(parts) > 1 else shape
                else:  # the converter's own reshape, in the recipe's symbols (MLA's kv_b into k_b and v_b)
                    part, each = part["name"], tuple(sp.sympify(x, locals={n: make(n) for n in model.recipe.symbols}) for x in part["shape"])
                pieces.append(_Piece(part, path, (experts, *each) if experts != 1 else each, layers, in_layers))
            return
        if term.key == "experts" and term.times != 1:
            experts = experts * term.times
        elif term.times != 1:
            layers, in_layers = layers * term.times, True
        for child in term.children:
            visit(child, path, layers, experts, in_layers)

    visit(model.tree, "", sp.Integer(1), sp.Integer(1), False)
    return pieces, unmapped, tied


def _layer_sets(piece: _Piece, values: Mapping[str, int], masks: Mapping[str, Sequence[bool]]) -> tuple[list[int], bool]:
    """The layer indices holding a tensor: all N, a layer symbol's mask, or N minus one; else the first ones (False)."""
    n_layers = values["N"]
    layers = sp.expand(piece.layers)
    if layers == make("N"):
        return list(range(n_layers)), True
    for name, mask in masks.items():
        s = make(name)
        if layers == s:
            return [i for i, on in enumerate(mask) if on], True
        if layers == sp.expand(make("N") - s):
            return [i for i, on in enumerate(mask) if not on], True
    count = evaluate(layers, values, piece.hf)
    return list(range(count)), False


# --- the quantizer's rules ------------------------------------------------------------------------------------------


def category(name: str) -> str:
    """tensor_get_category: the first [[categories]] entry the GGUF name passes, else other."""
    for c in table()["categories"]:
        if name in c.get("equals", ()) or ("contains" in c and c["contains"] in name):
            return c["name"]
    return "other"


def quantizable(name: str, dims: int, arch: str | None) -> bool:
    """tensor_allows_quantization: 2-D or more, a name ending in weight, none of the excluded names."""
    q = table()["quantize"]
    banned = [*q["not_containing"], *q["arch_not_containing"].get(arch or "", ())]
    return dims >= 2 and name.endswith("weight") and not any(b in name for b in banned) and name not in q["not_equal"]


def source_type(name: str, dims: int, outtype: str) -> str:
    """The type the converter writes: F32 for 1-D tensors, norms, non-weights and its F32 list; else the outtype."""
    stem = re.sub(r"^blk\.(\d+\.)?", "", name).rsplit(".", 1)[0]
    f32 = dims <= 1 or name.endswith("_norm.weight") or not name.endswith((".weight", ".lora_a", ".lora_b")) or stem in table()["converter"]["f32_names"]
    return "F32" if f32 else outtype


def _mixes(spec: Any) -> set[str] | None:
    groups = table()["groups"]
    if spec is None:
        return None
    names = groups[spec] if isinstance(spec, str) else spec
    return {m for name in names for m in (groups.get(name, [name]))}


def _applies(entry: Mapping[str, Any], mix: str) -> bool:
    mixes = _mixes(entry.get("mixes"))
    excluded = _mixes(entry.get("except")) or set()
    return (mixes is None or mix in mixes) and mix not in excluded


def _holds(text: str | None, facts: Mapping[str, Any]) -> bool:
    if text is None:
        return True
    predicates = table()["predicates"]

    def read(key: str) -> Any:
        if key in predicates:
            return bool(_rule(predicates[key]["where"])(facts.get, facts["i"]))
        return facts.get(key)

    return bool(_rule(text)(read, facts.get("i")))


@cache
def _mix_rules(mix: str) -> tuple[tuple[dict[str, Any], ...], tuple[dict[str, Any], ...]]:
    """The rules and adjustments that apply to a mix, in order."""
    t = table()
    return tuple(r for r in t["rules"] if _applies(r, mix)), tuple(a for a in t["adjust"] if _applies(a, mix))


def choose(mix: str, facts: Mapping[str, Any], positions: Mapping[str, tuple[int, int]]) -> str:
    """llama_tensor_get_type for one quantizable tensor: the rules, the adjustments, then the fallback by row length."""
    t = table()
    base = t["mixes"][mix]["base"]
    if t["types"][base]["block"] == 1:  # F32, F16, BF16: no mix rules, no fallback
        return base
    chosen = base
    rules, adjusts = _mix_rules(mix)
    for rule in rules:
        pos = rule.get("position")
        here = {**facts, **(dict(zip(("i", "n"), positions[pos])) if pos else {})}
        if _holds(rule.get("when"), here):
            chosen = base if rule["type"] == "keep" else rule["type"]
            break
    for adjust in adjusts:
        if _holds(adjust["when"], facts):
            chosen = adjust["map"].get(chosen, adjust["map"].get("*", chosen))
    return fallback(chosen, facts["ncols"])


def fallback(dtype: str, ncols: int) -> str:
    """tensor_type_fallback: a type whose block does not divide the row falls back to a 32-block type, then F16."""
    types = table()["types"]
    if ncols % types[dtype]["block"] == 0:
        return dtype
    if dtype not in table()["fallback"] and types[dtype]["block"] > 32:
        raise SymparamError(f"gguf: llama.cpp has no fallback for {dtype} when a row of {ncols} is not a multiple of {types[dtype]['block']}")
    out = table()["fallback"].get(dtype, dtype)
    return out if ncols % types[out]["block"] == 0 else "F16"


# --- the layout ------------------------------------------------------------------------------------------------------


def layer_masks(raw: Mapping[str, Any], model: Model) -> dict[str, list[bool]]:
    """Which layers each of the model's layer-count symbols selects in its config (N_dense: i < first_k_dense_replace),
    for the rules that read a layer's position."""
    from symparam.config import Values, unwrap

    config, recipe, *_ = unwrap(dict(raw), model.recipe)
    values = Values(recipe, {**recipe.defaults, **config}, {})
    return {name: list(values.mask(name)) for name in recipe.layer_symbols if name in model.values}


def family_arch(model: Model) -> str | None:
    """llama.cpp's architecture for the model's family, None when its converter registers none of its classes."""
    entry = table()["archs"].get(model.recipe.family)
    return entry[0] if entry else None


def layout(model: Model, mix: str, masks: Mapping[str, Sequence[bool]] | None = None, outtype: str | None = None,
           imatrix: bool | None = None) -> Layout:
    """The GGUF file llama.cpp makes of `model` with llama-quantize's `mix` (or a plain type): per tensor its GGUF name,
    ggml type, shape, copies and bytes. `masks` gives the layers a layer-count symbol selects (N_dense: [True, ...]),
    needed where a mix's choice depends on a layer's position; `outtype` the converter's type for the tensors the
    quantizer keeps (BF16); `imatrix` whether an importance matrix is given (by default only where the mix needs one)."""
    t = table()
    mix = resolve_mix(mix)
    if model.values is None:
        raise SymparamError(f"{model.name}: a GGUF layout needs a configured model (its rules read the sizes)")
    values = dict(model.values)
    arch = family_arch(model)
    names = {**t["names"], **t["arch_names"].get(arch or "", {})}
    outtype = outtype or t["file"]["source_type"]
    imatrix = t["mixes"][mix].get("imatrix", False) if imatrix is None else imatrix
    pieces, unmapped, tied = _pieces(model, names)
    notes: list[str] = []
    if arch is None:
        notes.append(f"llama.cpp's converter does not convert {model.recipe.family} ({', '.join(model.recipe.architectures) or 'no HF class'}): "
                     "tensor names follow the generic Llama-like mapping, sizes llama.cpp's rules for an architecture it does not special-case")
    if unmapped:
        notes.append(f"{len(unmapped)} tensor(s) the generic name mapping does not know keep their transformers names: {', '.join(unmapped)}")

    def val(expr: sp.Expr) -> int:
        return evaluate(expr, values, f"{model.name}: {expr}")

    # every tensor of the file, in llama.cpp's order: outside the layers first, then by layer, then by name
    concrete: list[tuple[int, str, _Piece]] = []
    guessed = []
    for p in pieces:
        if p.in_layers:
            layers, known = _layer_sets(p, values, masks or {})
            if not known:
                guessed.append(p.hf)
            concrete.extend((i, p.gguf.replace("blk.", f"blk.{i}.", 1), p) for i in layers)
        else:
            concrete.extend((-1, p.gguf, p) for _ in range(val(p.layers)))
    concrete.sort(key=lambda c: (c[0], c[1]))

    h, h_kv = values.get("h", 0), values.get("h_kv", values.get("h", 0))
    n_expert = values.get("n", 0)
    facts_model = {
        "arch": arch or "", "n_expert": n_expert, "n_gqa": h // h_kv if h_kv else 0, "tied": tied, "imatrix": imatrix,
        "base": t["mixes"][mix]["base"], "base_block": t["types"][t["mixes"][mix]["base"]]["block"],
        "N": values["N"], "h": h, "h_kv": h_kv,
    }
    facts_model["model_70b"] = arch in t["model_70b"] and bool(_rule(t["model_70b"][arch])(facts_model.get))
    n_attn = sum(1 for _, name, _ in concrete if category(name) in ATTN_V_LIKE)
    counters: dict[str, int] = {}
    groups: dict[tuple[int, str], list[int]] = {}  # (piece, type) -> its layers: one row each
    files: list[tuple[str, str, int, tuple[int, ...]]] = []
    shapes = {id(p): tuple(val(s) for s in p.shape) for p in pieces}
    for layer, name, p in concrete:
        shape = shapes[id(p)]
        dims = len(shape) - next((k for k, s in enumerate(shape) if s != 1), len(shape))  # ggml_n_dims
        dtype = source_type(p.gguf, dims, outtype)
        if quantizable(p.gguf, dims, arch):
            cat = category(p.gguf)
            counter_key = "attn" if cat in ATTN_V_LIKE else cat
            i_count = counters.get(counter_key, 0)
            counters[counter_key] = i_count + 1
            positions = {"attn": (i_count, n_attn), "ffn_counter": (i_count, values["N"]),
                         "ffn_layer": (layer if n_expert > 1 else i_count, values["N"])}
            facts = {**facts_model, "category": cat, "ncols": shape[-1], "ne2": shape[0] if len(shape) == 3 else 1}
            dtype = choose(mix, facts, positions)
        files.append((name, dtype, _whole_bytes(dtype, shape), shape))
        groups.setdefault((id(p), dtype), []).append(layer)
    if guessed and any(r.get("position") for r in t["rules"] if _applies(r, mix)):
        notes.append(f"layer positions unknown for {', '.join(dict.fromkeys(guessed))}: taken as the first layers; pass masks for exact position rules")
    by_id = {id(p): p for p in pieces}
    tensors = []
    for (key, dtype), layers in groups.items():
        p = by_id[key]
        copies = _copies(p, layers, [g for k, g in groups.items() if k[0] == key], values)
        tensors.append(GGUFTensor(p.gguf, p.hf, dtype, p.shape, copies, tensor_bytes(dtype, p.shape)))
    notes.append(f"tensor data padded to {t['file']['alignment']}-byte alignment after each tensor, as llama.cpp writes it; "
                 f"tensors the quantizer keeps are in the converter's {outtype}" + ("; read with an importance matrix" if imatrix else ""))
    return Layout(f"gguf:{mix}", arch, tuple(tensors), tuple(notes), values, tuple(files), tuple(unmapped))


def _copies(p: _Piece, layers: list[int], all_groups: list[list[int]], values: Mapping[str, int]) -> sp.Expr:
    """How many copies of a tensor have this type, as an expression: all its copies, a predicate's count over the layers
    (use_more_bits: floor(N/8) + ...), its complement, or the number."""
    if len(all_groups) == 1:
        return p.layers
    n = values["N"]
    if not p.in_layers or sp.expand(p.layers) != make("N"):
        return sp.Integer(len(layers))
    chosen = set(layers)
    for pred in table()["predicates"].values():
        picked = {i for i in range(n) if _rule(pred["where"])({"n": n}.get, i)}
        count = sp.sympify(pred["count"], locals={"n": make("N")})
        if chosen == picked:
            return count
        if chosen == set(range(n)) - picked:
            return make("N") - count
    return sp.Integer(len(layers))


def header_estimate(lay: Layout, vocab: int | None = None) -> dict[str, Any]:
    """The bytes before the tensor data: the fixed header and the tensor infos (exact: each name, its dimensions, type
    and offset), and the metadata with the vocabulary (an estimate: the tokens are not known from a config)."""
    infos = sum(8 + len(name) + 4 + 8 * len(shape) + 4 + 8 for name, _, _, shape in lay.files)
    vocab = vocab or lay.values.get("V", 0)
    vocabulary = vocab * (8 + 7) + vocab * 4 + vocab * (8 + 12)  # token strings (~7 bytes each), token types, BPE merges
    return {
        "header_and_tensor_infos": 24 + infos,
        "metadata_and_vocabulary_estimate": 4096 + vocabulary,
        "note": "the 24-byte header and the tensor infos exact; the metadata estimated: ~4 KiB of architecture keys, and per "
                "token an 8-byte length and ~7 bytes of text, a 4-byte type and one BPE merge of ~20 bytes (SentencePiece "
                "vocabularies store 4-byte scores instead of merges); a chat template adds its length; then padding to 32 bytes",
    }


def rows(model: Model, mix: str, **kw: Any) -> dict[str, Any]:
    """The layout in the storage data model: format, bytes, formula, per tensor (GGUF name, HF parameter, dtype,
    shape per copy, copies, bytes per copy), and notes; the header and vocabulary as a separate, labelled estimate."""
    lay = layout(model, mix, **kw)
    return {
        "format": lay.format,
        "arch": lay.arch,
        "bytes": lay.bytes,
        "tensor_bytes": lay.exact(lay.tensor_bytes),
        "formula": str(lay.formula),
        "tensors": [{"name": t.name, "hf": t.hf, "dtype": t.dtype, "shape": [str(s) for s in t.shape], "copies": str(t.copies),
                     "bytes_each": str(t.bytes_each), "bytes": lay.exact(t.bytes)} for t in lay.tensors],
        "header": header_estimate(lay),
        "notes": list(lay.notes),
    }


__all__ = ["GGUFTensor", "Layout", "layout", "rows", "type_bytes", "tensor_bytes", "resolve_mix", "category", "quantizable",
           "source_type", "choose", "fallback", "family_arch", "layer_masks", "header_estimate", "table"]
