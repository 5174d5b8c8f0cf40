"""LoRA and DoRA adapters as peft applies them to a transformers model: which modules and parameters they adapt, the
adapted model's tree (the base frozen, lora_A [r, d_in] and lora_B [d_out, r] trainable), and its forward.

peft 0.21.2: `target_modules` names modules by suffix, or "all-linear" (every nn.Linear and Conv1D but the output
embeddings). For model types whose experts transformers 5 fused, peft maps the v4 names onto the fused parameters
(conventions/peft.toml): a ParamWrapper adds lora_A [experts*r, in] and lora_B [out, experts*r] to a 3-D (or the
router's 2-D) parameter, at rank 2r where two projections were fused, and the parameter becomes its value plus the
adapters' product for the forward.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from typing import Any

import sympy as sp

from symparam.components import ONE, Code, Term, tensor
from symparam.errors import SymparamError

LINEAR = ("linear", "conv1d")  # module kinds that are nn.Linear or transformers' Conv1D
ADAPTER = ".lora_"  # a path with it is an adapter's: the only parameters that train


@dataclass(frozen=True)
class Lora:
    """An adapter configuration: rank, targets (module names or "all-linear"), DoRA, alpha (scaling = alpha / r)."""

    r: int
    targets: tuple[str, ...] | str = ("q_proj", "v_proj")
    dora: bool = False
    alpha: int = 8  # peft's default lora_alpha

    @property
    def scaling(self) -> sp.Rational:
        return sp.Rational(self.alpha, self.r)


@cache
def conversions() -> dict[str, dict[str, Any]]:
    text = resources.files("symparam.memory").joinpath("conventions", "peft.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)["conversions"]


def conversion(model_type: str) -> dict[str, Any] | None:
    """peft's v4 -> v5 mapping for a model type whose experts transformers fused, if any."""
    return next((c for c in conversions().values() if model_type in c["model_types"]), None)


def trainable(path: str) -> bool:
    """Whether a parameter trains under LoRA: only the adapters' do."""
    return ADAPTER in path


def matches(path: str, names: set[str]) -> bool:
    """peft's target match: the name, or a name ending in "." + it."""
    return any(path == n or path.endswith("." + n) for n in names)


@dataclass(frozen=True)
class Targets:
    """What peft adapts in one model: module names (suffixes), parameter names (suffixes) with their rank factor."""

    modules: set[str] | None  # None: every linear module but the head ("all-linear" without a conversion)
    parameters: dict[str, int]  # parameter name suffix -> rank multiplier (2 for the fused gate and up projection)


def targets(lora: Lora, model_type: str, linear_names: set[str]) -> Targets:
    """Resolve `lora.targets` as peft does for this model type; `linear_names` are the leaf names of its linear modules."""
    conv = conversion(model_type)
    every = lora.targets == "all-linear"
    if conv is None:
        return Targets(None if every else set(lora.targets), {})
    names = (linear_names | set(conv["targets"])) if every else set(lora.targets)
    mapped = {n for n in names if n in conv["targets"]}
    parameters: dict[str, int] = {}
    for n in mapped:
        new = conv["targets"][n]
        fused = conv["fused"].get(new, [n])
        present = [f for f in fused if f in names]
        if len(present) < len(fused):
            raise SymparamError(f"--lora-targets: {', '.join(present)} without {', '.join(f for f in fused if f not in names)}: peft refuses, they are fused into {new}")
        parameters[new] = len(fused)
    return Targets(names - mapped, parameters)


def linear_leaf_names(term: Term) -> set[str]:
    """The names of the linear modules of a tree (q_proj, gate_proj, ...)."""
    found = {term.key} if term.module in LINEAR else set()
    return found.union(*(linear_leaf_names(c) for c in term.children)) if term.children else found


def adapt(model: Any, lora: Lora) -> Any:
    """The model with peft's adapters: a new tree (the same config), trainable only where ADAPTER is in the path."""
    if type(lora.r) is not int or lora.r <= 0:
        raise SymparamError(f"--lora: the rank must be a positive integer, got {lora.r!r}")
    model_type = str(model.config.get("model_type", model.recipe.model_types[0]))
    chosen = targets(lora, model_type, linear_leaf_names(model.tree))
    if lora.dora and chosen.parameters:
        raise SymparamError("--dora: peft does not combine DoRA with adapters on fused experts or routers (its ParamWrapper refuses LoRA variants)")
    adapted, found, _ = _adapt(model.tree, "", chosen, lora, model.recipe)
    if not found:
        wanted = "all-linear" if lora.targets == "all-linear" else ", ".join(lora.targets)
        raise SymparamError(f"--lora-targets: {wanted} matches no module of {model.recipe.family}; its linear modules: {', '.join(sorted(linear_leaf_names(model.tree)))}")
    return model.with_tree(adapted)


