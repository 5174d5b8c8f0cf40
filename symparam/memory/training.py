"""The training step: weights, gradients, optimizer states and activations, and when each is live, so its peak.

A step from the second on (optimizer states exist): forward (activations accumulate; the outputs the caller holds:
logits, loss, a KV cache), loss.backward() (activations freed as their layers' gradients appear),
optimizer.step(), optimizer.zero_grad(set_to_none=True), the outputs dropped. Conventions (what the optimizer keeps,
in which dtype) are data: conventions/optimizers.toml. The live bytes are tensor storage bytes, as a live-storage
tracker under FakeTensorMode counts them; the model's non-persistent buffers (rotary frequency tables) are left out.
"""

from __future__ import annotations

import copy
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import sympy as sp

from symparam.components import ONE, Term, frozen, leaves
from symparam.errors import SymparamError
from symparam.memory.activations import Activations, checked_trace, kept, once, parts
from symparam.memory.ops import BYTES
from symparam.memory.trace import Mode, Trace
from symparam.rules import compile_rule
from symparam.symbols import B, S, evaluate, parse

INPUT_BYTES = 8  # token ids and labels: int64, held by the caller through the step


@dataclass(frozen=True)
class Optimizer:
    """One entry of optimizers.toml."""

    name: str
    title: str
    source: str
    weights: str  # dtype of the weights ("model": the dtype the model runs in)
    gradients: str
    states: tuple[dict[str, Any], ...]
    temporaries: tuple[dict[str, Any], ...]
    groups: str | None = None  # a rule over dims, numel, last: parameters stepped group by group (torch's Adafactor)

    def dtype(self, name: str, act: str) -> str:
        return act if name == "model" else name


@cache
def optimizers() -> dict[str, Optimizer]:
    text = resources.files("symparam.memory").joinpath("conventions", "optimizers.toml").read_text(encoding="utf-8")
    return {name: Optimizer(name, t["title"], t["source"], t["weights"], t["gradients"], tuple(t.get("states", ())), tuple(t.get("temporaries", ())),
                            t.get("groups")) for name, t in tomllib.loads(text).items()}


def optimizer(name: str) -> Optimizer:
    if name not in optimizers():
        raise SymparamError(f"--optimizer: unknown {name!r}; known: {', '.join(optimizers())}")
    return optimizers()[name]


@dataclass(frozen=True)
class Tensor:
    """A parameter tensor as PyTorch holds it: its path, shape (routed experts stacked in one tensor), how many such
    tensors the model has (its layers), and whether it trains."""

    path: str
    shape: tuple[sp.Expr, ...]
    count: sp.Expr
    trainable: bool = True
    fp32: bool = False  # kept in float32 whatever the model runs in (LoRA adapters, _keep_in_fp32_modules)

    @property
    def numel(self) -> sp.Expr:
        return sp.Mul(*self.shape)


def parameter_tensors(term: Term, trainable: Callable[[str], bool] | None = None, count: sp.Expr = ONE, path: str = "",
                      stack: sp.Expr = ONE) -> list[Tensor]:
    """Every parameter tensor of a tree, tied copies and buffers left out; a routed group's copies are one stacked tensor;
    a frozen one (requires_grad False: BLT's patcher, AFMoE's expert bias) does not train."""
    path = f"{path}.{term.key}" if path and term.key else path or term.key
    if term.is_leaf:
        if not term.counted:
            return []
        shape = term.shape if stack == ONE else (stack,) + term.shape
        return [Tensor(path, tuple(shape), count, (trainable(path) if trainable else True) and not term.frozen, term.dtype == "F32")]
    routed = term.active_times != term.times
    inner_count, inner_stack = (count, stack * term.times) if routed else (count * term.times, stack)
    return [t for child in term.children for t in parameter_tensors(child, trainable, inner_count, path, inner_stack)]


def facts(tensor: Tensor, values: Mapping[str, Any]) -> dict[str, int]:
    """What a convention's rules read of a parameter tensor, at the model's values."""
    return {"numel": evaluate(tensor.numel, values), "dims": len(tensor.shape), "last": evaluate(tensor.shape[-1], values)}


def entry_bytes(entries: tuple[dict[str, Any], ...], tensor: Tensor, act: str, values: Mapping[str, Any]) -> sp.Expr:
    """Bytes one parameter tensor adds by a list of state (or temporary) entries; `when` decided at the model's values."""
    shape = tensor.shape
    names = {"numel": tensor.numel, "last": shape[-1], "second": shape[-2] if len(shape) > 1 else ONE}
    at = facts(tensor, values)
    total = sp.Integer(0)
    for e in entries:
        if e.get("shared") or ("when" in e and not compile_rule(e["when"], f"optimizers.toml {e['name']}.when")(at.get)):
            continue
        total += parse(str(e["size"]), names) * BYTES[act if e["dtype"] == "model" else e["dtype"]]
    return total