def _adapt(term: Term, path: str, chosen: Targets, lora: Lora, recipe: Any) -> tuple[Term, list[str], tuple[Term, ...]]:
    """The subtree with adapters, the paths adapted, and adapters that belong beside it (a routed group's: its
    copies are stacked experts, the adapters are one tensor for all of them)."""
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    if term.module in LINEAR and _targeted(term, path, chosen):
        return _lora_module(term, lora, recipe), [path], ()
    routed = term.active_times != term.times
    children: list[Term] = []
    found: list[str] = []
    adapters: list[Term] = []
    for child in term.children:
        if child.is_leaf:
            rank = _parameter_rank(path, child, chosen)
            if not rank:
                children.append(child)
                continue
            experts = term.times if routed else ONE
            prefix = f"{term.key}.{child.key}" if routed else child.key
            a, b = _parameter_adapters(prefix, child, lora.r * rank, experts)
            base = path.rsplit(".", 1)[0] if routed else path
            children.append(replace(child, lora=(lora.scaling, experts, f"{base}.{a.key}.weight", f"{base}.{b.key}.weight")))
            (adapters if routed else children).extend((a, b))
            found.append(f"{path}.{child.key}")
            continue
        new, more, beside = _adapt(child, path, chosen, lora, recipe)
        children += [new, *beside]
        found += more
    if not found:
        return term, [], ()
    return replace(term, children=tuple(children)), found, tuple(adapters)


def _targeted(term: Term, path: str, chosen: Targets) -> bool:
    if term.module == "head":
        return False
    return chosen.modules is None or matches(path, chosen.modules)


def _parameter_rank(path: str, leaf: Term, chosen: Targets) -> int:
    return next((rank for name, rank in chosen.parameters.items() if matches(f"{path}.{leaf.key}", {name})), 0)


def _adapter(key: str, shape: tuple, note: str, code: Code | None = None) -> Term:
    """An adapter module holding one weight, kept in float32 (peft's autocast_adapter_dtype upcasts bf16 and fp16)."""
    name = key.rsplit(".", 1)[-1]
    leaf = tensor("weight", "W_{" + name.replace("_", "\\_") + "}", shape, note, component="LoRA adapters", dtype="F32")
    return Term(key=key, label=name, children=(leaf,), component="LoRA adapters", module="lora", code=code)


def _lora_module(term: Term, lora: Lora, recipe: Any) -> Term:
    """peft's lora.Linear around a linear module: base_layer (frozen), lora_A, lora_B (and DoRA's magnitude)."""
    d_out, d_in = next(c for c in term.children if c.key == "weight").shape  # recipes write Conv1D's weight [d_out, d_in] too
    linear = Code(recipe.blocks["linear"].meta["forward"], "LoRA adapter (an nn.Linear)", (("bias", False),), entries=("weight", "bias"))
    parts = [replace(term, key="base_layer"), _adapter("lora_A", (sp.Integer(lora.r), d_in), "LoRA down-projection r x d_in", linear),
             _adapter("lora_B", (d_out, sp.Integer(lora.r)), "LoRA up-projection d_out x r", linear)]
    name = "dora_linear" if lora.dora else "lora_linear"
    if lora.dora:
        parts.append(_adapter("lora_magnitude_vector", (d_out,), "DoRA magnitude, one per output feature",
                              Code(recipe.blocks["dora_magnitude"].meta["forward"], "DoRA (peft DoraLinearLayer)", (("scaling", lora.scaling),), entries=("weight",))))
    code = Code(recipe.blocks[name].meta["forward"], f"{'DoRA' if lora.dora else 'LoRA'} (peft lora.Linear)", (("scaling", lora.scaling),),
                entries=tuple(p.key for p in parts))
    return Term(key=term.key, label=term.label, note=term.note, children=tuple(parts), component=term.component, module="lora", code=code)


def _parameter_adapters(prefix: str, leaf: Term, rank: int, experts: sp.Expr) -> tuple[Term, Term]:
    """peft's ParamWrapper adapters of one parameter [out, in] (per expert): lora_A [experts*rank, in], lora_B
    [out, experts*rank] (a 3-D parameter [experts, out, in] swaps in and out, as peft does for experts not stored
    transposed, which gives these shapes)."""
    d_out, d_in = leaf.shape[-2], leaf.shape[-1]
    return (_adapter(f"{prefix}.lora_A", (experts * rank, d_in), "LoRA down-projection of every expert"),
            _adapter(f"{prefix}.lora_B", (d_out, experts * rank), "LoRA up-projection of every expert"))


def trainable_parameters(model: Any) -> sp.Expr:
    """The adapters' parameters, all copies, as a formula."""
    from symparam.components import leaves

    return sp.expand(sp.Add(*(copies * leaf.each for leaf, copies, _, name in leaves(model.tree) if trainable(name))))


def adapted(model: Any) -> list[str]:
    """The modules and parameters the adapters sit on, as transformers names them (layer indices left out)."""
    from symparam.components import walk

    found = [path for node, _, _, path in walk(model.tree) if node.module == "lora" and not path.rsplit(".", 1)[-1].startswith("lora_")]
    found += [path for node, _, _, path in walk(model.tree) if node.is_leaf and node.lora]
    return found


__all__ = ["Lora", "trainable_parameters", "adapted", "Targets", "adapt", "targets", "trainable", "conversion"]