def step_bytes(opt: Optimizer, tensors: list[Tensor], dtype_of: Callable[[Tensor], str], values: Mapping[str, Any]) -> sp.Expr:
    """What optimizer.step() allocates at its most: one list over every parameter, or, where the convention steps them
    in `groups` (dtype groups in the order torch 2.13's C++ grouping gives, the last dtype to appear first; within a
    dtype, the rule's two kinds in the order they first appear), the most of any group's temporaries plus the `kept`
    ones of the group before it (foreach Adafactor's updates live on until the next group's replace them)."""
    def total(group: list[Tensor], entries: tuple[dict[str, Any], ...]) -> sp.Expr:
        return sp.Add(*(x.count * entry_bytes(entries, x, dtype_of(x), values) for x in group))

    if opt.groups is None:
        return total(tensors, opt.temporaries)
    rule = compile_rule(opt.groups, f"optimizers.toml {opt.name}.groups")
    by_dtype: dict[str, dict[bool, list[Tensor]]] = {}
    for x in tensors:
        by_dtype.setdefault(dtype_of(x), {}).setdefault(bool(rule(facts(x, values).get)), []).append(x)
    groups = [group for kinds in reversed(by_dtype.values()) for group in kinds.values()]
    kept = tuple(e for e in opt.temporaries if e.get("kept"))
    peaks = [total(g, opt.temporaries) + (total(groups[j - 1], kept) if j else 0) for j, g in enumerate(groups)]
    return sp.Max(*(sp.expand(p) for p in peaks)) if peaks else sp.Integer(0)


def shared_bytes(entries: tuple[dict[str, Any], ...], tensors: list[Tensor], values: Mapping[str, Any]) -> sp.Expr:
    """Bytes of the entries the optimizer keeps once for all parameters (bitsandbytes' quantization maps), where some
    parameter tensor meets their `when`."""
    def needed(e: dict[str, Any]) -> bool:
        rule = compile_rule(e["when"], f"optimizers.toml {e['name']}.when") if "when" in e else None
        return rule is None or any(rule({"numel": evaluate(x.numel, values), "dims": len(x.shape), "last": evaluate(x.shape[-1], values)}.get) for x in tensors)

    return sp.Add(*(parse(str(e["size"])) * BYTES[e["dtype"]] for e in entries if e.get("shared") and needed(e)))


@dataclass(frozen=True)
class Step:
    """A training step's terms and the live bytes at the moments that can be its peak, as formulas."""

    optimizer: Optimizer
    act: str
    weights: sp.Expr
    gradients: sp.Expr
    states: sp.Expr
    temporaries: sp.Expr
    activations: Activations
    loss_peak: sp.Expr  # the loss head's backward: what it adds for a moment (fp32 B*S*V gradients)
    moments: tuple[tuple[str, sp.Expr, str], ...]  # (name, live bytes, what is live)
    assumed: tuple[sp.Basic, ...]

    def peak(self, values: Mapping[Any, int]) -> tuple[str, int, sp.Expr]:
        """The moment with the most live bytes at these values: its name, bytes and formula."""
        figures = [(name, evaluate(expr, values), expr) for name, expr, _ in self.moments]
        return max(figures, key=lambda f: f[1])


def terms(model: Any, opt: Optimizer, act: str, trainable: Callable[[str], bool] | None = None) -> tuple[sp.Expr, ...]:
    """Bytes of the weights, the gradients, the optimizer states and the step's temporaries, as formulas."""
    tensors = parameter_tensors(model.tree, trainable)
    values = model.values

    def own(x: Tensor) -> str:  # "model" in a convention: the dtype the tensor runs in
        return "fp32" if x.fp32 else act

    trained = [x for x in tensors if x.trainable]
    weights = sp.Add(*(x.count * x.numel * BYTES[own(x) if opt.weights == "model" or x.fp32 else opt.weights] for x in tensors))
    gradients = sp.Add(*(x.count * x.numel * BYTES[opt.dtype(opt.gradients, own(x))] for x in trained))
    states = sp.Add(*(x.count * entry_bytes(opt.states, x, own(x), values) for x in trained)) + shared_bytes(opt.states, trained, values)
    temporaries = step_bytes(opt, trained, own, values)
    return tuple(sp.expand(e) for e in (weights, gradients, states, temporaries))


def training(model: Any, opt: Optimizer, mode: Mode = Mode(), checkpointing: str = "none",
             context: Mapping[sp.Symbol, int] | None = None, weights: sp.Expr | None = None) -> Step:
    """Every term of a training step and its peak, for a model with values; `context` gives S and B for branches;
    `weights` the bytes of weights held in a quantized format (QLoRA's NF4 base), where not the parameters' own."""
    if model.values is None:
        raise SymparamError(f"{model.name}: a training step needs a config's values")
    act = opt.dtype(opt.weights, mode.act)
    use_cache = False if checkpointing != "none" else mode.use_cache  # a checkpointed layer runs without a cache
    mode = Mode(act=act, attention=mode.attention, trainable=mode.trainable, use_cache=use_cache, checkpointing=checkpointing != "none")
    t = checked_trace(model, mode, context)
    act_kept = Activations(parts(kept(t, checkpointing)), mode, checkpointing, tuple(t.assumed), tuple(t.kernels.items()))
    model = without_gradients(model, t.untrained)
    own, gradients, states, temporaries = terms(model, opt, act, mode.trainable)
    return _moments(model, t, opt, act, own if weights is None else weights, gradients, states, temporaries, act_kept)


def without_gradients(model: Any, untrained: frozenset[int]) -> Any:
    """The model with the leaves no gradient reaches (trace.untrained) marked frozen: no gradient, no optimizer state."""
    if not untrained:
        return model
    local = copy.copy(model)
    local.__dict__["tree"] = frozen(model.tree, untrained)  # the cached tree, marked
    return local


def lingering_bytes(t: Trace, checkpointing: str) -> sp.Expr:
    """What the graphs of the tensors the caller holds keep that backward from the loss never runs, so never frees:
    a cache state's own update, saved by its last chunk's operations (outside checkpointed layers, which recompute);
    of a tensor a loop carries, saved after it, its last iteration's."""
    inside = {i for call in t.layers for i in call.saves} if checkpointing != "none" else set()
    held = {s.ident for s in t.held_once}
    storages = once([k for i in sorted(t.lingering - inside) for k in t.saved[i][0].allocated() if not k.param and k.ident not in held])
    return sp.Add(*(s.copies * s.bytes - sp.Add(*(e.copies * e.bytes for e in s.earlier)) for s in storages))


def _moments(model: Any, t: Trace, opt: Optimizer, act: str, weights: sp.Expr, gradients: sp.Expr, states: sp.Expr,
             temporaries: sp.Expr, activations: Activations) -> Step:
    """The live bytes at the moments a step can peak: the loss head's backward (every activation still kept, the
    loss's fp32 gradients), the end of backward (every gradient, the embedding's last one forming), the optimizer
    step (every gradient, the step's temporaries)."""
    inputs = 2 * B * S * INPUT_BYTES
    base = weights + states + inputs
    kept_storages = kept(t, activations.checkpointing)
    kept_ids = {s.ident for s in kept_storages}
    held = [s for s in t.held_once if s.ident not in kept_ids]
    held_bytes = sp.Add(*(s.copies * s.bytes for s in held))
    after_backward = sp.Add(*(s.copies * s.bytes for s in t.held_once)) + lingering_bytes(t, activations.checkpointing)
    saved_inputs = sp.Add(*(s.copies * s.bytes for s in kept_storages if s.op in ("token ids", "labels")))
    loss_saves = sp.Add(*(s.copies * s.bytes for s in t.loss_saves if s.ident in kept_ids))
    gradient_of = t.loss_gradients  # the gradients of the loss head's last two allocating operations' inputs
    loss_peak = sp.Add(*gradient_of) + 4  # + the loss's own gradient, a 0-dim fp32 tensor
    closures = {s.ident: s for call in t.layers for s in call.arguments if s.ident not in kept_ids} if activations.checkpointing != "none" else {}
    arguments = sp.Add(*(s.copies * s.bytes for s in closures.values()))  # alive in the recompute closures, not saved
    loss = base + (activations.formula - saved_inputs - loss_saves) + held_bytes + arguments + loss_peak
    end = base + after_backward + gradients + embedding_gradient(t, model, gradients) + 4  # backward() holds the loss's gradient to its end
    step = base + after_backward + gradients + temporaries
    moments = (
        ("loss backward", sp.expand(loss), "weights, optimizer states, the batch, every kept activation but the loss's own, the outputs the caller holds, and the loss head's fp32 gradients"),
        ("end of backward", sp.expand(end), "weights, optimizer states, the batch, the outputs the caller holds (with what their graphs keep that backward does not run), every gradient, and the embedding's gradient forming"),
        ("optimizer step", sp.expand(step), "weights, optimizer states, the batch, the outputs the caller holds (with what their graphs keep that backward does not run), every gradient, and the step's temporaries"),
    )
    return Step(opt, act, weights, gradients, states, temporaries, activations, sp.expand(loss_peak), moments, activations.assumed)


def embedding_gradient(t: Trace, model: Any, gradients: sp.Expr) -> sp.Expr:
    """What the last backward operation, the token embedding's, holds besides the gradients: the gradient of its output
    it reads; for a head tied to the embedding, the embedding's new gradient and their sum (the head's is counted)."""
    embedding = next((op for op in t.ops if op.name == "embedding"), None)
    if embedding is None or gradients == 0:
        return sp.Integer(0)
    weight = embedding.inputs[1]
    out = embedding.outputs[0]
    if not weight.grad:
        return sp.Integer(0)
    tied = any(leaf.tied for leaf, *_ in leaves(model.tree))
    return 2 * weight.numel * BYTES[out.dtype] if tied else out.storage.copies * out.numel * BYTES[out.dtype]


__all__ = ["Optimizer", "optimizers", "optimizer", "Tensor", "parameter_tensors", "entry_bytes", "step_bytes", "without_gradients", "Step", "terms", "training"]
