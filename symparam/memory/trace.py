"""One training forward pass as data: the recipe's forward programs interpreted over symbolic shapes.

Every block of a model's tree may carry a `forward` program (symparam.programs): the interpreter runs the root's with
the batch's token ids and labels, calling child modules, the recipe's [functions] and the operations of
symparam.memory.ops. The decoder-layer stack runs once per layer kind, each operation counted for the layers of its
kind. The result lists every operation's output in order (the shape walk) and every storage autograd saves for
backward (the activation memory), attributed to the module whose code allocated it.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import sympy as sp

from symparam.components import ONE, Term, walk
from symparam.config import as_subs
from symparam.errors import SymparamError
from symparam.memory import ops
from symparam.memory.ops import Context, Op, Step, Storage, Value
from symparam.programs import Program, compile_program
from symparam.symbols import B, S, make

INPUTS = "(inputs)"  # the batch: token ids and labels


@dataclass(frozen=True)
class Mode:
    """How the forward runs: the dtype of weights and activations, the attention backend, which parameters train."""

    act: str = "bf16"  # "bf16" or "fp32": the model cast to it, as `model.to(dtype)`
    attention: str = "sdpa"  # transformers' attn_implementation: "sdpa" or "eager"
    trainable: Callable[[str], bool] | None = None  # parameter path -> needs a gradient (default: every parameter)
    use_cache: bool | None = None  # build a KV cache during the forward (None: as the config says)
    checkpointing: bool = False  # gradient_checkpointing_enable is on (programs read it: it also hooks every sub-model's
    # input embeddings to require a gradient, transformers' enable_input_require_grads)


@dataclass
class Trace:
    """What one forward pass did: its operations in order and the storages autograd saved, with who saved them."""

    steps: list[Step]
    saved: list[tuple[Storage, str]]
    layers: list[LayerCall] = field(default_factory=list)  # each run of a decoder-layer stack (checkpointing reads it)
    assumed: list[sp.Basic] = field(default_factory=list)  # conditions on sizes the branches took (S > W, h > h_kv)
    kernels: dict[str, str] = field(default_factory=dict)  # module -> the GPU kernel its CPU reference path stands in for
    ops: list[Op] = field(default_factory=list)  # every operation, its inputs and outputs
    held: list[Storage] = field(default_factory=list)  # what the caller holds after the forward: logits, the KV cache

    uncheckpointed: dict[str, str] = field(default_factory=dict)  # layer stack -> why transformers cannot checkpoint it
    untrained: frozenset[int] = frozenset()  # the tree's trainable leaves (by identity) that get no gradient
    dropped: frozenset[int] = frozenset()  # saves (indices into saved) of a branch the forward drops: freed with it
    lingering: frozenset[int] = frozenset()  # saves only what the caller holds reaches: backward never frees them

    @property
    def held_once(self) -> list[Storage]:
        """What the caller holds, each storage once (a tensor it holds twice is held once)."""
        return list({s.ident: s for s in self.held}.values())

    @property
    def loss_saves(self) -> list[Storage]:
        """What the last operation (the loss) saved: freed when its backward runs, first."""
        return [self.saved[i][0] for i in self.ops[-1].saves] if self.ops else []

    @property
    def loss_gradients(self) -> list[sp.Expr]:
        """Bytes of the gradients the backward of the last two allocating operations (the loss and the log-softmax before
        it) makes for their inputs: both live at once, with the log-softmax's saved result."""
        last = [op for op in self.ops if op.allocates][-2:]
        return [v.storage.copies * v.numel * ops.BYTES[v.dtype] for op in last for v in op.inputs[:1] if v.grad]


@dataclass(frozen=True)
class LayerCall:
    """A decoder-layer stack's run: its path, its layers, the storages standing for every layer's input (one, or the
    first layer's and the others' where the layer's output has another dtype than its input; then any tensor it gets
    positionally, which non-reentrant checkpointing saves as it saves the input), and which of the trace's saves
    happened inside it."""

    path: str
    layers: sp.Expr
    inputs: tuple[Storage, ...]
    saves: range
    arguments: tuple[Storage, ...] = ()  # tensors every layer receives as keyword arguments (rotary tables, masks, positions)


@dataclass(frozen=True)
class Module:
    """A child module as a forward program sees it: its term, path, and the layers it exists in."""

    term: Term
    path: str
    copies: sp.Expr
    layer_path: str | None = None  # its path inside the layer stack, where it is in one
    single: bool = False  # a stack's `layers[i]`: one layer per call, the caller looping over them with code between


@dataclass(frozen=True)
class Variants:
    """A layer slot whose module differs by layer kind: (layers, module) for each kind."""

    path: str
    modules: tuple[Module, ...]


class Return(Exception):
    def __init__(self, value: Any):
        self.value = value


_BINARY = {ast.Add: "add", ast.Sub: "sub", ast.Mult: "mul", ast.Div: "div"}
_ARITH = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
          ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt,
            ast.GtE: operator.ge, ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b,
            ast.Is: lambda a, b: a is b, ast.IsNot: lambda a, b: a is not b}


class Interpreter:
    """Runs a model's forward programs over symbolic shapes for one Mode."""

    def __init__(self, model: Any, mode: Mode, context: Mapping[sp.Symbol, int] | None = None):
        self.model = model
        self.mode = mode
        known = as_subs(model.values) if model.values is not None else {}
        self.values = {**known, **{k: sp.Integer(v) for k, v in (context or {}).items()}}
        self.assumed: list[sp.Basic] = []  # conditions on sizes a branch took: where the figure's formula holds
        self.config = dict(getattr(model, "config", {}) or {})
        self.ctx = Context("", ONE, [], [], mode.act, values=self.values, assumed=self.assumed)
        self.layers: list[LayerCall] = []
        self.kernels: dict[str, str] = {}
        self.leaves = {path: node for node, _, _, path in walk(model.tree) if node.is_leaf}  # parameters by path
        self.uncheckpointed: dict[str, str] = {}
        self.slots: dict[str, tuple[Module, ...]] = {}  # inside a stack: slot path -> its variants
        self.kinds: dict[str, Module] = {}  # inside a stack: module path in the layer -> its module
        self.share: Callable[[sp.Expr], sp.Expr] | None = None  # a run of part of a stack: a layer count -> its layers in the run
        self.layer_values: Any = None  # the config's values, for which layers a layer-count symbol selects
        self.stands: dict[int, list[Storage]] = {}  # a storage standing for others (a layer's state arguments): those
        self.leaf_of: dict[int, Term] = {}  # a parameter's storage -> the tree's leaf it reads
        self.calls: list[range] = []  # each module call's operations (indices into ctx.ops)

    # ------------------------------------------------------------ entry

    def run(self) -> Trace:
        root = self.model.tree
        ids = self.input("token ids")
        labels = self.input("labels")
        loss = self.call_module(Module(root, root.key, ONE), [ids, labels], {})
        if isinstance(loss, Value):
            self.ctx.held.append(loss.storage)
        reach = Reach(self.ctx.ops, self.ctx.held, self.stands, self.calls)  # what the caller holds keeps its graphs
        to_loss = Reach(self.ctx.ops, [], self.stands, self.calls)  # what backward runs, freeing what it saved
        dropped = reach.dropped()
        lingering = frozenset(j for i, op in enumerate(self.ctx.ops) if reach.keeps(i, op) and not to_loss.keeps(i, op) for j in op.saves)
        # a layer stack nothing reaches goes with its checkpoints (BLT's patcher)
        layers = [call for call in self.layers if any(s.ident in reach.needed for s in call.inputs) or set(call.saves) - dropped]
        kept = {k.ident for i, (s, _) in enumerate(self.ctx.saved) if i not in dropped for k in s.allocated()}
        steps = [replace(s, saved=s.storage is not None and s.storage.ident in kept) for s in self.ctx.steps]
        return Trace(steps, self.ctx.saved, layers, list(dict.fromkeys(self.assumed)), self.kernels, self.ctx.ops, self.ctx.held,
                     self.uncheckpointed, to_loss.untrained(self.model.tree, self.trainable_leaves(), self.leaf_of), dropped, lingering)

    def trainable_leaves(self) -> dict[int, Term]:
        """The tree's parameter leaves the mode trains, by identity (frozen ones, buffers and tied copies left out)."""
        return {id(leaf): leaf for leaf, _, _, path in walk(self.model.tree)
                if leaf.is_leaf and leaf.counted and not leaf.frozen and (self.mode.trainable is None or self.mode.trainable(path))}

    def input(self, what: str) -> Value:
        storage = Storage(B * S, "int64", INPUTS, what)
        value = Value((B, S), ops.dense((B, S)), "int64", storage, False)
        self.ctx.steps.append(Step(INPUTS, what, value.shape, value.dtype, ONE, storage=storage))
        return value

    # ------------------------------------------------------------ modules

    def call_module(self, module: Module, args: list[Any], kwargs: dict[str, Any]) -> Any:
        term = module.term
        if term.code is None:
            raise SymparamError(f"{module.path or 'the model'}: its block has no forward program; activation memory needs one ([blocks.X] forward = ...)")
        program = compile_program(term.code.text, term.code.where)
        if term.code.kernel:
            self.kernels[module.path] = term.code.kernel
        if term.code.stack:
            if term.code.no_checkpointing:
                self.uncheckpointed[module.path] = term.code.no_checkpointing
            return self.call_stack(module, program, args, kwargs)
        env = dict(term.code.env)
        outer = (self.ctx.module, self.ctx.copies)
        self.ctx.module, self.ctx.copies = module.path, module.copies
        try:
            children = self.children(module)  # a parametrized parameter is computed here, in the module's own code
        finally:
            self.ctx.module, self.ctx.copies = outer
        start = len(self.ctx.ops)
        out = self.execute(program, module.path, module.copies, args, kwargs, env, children, module.layer_path, term.code.entries)
        self.calls.append(range(start, len(self.ctx.ops)))
        return out

    def children(self, module: Module) -> dict[str, Any]:
        """A module's children by key: its parameters as Values, its sub-modules as Modules."""
        out: dict[str, Any] = {}
        routed = module.term.active_times != module.term.times
        for child in module.term.children:
            path = f"{module.path}.{child.key}" if module.path else child.key
            if child.is_leaf:
                value = self.parameter(child, path, module.term.times if routed else ONE)
                out[child.key] = together(out.get(child.key), self.parametrized(child, value, module) if child.lora else value)
            elif not child.key and all(leaf.is_leaf for leaf in child.children):  # tensors grouped without a key (RG-LRU's gates): the module's, stacked
                out.update({leaf.key: self.parameter(leaf, f"{path}{leaf.key}", child.times) for leaf in child.children})
            else:
                layer_path = None if module.layer_path is None else (f"{module.layer_path}.{child.key}" if module.layer_path else child.key)
                out[child.key] = together(out.get(child.key), Module(child, path, module.copies, layer_path))
        return out

    def parameter(self, leaf: Term, path: str, stacked: sp.Expr) -> Value:
        """A parameter (or buffer) as a Value: never an activation; it needs a gradient unless frozen or a buffer."""
        shape = leaf.shape if stacked == ONE else (stacked,) + leaf.shape
        trainable = self.mode.trainable(path) if self.mode.trainable else True
        dtype = runtime_dtype(leaf, self.mode.act)
        storage = Storage(sp.Mul(*shape), dtype, path, "parameter", param=True)
        self.leaf_of[storage.ident] = leaf
        return Value(tuple(shape), ops.dense(shape), dtype, storage, trainable and not leaf.buffer and not leaf.frozen)

    def parametrized(self, leaf: Term, value: Value, module: Module) -> Value:
        """A parameter peft's ParamWrapper adapts: its value plus its adapters' product, computed by the library's
        `lora_param` when the module first reads it (nn.utils.parametrize, cached for the forward)."""
        scaling, experts, a_path, b_path = leaf.lora
        a, b = (self.parameter(self.leaves[p], p, ONE) for p in (a_path, b_path))
        program = compile_program(self.model.recipe.functions["lora_param"], f"{self.model.recipe.source}: [functions] lora_param")
        return self.execute(program, module.path, module.copies, [value, a, b, experts, scaling], {}, {}, {}, None)

    def call_stack(self, module: Module, program: Program, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """The decoder layers: the layer program once per run, each module counted in the layers that have it; the
        layer's input stands for the embedding output (layer 0) and every other layer's output. Where the input needs
        no gradient but the layers train something (LoRA on a frozen embedding), layer 0 runs apart: what it saves
        differs from the layers after it, whose input does need one; so too where the layer block says its layer 0
        runs otherwise (`first_layer`: a slot that only later layers have, read as absent in layer 0's run)."""
        term = module.term
        groups = [term] if term.times != ONE else list(term.children)  # one kind is the stack itself
        x = args[0]
        if module.single:  # `layers[i]` in a loop over the layers with code between them (BLT's decoder cross-attends
            # before each layer): each call runs one layer, on an input the caller made anew for it (so owned by its maker)
            if len(groups) > 1:
                raise SymparamError(f"{term.code.where}: one layer at a time of a stack of several layer kinds is not described")
            return self.run_layers(module, program, [(term, ONE)], ONE, x, x.storage, args, kwargs, whole=False)
        total = term.code.layers if term.code.layers is not None else sp.Add(*(g.times for g in groups))
        if (x.grad or self.mode.trainable is None) and not term.code.first_layer:
            return self.run_layers(module, program, [(g, g.times) for g in groups], total, x, x.storage, args, kwargs)
        first = [(g, self.first_layer(g.times)) for g in groups]
        at_zero = self.first_layer(total)
        self.share = self.first_layer
        try:
            out = self.run_layers(module, program, first, at_zero, x, x.storage, args, kwargs, whole=False)
        finally:
            self.share = None
        if isinstance(out, tuple):
            raise SymparamError(f"{term.code.where}: layers returning several tensors behind a frozen input are not described")
        rest = [(g, sp.expand(g.times - n)) for g, n in first]
        if all(n == 0 or (self.values and sp.sympify(n).xreplace(self.values) == 0) for _, n in rest):
            return out
        prior = Storage(x.storage.numel, x.dtype, module.path, "layer output")
        self.stands[prior.ident] = [out.storage]  # layer 0's output, which layer 1 reads
        follow = Value(x.shape, ops.dense(x.shape), x.dtype, prior, out.grad)
        self.share = lambda n: sp.expand(n - self.first_layer(n))
        try:
            return self.run_layers(module, program, rest, sp.expand(total - at_zero), follow, prior, [follow, *args[1:]], kwargs, whole=False)
        finally:
            self.share = None

    def first_layer(self, count: sp.Expr) -> sp.Expr:
        """1 if layer 0 is among the layers a count stands for (N, N_dense, N - N_linear, ...), else 0."""
        return self.at_layer(count, 0)

    def at_layer(self, count: sp.Expr, i: int) -> sp.Expr:
        """1 if layer i is among the layers a count stands for, else 0."""
        from symparam.config import Values

        if self.layer_values is None:
            self.layer_values = Values(self.model.recipe, self.model.config, {})
        at = {make(name): sp.Integer(int(self.layer_values.mask(name)[i])) for name in self.model.recipe.layer_symbols if make(name) in sp.sympify(count).free_symbols}
        return sp.sympify(count).xreplace({**at, make("N"): ONE})

    def input_owners(self, copies: sp.Expr, source: Storage, kinds: list[Storage]) -> tuple[tuple[str, sp.Expr], ...]:
        """Who made the inputs of the layers a count stands for, where the layer kinds' outputs come from different
        modules (Zamba's hybrid layers end in their Mamba layer): layer 0's is the source, every other layer's the
        output of the layer before it, made by that layer's kind (counted at the config; the last module takes the rest)."""
        first = self.first_layer(copies)
        counts: dict[str, int] = {}
        for i in range(1, int(self.layer_values.get("N"))):
            if self.at_layer(copies, i) == 1:
                before = next(k.module for k in kinds if self.at_layer(k.copies, i - 1) == 1)
                counts[before] = counts.get(before, 0) + 1
        named = list(counts)[:-1]
        owners = [(source.module, first), *((m, sp.Integer(counts[m])) for m in named)]
        if counts:
            owners.append((list(counts)[-1], sp.expand(copies - first - sum(counts[m] for m in named))))
        return tuple((m, n) for m, n in owners if n != 0)

    def kind_inputs(self, saved: Storage, inputs: Storage, source: Storage, maker: str, kinds: list[Storage], whole: bool) -> Storage:
        """The layer input as a save made it: in every layer, or in the layers of one kind only (partial), which stand
        for the embedding output where layer 0 is of that kind and for the outputs of the layers before them in the rest."""
        if not saved.partial:
            return inputs
        if whole and len({k.module for k in kinds}) > 1:
            owners = self.input_owners(saved.copies, source, kinds)
        else:
            first = self.first_layer(saved.copies) if whole else saved.copies
            owners = tuple((m, n) for m, n in ((source.module, first), (maker, sp.expand(saved.copies - first))) if n != 0)
        return replace(inputs, copies=saved.copies, partial=True, owners=owners)

    def run_layers(self, module: Module, program: Program, groups: list[tuple[Term, sp.Expr]], layers: sp.Expr, x: Value, source: Storage,
                   args: list[Any], kwargs: dict[str, Any], whole: bool = True) -> Value:
        """One run of the layer program over `layers` layers, each kind group with its copies."""
        term = module.term
        runs = module.copies  # the stack's runs in one forward (1; more where a program calls it in a loop)
        groups = [(g, n) for g, n in groups if n != 0]
        found = {(g.times, child.key): Module(child, f"{module.path}.{child.key}" if child.key else module.path, runs * n, child.key)  # key "": a whole layer class
                 for g, n in groups for child in g.children}
        slots = {slot: tuple(found[n, key] for n, key in variants if (n, key) in found) for slot, variants in term.code.slots}
        members = {key: m for (_, key), m in found.items()}
        for g, n in groups:  # children sharing a key (an nn.Sequential's layers, indices left out): a tuple in module order
            keys = [c.key for c in g.children]
            for key in {k for k in keys if keys.count(k) > 1}:
                members[key] = tuple(Module(c, f"{module.path}.{key}", runs * n, key) for c in g.children if c.key == key)
        owners = ((source.module, runs), (module.path, runs * (layers - 1))) if whole else ((source.module, runs * layers),)
        inputs = Storage(x.storage.numel, x.dtype, module.path, "layer input", runs * layers, owners=owners, covers=(source,))
        inner = Value(x.shape, ops.dense(x.shape), x.dtype, inputs, x.grad)
        outer_slots, outer_kinds = self.slots, self.kinds
        self.slots, self.kinds = slots, members
        start = len(self.ctx.saved)
        used = kwargs if program.kwargs else {k: v for k, v in kwargs.items() if k in program.params}  # a layer ignores what it does not read
        states = {j: Storage(a.storage.numel, a.dtype, module.path, "layer state", runs * (layers - 1)) for j, a in enumerate(args[1:]) if isinstance(a, Value)}
        given = [replace(a, storage=states[j]) if j in states else a for j, a in enumerate(args[1:])]  # a state from the layer before, if it returns one
        try:
            out = self.execute(program, module.path, runs * layers, [inner, *given], used, dict(term.code.env), {}, "", term.code.entries)
        finally:
            self.slots, self.kinds = outer_slots, outer_kinds
        returned = [v.storage for v in tree_values(out)]  # the next layer reads it through its input, the stack's caller
        self.stands.setdefault(inputs.ident, []).extend(returned)  # through the last layer's output
        out, carried = (out[0], out[1:]) if isinstance(out, tuple) else (out, ())
        for j, state in states.items():  # a layer returning (x, state, ...) hands each later result to the next layer's argument in
            c = carried[j] if j < len(carried) else None  # its place (ZAYA's router state, Reformer's second half): what layers
            self.stands[state.ident] = [args[1 + j].storage, *([c.storage] if isinstance(c, Value) else [])]
            states[j] = replace(state, module=c.storage.module) if isinstance(c, Value) else args[1 + j].storage  # after the first take; else the same tensor every layer
            self.ctx.saved[:] = [(states[j] if s.ident == state.ident else s, m) for s, m in self.ctx.saved]
        if not isinstance(out, Value):
            raise SymparamError(f"{term.code.where}: a decoder layer returns a tensor (and the tensors it hands on)")
        if out.storage.ident == inputs.ident:  # every layer passes its input through
            return (x, *carried) if carried else x
        maker = out.storage.module  # what makes a layer's output, and so the next layer's input: its residual add, or a post-norm
        ran = [k for k in out.storage.kinds if k.ident != inputs.ident]
        if len(ran) < len(out.storage.kinds):  # layers of a kind pass their input through (Mllama's cross-attention layers
            ran_n = sp.Add(*(k.copies for k in ran))  # without an image): each layer that runs takes the last one's output
            inputs = replace(inputs, copies=ran_n, owners=((source.module, runs), (module.path, ran_n - runs)) if whole else ((source.module, ran_n),))
            self.ctx.saved[:] = [(inputs if s.ident == inputs.ident else s, m) for s, m in self.ctx.saved]
            maker = ran[0].module if len(ran) == 1 else maker
        if maker != module.path:
            inputs = replace(inputs, owners=tuple((maker if m == module.path else m, n) for m, n in inputs.owners))
        kinds = [k for k in out.storage.allocated() if k.ident != inputs.ident]
        if whole and len({k.module for k in kinds}) > 1:  # each layer's input is the output of the layer before it
            inputs = replace(inputs, owners=self.input_owners(inputs.copies, source, kinds))
        def relabel(s: Storage) -> Storage:  # the layer input wherever a save holds it, inside tensors merged from kinds too
            if s.ident == inputs.ident:
                return self.kind_inputs(s, inputs, source, maker, kinds, whole)
            return replace(s, kinds=tuple(relabel(k) for k in s.kinds)) if s.kinds else s

        self.ctx.saved[:] = [(relabel(s), m) for s, m in self.ctx.saved]
        kept = (inputs,)
        if out.dtype != x.dtype and whole:  # layers after the first receive the output's dtype (Mamba's fp32 residual)
            kept = (x.storage, Storage(x.storage.numel, out.dtype, maker, "layer input", runs * (layers - 1)))
        kept += tuple(states[j] if j in states else a.storage for j, a in enumerate(args[1:]) if isinstance(a, Value))  # tensors given positionally:
        # checkpointing saves them too (not those inside a tuple, such as a layer's rotary tables: torch saves only tensor arguments)
        arguments = tuple(v.storage for v in tree_values(kwargs))
        self.layers.append(LayerCall(module.path, runs * layers, kept, range(start, len(self.ctx.saved)), arguments))
        last = Storage(out.storage.numel, out.dtype, maker, "last layer output", runs)
        self.stands[last.ident] = returned
        if carried:
            return (replace(out, storage=last), *(self.last_state(c, runs) if isinstance(c, Value) else c for c in carried))
        return replace(out, storage=last)

    def last_state(self, c: Value, runs: sp.Expr) -> Value:
        """A state the last layer hands on, as the stack returns it: it stands for what the layers return."""
        last = Storage(c.storage.numel, c.dtype, c.storage.module, "last layer state", runs)
        self.stands[last.ident] = [c.storage]
        return replace(c, storage=last)

    def call_variants(self, variants: Variants, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """A slot whose module differs by layer kind: each kind's module on the same inputs; the results merge."""
        results = []
        modules = [m for m in variants.modules if not (self.values and sp.sympify(m.copies).xreplace(self.values) == 0)]
        inside = self.ctx.kinds[-1][1] if self.ctx.kinds else None  # in `if kind(N_x):`, the variant of exactly those layers
        modules = [m for m in modules if inside is not None and ops.identical(m.copies, inside)] or modules
        for m in modules or variants.modules[:1]:
            self.ctx.kinds.append((self.ctx.copies, m.copies))
            try:
                results.append(self.call_module(m, args, kwargs))
            finally:
                self.ctx.kinds.pop()
        return self.merge(results, variants.path)

    def merge(self, results: list[Any], where: str, copies: tuple[sp.Expr, ...] | None = None) -> Any:
        """Results of layer kinds that differ inside: one tensor per layer whatever its kind (shapes must agree); with
        the kinds' `copies`, a result one kind passes through from before the split stands for those layers only."""
        first = results[0]
        if isinstance(first, tuple):
            return tuple(self.merge([r[i] for r in results], where, copies) for i in range(len(first)))
        if not isinstance(first, Value):
            if any(r != first for r in results):
                raise SymparamError(f"{where}: layer kinds return different values")
            return first
        if any(not isinstance(r, Value) or len(r.shape) != len(first.shape) or any(not ops.identical(a, b) for a, b in zip(r.shape, first.shape)) or r.dtype != first.dtype for r in results):
            raise SymparamError(f"{where}: layer kinds return tensors of different shapes")
        if len(results) == 1 or all(r.storage is first.storage for r in results):
            return first
        same = all(len(r.strides) == len(first.strides) and all(ops.identical(a, b) for a, b in zip(r.strides, first.strides)) for r in results)
        merged = self.ctx.new(first.shape, first.dtype, "layer kinds", any(r.grad for r in results), first.strides if same else None)  # a layout every kind shares
        outer = lambda r, n: n is not None and ops.identical(r.storage.copies, self.ctx.copies) and not ops.identical(n, self.ctx.copies)  # noqa: E731
        parts = tuple(replace(r.storage, copies=n, partial=True) if outer(r, n) else r.storage for r, n in zip(results, copies or (None,) * len(results)))
        return replace(merged, storage=replace(merged.storage, kinds=parts))

    # ------------------------------------------------------------ programs

    def execute(self, program: Program, path: str, copies: sp.Expr, args: list[Any], kwargs: dict[str, Any],
                env: dict[str, Any], children: dict[str, Any], layer_path: str | None, declared: tuple[str, ...] = (), loop: sp.Expr = ONE) -> Any:
        """Run one program in a module's frame: its allocations are that module's, repeated `copies` times (`loop` of
        them the iterations of loops it is called in, which the modules it calls run too)."""
        if len(args) > len(program.params):
            raise SymparamError(f"{program.where}: {program.name} takes {len(program.params)} argument(s), given {len(args)}")
        scope = dict(zip(program.params, args))
        for name, value in kwargs.items():
            if name in program.params:
                if name in scope:
                    raise SymparamError(f"{program.where}: {name} given twice")
                scope[name] = value
            elif not program.kwargs:
                raise SymparamError(f"{program.where}: {program.name} has no parameter {name!r}")
        frame = Frame(self, path, copies, env, children, layer_path, program, declared)
        frame.loop = loop
        for name in program.params:
            if name not in scope:
                if name not in program.defaults:
                    raise SymparamError(f"{program.where}: {program.name} needs {name!r}")
                scope[name] = frame.eval(program.defaults[name], scope)
        outer = (self.ctx.module, self.ctx.copies)
        self.ctx.module, self.ctx.copies = path, copies
        try:
            frame.block(program.body, scope)
            return None
        except Return as r:
            return r.value
        finally:
            self.ctx.module, self.ctx.copies = outer


class Frame:
    """One running program: its module, names and statements."""

    def __init__(self, it: Interpreter, path: str, copies: sp.Expr, env: dict[str, Any], children: dict[str, Any],
                 layer_path: str | None, program: Program, declared: tuple[str, ...] = ()):
        self.it, self.path, self.copies, self.env, self.children = it, path, copies, env, children
        self.layer_path, self.program = layer_path, program
        self.loop = ONE  # the iterations of the loops this code runs in: a module it calls runs once per iteration
        self.declared = set(declared)  # entries of the block the config does not build

    def fail(self, node: ast.AST, message: str) -> SymparamError:
        return SymparamError(f"{self.program.where}: line {getattr(node, 'lineno', '?')}: {message}")

    # ------------------------------------------------------------ statements

    def block(self, body: tuple[ast.stmt, ...] | list[ast.stmt], scope: dict[str, Any]) -> None:
        for stmt in body:
            self.statement(stmt, scope)

    def statement(self, stmt: ast.stmt, scope: dict[str, Any]) -> None:
        if isinstance(stmt, ast.Assign):
            value = self.eval(stmt.value, scope)
            for target in stmt.targets:
                self.bind(target, value, scope)
        elif isinstance(stmt, ast.Return):
            raise Return(None if stmt.value is None else self.eval(stmt.value, scope))
        elif isinstance(stmt, ast.If):
            self.branch(stmt, scope)
        elif isinstance(stmt, ast.For):
            self.repeat(stmt, scope)
        elif isinstance(stmt, ast.With):  # `with no_grad():` (programs.py allows no other context)
            outer, self.it.ctx.grad_enabled = self.it.ctx.grad_enabled, False
            try:
                self.block(stmt.body, scope)
            finally:
                self.it.ctx.grad_enabled = outer
        elif isinstance(stmt, ast.Expr):
            self.eval(stmt.value, scope)

    def bind(self, target: ast.expr, value: Any, scope: dict[str, Any]) -> None:
        if isinstance(target, ast.Name):
            scope[target.id] = value
            return
        items = list(value) if isinstance(value, (tuple, list)) else None
        if items is None or len(items) != len(target.elts):
            raise self.fail(target, f"cannot unpack into {len(target.elts)} names")
        for t, v in zip(target.elts, items):
            self.bind(t, v, scope)

    def branch(self, stmt: ast.If, scope: dict[str, Any]) -> None:
        """`if`: a condition known at trace time, or `if kind(N_x):` — the body runs in N_x of this module's layers and
        the else part in the rest; names both assign become one tensor per layer."""
        test = stmt.test
        if isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == "kind":
            self.partition(stmt, self.eval(test.args[0], scope), scope)
            return
        if self.truth(self.eval(test, scope), test):
            self.block(stmt.body, scope)
        else:
            self.block(stmt.orelse, scope)

    def partition(self, stmt: ast.If, part: sp.Expr, scope: dict[str, Any]) -> None:
        it = self.it
        zeros = it.model.zeros if hasattr(it.model, "zeros") else {}
        part = it.share(part) if it.share else part  # layer 0 run apart: the kind's layers in this run
        rest = sp.expand(self.copies - part)
        runs = [(part.xreplace(zeros), stmt.body), (rest.xreplace(zeros), stmt.orelse)]
        results, kinds = [], []
        for copies, body in runs:
            if copies == 0 or (it.values and sp.sympify(copies).xreplace(it.values) == 0):
                continue
            local = dict(scope)
            outer = (self.copies, it.ctx.copies)
            it.ctx.kinds.append((it.ctx.copies, copies))
            self.copies = it.ctx.copies = copies
            try:
                self.block(body, local)
            finally:
                self.copies, it.ctx.copies = outer
                it.ctx.kinds.pop()
            results.append(local)
            kinds.append(copies)
        if not results:  # the module is in no layer of this model
            return
        if len(results) == 1:
            scope.update(results[0])
            return
        for name in set(results[0]) | set(results[1]):
            values = [r[name] for r in results if name in r]
            scope[name] = values[0] if len(values) == 1 or values[0] is values[1] else it.merge(values, self.program.where, tuple(kinds))

    def repeat(self, stmt: ast.For, scope: dict[str, Any]) -> None:
        """`for i in range(n):` (or `range(start, stop)`) runs its body once, each allocation counted n times (the
        chunks of a chunked scan); a name the body reassigns leaves the loop as the last iteration's tensor (what it
        allocated). Where the body's sizes depend on i (a loop over queries, query i seeing i + 1 tokens), each
        allocation is its own size in each iteration: summed over them in closed form (`summed`), and the formula holds
        where the loop runs at least once. A count of no iterations at S and B (none, or fewer) runs nothing there."""
        it = self.it
        bounds = [sp.sympify(self.eval(a, scope)) for a in stmt.iter.args]
        start, stop = (sp.Integer(0), bounds[0]) if len(bounds) == 1 else bounds
        count = sp.expand(stop - start)
        at = count.xreplace(it.values) if it.values else count
        varies = bool(count.free_symbols & {S, B})  # a count in the batch's sizes: how many runs is part of the regime
        if count == 0 or (at.is_number and at <= 0):
            if varies and at.is_number:
                it.assumed.append(count <= 0)
            return
        outer = (self.copies, it.ctx.copies, self.loop)
        self.copies = it.ctx.copies = self.copies * count
        self.loop = self.loop * count
        var = scope[stmt.target.id] = sp.Symbol(stmt.target.id, integer=True, nonnegative=True)
        mark = next(ops._ids)  # storages the body allocates come after
        marks = (len(it.ctx.saved), len(it.ctx.steps), len(it.ctx.ops), len(it.ctx.held))
        entering = {name: v.storage for name, v in scope.items() if isinstance(v, Value)}
        try:
            self.block(stmt.body, scope)
        finally:
            self.copies, it.ctx.copies, self.loop = outer
        carried = {e.ident: scope[name].storage for name, e in entering.items()
                   if isinstance(scope.get(name), Value) and scope[name].storage.ident != e.ident}
        sizes = {s.ident: s.numel for s in self.allocated_since(mark, marks)}
        if any(var in sp.sympify(n).free_symbols for n in sizes.values()):
            if varies and at.is_number:
                it.assumed.append(count >= 1)
            totals = {k: summed(n, var, start, stop, it.values) for k, n in sizes.items()}
            once = lambda s: replace(s, numel=totals[s.ident], copies=sp.cancel(s.copies / count)) if s.ident in sizes else s  # noqa: E731
            self.rewrite(once, {var: stop - 1}, marks)
            for name, value in list(scope.items()):  # what leaves the loop: the last iteration's
                if isinstance(value, Value):
                    scope[name] = self.at_last(value, once, {var: stop - 1})
            carried = {e: once(s) for e, s in carried.items()}
            but_last = lambda s: replace(s, numel=summed(sizes[s.ident], var, start, stop - 1, it.values), ident=next(ops._ids))  # noqa: E731
        else:
            but_last = lambda s: replace(s, copies=sp.expand(s.copies * (count - 1) / count), ident=next(ops._ids))  # noqa: E731
        self.carry({e: (s, but_last(s)) for e, s in carried.items() if s.ident in sizes}, scope, marks)

    def carry(self, carried: dict[int, tuple[Storage, Storage]], scope: dict[str, Any], marks: tuple[int, int, int, int]) -> None:
        """A name the body reassigns: what the body reads of it is, from the second iteration on, what it made the
        iteration before (the body runs once here). Where the body saves it, it saves those too: every iteration's
        but the last, which the code after the loop keeps (then all of them are kept: they cover the others) or drops."""
        it, ctx = self.it, self.it.ctx
        for e, (made, earlier) in carried.items():
            it.stands.setdefault(e, []).append(made)
        covering = {made.ident: replace(made, covers=made.covers + (earlier,), earlier=(earlier,)) for made, earlier in carried.values()}
        cover = lambda s: covering.get(s.ident, s)  # noqa: E731
        self.rewrite(cover, {}, marks)
        for name, value in list(scope.items()):
            if isinstance(value, Value):
                scope[name] = replace(value, storage=cover(value.storage))
        ctx.saved[marks[0]:] = [(replace(s, kinds=(s, carried[s.ident][1])) if s.ident in carried and not s.kinds else s, m)
                                for s, m in ctx.saved[marks[0]:]]

    def allocated_since(self, mark: int, marks: tuple[int, int, int, int]) -> list[Storage]:
        """The storages the operations since `mark` allocated, as the trace records them."""
        ctx = self.it.ctx
        found = [s for s, _ in ctx.saved[marks[0]:]] + [s.storage for s in ctx.steps[marks[1]:] if s.storage is not None]
        found += [v.storage for op in ctx.ops[marks[2]:] for v in (*op.inputs, *op.outputs)] + ctx.held[marks[3]:]
        return [s for s in found if s.ident > mark and not s.param]

    def at_last(self, v: Value, once: Callable[[Storage], Storage], last: dict) -> Value:
        """A value of a summed loop as the trace keeps it: its summed storage, its shape at the last iteration."""
        return replace(v, shape=tuple(sp.sympify(n).xreplace(last) for n in v.shape), strides=tuple(sp.sympify(n).xreplace(last) for n in v.strides),
                       storage=once(v.storage))

    def rewrite(self, once: Callable[[Storage], Storage], last: dict, marks: tuple[int, int, int, int]) -> None:
        """What a summed loop recorded, with its summed storages and its shapes at the last iteration (the shape walk)."""
        ctx = self.it.ctx
        ctx.saved[marks[0]:] = [(once(s), m) for s, m in ctx.saved[marks[0]:]]
        ctx.held[marks[3]:] = [once(s) for s in ctx.held[marks[3]:]]
        ctx.steps[marks[1]:] = [replace(s, shape=tuple(sp.sympify(n).xreplace(last) for n in s.shape),
                                        storage=once(s.storage) if s.storage is not None else None) for s in ctx.steps[marks[1]:]]
        ctx.ops[marks[2]:] = [replace(op, inputs=tuple(self.at_last(v, once, last) for v in op.inputs),
                                      outputs=tuple(self.at_last(v, once, last) for v in op.outputs)) for op in ctx.ops[marks[2]:]]

    def truth(self, value: Any, node: ast.AST) -> bool:
        """A condition's truth; one on sizes is decided by the model's values (and S, B) and remembered as an assumption
        of the formula (it holds where the condition does)."""
        if isinstance(value, sp.Basic):
            decided = value.xreplace(self.it.values) if self.it.values else value
            if decided in (sp.true, sp.false) or decided.is_number:
                if value.free_symbols:
                    self.it.assumed.append(value if bool(decided) else sp.Not(value))
                return bool(decided)
            raise self.fail(node, f"the condition {value} depends on sizes with no value here (give the model's config, --seq and --batch)")
        return bool(value)

    # ------------------------------------------------------------ expressions

    def eval(self, node: ast.expr, scope: dict[str, Any]) -> Any:
        method = getattr(self, f"e_{type(node).__name__}", None)
        if method is None:
            raise self.fail(node, f"{type(node).__name__} is not supported")
        return method(node, scope)

    def e_Constant(self, node: ast.Constant, scope: dict[str, Any]) -> Any:
        return sp.Integer(node.value) if type(node.value) is int else node.value

    def e_Tuple(self, node: ast.Tuple, scope: dict[str, Any]) -> tuple:
        return tuple(self.eval(e, scope) for e in node.elts)

    e_List = e_Tuple

    def e_Name(self, node: ast.Name, scope: dict[str, Any]) -> Any:
        name = node.id
        if name in scope:
            return scope[name]
        if name in self.children:
            return self.children[name]
        if self.layer_path is not None:
            found = self.in_layer(name)
            if found is not None:
                return found
        if name in self.env:
            return self.env[name]
        it = self.it
        mode = {"attention": it.mode.attention, "training": True, "config": it.config, "checkpointing": it.mode.checkpointing,
                "use_cache": it.mode.use_cache if it.mode.use_cache is not None else bool(it.config.get("use_cache", False))}
        if name in mode:
            return mode[name]
        if name in it.model.flags:
            return it.model.flags[name]
        if name in it.model.recipe.symbols:
            return make(name).xreplace(it.model.zeros)
        if name in it.model.recipe.functions or name in OPERATIONS or name in ("kind", "absent"):
            return name
        if name in self.declared:
            return Absent(name)
        raise self.fail(node, f"unknown name {name!r}")

    def in_layer(self, name: str) -> Module | Variants | None:
        """A module of the layer stack by its path in the layer: a slot of variants, or a member."""
        key = f"{self.layer_path}.{name}" if self.layer_path else name
        if key in self.it.slots:
            found = self.it.slots[key]
            if not found:  # a run of part of the stack (layer 0 apart) none of whose layers have the slot: absent there
                return Absent(name)
            if found and all(m.term.is_leaf for m in found):  # a tensor some layers hold (ZAYA's router-state scale): its value
                inside = self.it.ctx.kinds[-1][1] if self.it.ctx.kinds else None
                m = next((m for m in found if inside is not None and ops.identical(m.copies, inside)), found[0])
                return self.it.parameter(m.term, m.path, ONE)
            return Variants(key, found)
        member = self.it.kinds.get(key) if not self.layer_path else None
        if isinstance(member, Module) and member.term.is_leaf:  # a tensor the layer holds directly (Doge's residual weights)
            return self.it.parameter(member.term, member.path, ONE)
        return member

    def e_Attribute(self, node: ast.Attribute, scope: dict[str, Any]) -> Any:
        base = self.eval(node.value, scope)
        if isinstance(base, Value):
            if node.attr == "shape":
                return base.shape
            if node.attr == "dtype":
                return base.dtype
            if node.attr == "ndim":
                return len(base.shape)
            if node.attr == "requires_grad":
                return base.grad
        if isinstance(base, dict):
            return base.get(node.attr)
        if isinstance(base, Module):
            return self.it.children(base).get(node.attr, Absent(node.attr))
        if isinstance(base, Absent) or base is None:
            return Absent(node.attr)
        raise self.fail(node, f"no attribute {node.attr!r} here")

    def e_Subscript(self, node: ast.Subscript, scope: dict[str, Any]) -> Any:
        base = self.eval(node.value, scope)
        key = self.eval(node.slice, scope)
        if isinstance(base, Module) and base.term.code is not None and base.term.code.stack:
            return replace(base, single=True)  # `layers[i]`: one layer of the stack (call_stack)
        if isinstance(key, sp.Integer):
            key = int(key)
        try:
            return base[key]
        except (TypeError, IndexError, KeyError):
            raise self.fail(node, f"cannot index {type(base).__name__} with {key!r}") from None

    def e_Slice(self, node: ast.Slice, scope: dict[str, Any]) -> slice:
        part = lambda n: None if n is None else int(self.eval(n, scope))  # noqa: E731
        return slice(part(node.lower), part(node.upper), part(node.step))

    def e_UnaryOp(self, node: ast.UnaryOp, scope: dict[str, Any]) -> Any:
        value = self.eval(node.operand, scope)
        if isinstance(node.op, ast.Not):
            return not self.truth(value, node)
        if isinstance(value, Value):
            return self.op("neg", [value], {}, node)
        return -value

    def e_BoolOp(self, node: ast.BoolOp, scope: dict[str, Any]) -> Any:
        last = None
        for value in node.values:
            last = self.eval(value, scope)
            truth = self.truth(last, value) if not isinstance(last, (Value, Module, Absent)) else not isinstance(last, Absent)
            if isinstance(node.op, ast.And) and not truth or isinstance(node.op, ast.Or) and truth:
                return last
        return last

    def e_Compare(self, node: ast.Compare, scope: dict[str, Any]) -> Any:
        left = self.eval(node.left, scope)
        for op, right_node in zip(node.ops, node.comparators):
            right = self.eval(right_node, scope)
            if (isinstance(left, Value) or isinstance(right, Value)) and type(op) in (ast.Lt, ast.LtE, ast.Gt, ast.GtE, ast.Eq, ast.NotEq):
                return self.op("compare", [left, right], {}, node)  # an elementwise comparison: a boolean tensor
            if isinstance(op, (ast.Is, ast.IsNot)):
                l_none = left is None or isinstance(left, Absent)
                r_none = right is None or isinstance(right, Absent)
                result = (l_none and r_none) if isinstance(op, ast.Is) else not (l_none and r_none)
            elif isinstance(op, (ast.Eq, ast.NotEq)) and (isinstance(left, sp.Basic) or isinstance(right, sp.Basic)):
                equal = sp.Eq(sp.sympify(left), sp.sympify(right))
                result = self.truth(equal if isinstance(op, ast.Eq) else sp.Not(equal), node)
            else:
                result = _COMPARE[type(op)](left, right)
                if isinstance(result, sp.Basic):
                    result = self.truth(result, node)
            if not result:
                return False
            left = right
        return True

    def e_IfExp(self, node: ast.IfExp, scope: dict[str, Any]) -> Any:
        return self.eval(node.body if self.truth(self.eval(node.test, scope), node.test) else node.orelse, scope)

    def e_BinOp(self, node: ast.BinOp, scope: dict[str, Any]) -> Any:
        a, b = self.eval(node.left, scope), self.eval(node.right, scope)
        if isinstance(a, Value) or isinstance(b, Value):
            if isinstance(node.op, ast.MatMult):
                return self.op("matmul", [a, b], {}, node)
            if isinstance(node.op, ast.Pow):
                return self.op("pow", [a, b], {}, node)
            if isinstance(node.op, ast.FloorDiv):
                return self.op("floordiv", [a, b], {}, node)
            name = _BINARY.get(type(node.op))
            if name is None:
                raise self.fail(node, f"{type(node.op).__name__} on tensors is not supported")
            return self.op(name, [a, b], {}, node)
        if isinstance(node.op, (ast.Div, ast.FloorDiv)) and all(isinstance(v, (sp.Basic, int)) for v in (a, b)):
            quotient = sp.sympify(a) / sp.sympify(b)
            exact = quotient.xreplace(self.it.values).is_integer if self.it.values else False
            if isinstance(node.op, ast.FloorDiv) and exact and quotient.free_symbols & {B, S}:
                remainder = sp.Mod(sp.sympify(a), sp.sympify(b))  # whole at this S and B only (S // m_c windows): an assumption
                if remainder != 0:
                    self.it.assumed.append(sp.Eq(remainder, 0))
            return quotient if isinstance(node.op, ast.Div) or exact else sp.floor(quotient)
        return _ARITH[type(node.op)](a, b)

    def e_Call(self, node: ast.Call, scope: dict[str, Any]) -> Any:
        target = self.eval(node.func, scope)
        args = [self.eval(a, scope) for a in node.args]
        kwargs = {k.arg: self.eval(k.value, scope) for k in node.keywords}
        if isinstance(target, Absent):
            return args[0] if args else None  # a module the config does not build passes its input through
        if isinstance(target, Module):
            if self.loop != ONE:  # called in a loop: once per iteration
                target = replace(target, copies=sp.expand(target.copies * self.loop))
            return self.it.call_module(target, args, kwargs)
        if isinstance(target, Variants):
            return self.it.call_variants(target, args, kwargs)
        if target in self.it.model.recipe.functions:
            text = self.it.model.recipe.functions[target]
            program = compile_program(text, f"{self.it.model.recipe.source}: [functions] {target}")
            return self.it.execute(program, self.path, self.copies, args, kwargs, self.env, self.children, self.layer_path, tuple(self.declared), self.loop)
        if target in OPERATIONS:
            return self.op(target, args, kwargs, node)
        raise self.fail(node, f"{ast.unparse(node.func)} is not a module, function or operation")

    def op(self, name: str, args: list[Any], kwargs: dict[str, Any], node: ast.AST) -> Any:
        ctx = self.it.ctx
        start = len(ctx.saved)
        try:
            out = OPERATIONS[name](ctx, *args, **kwargs)
        except SymparamError as e:
            raise self.fail(node, f"{name}: {e}") from None
        except (TypeError, ValueError, AttributeError, IndexError) as e:
            raise self.fail(node, f"{name}: {e}") from None
        outputs = tuple(v for v in (out if isinstance(out, tuple) else (out,)) if isinstance(v, Value))
        for v in outputs:
            ctx.steps.append(Step(ctx.module, name, v.shape, v.dtype, ctx.copies, storage=v.storage))
        inputs = tuple(tree_values([*args, *kwargs.values()]))  # tensors given in a list too (cat's, index's)
        ctx.ops.append(Op(name, ctx.module, inputs, outputs, range(start, len(ctx.saved)), ctx.copies))
        return out


def summed(size: sp.Expr, var: sp.Symbol, start: sp.Expr, stop: sp.Expr, values: Mapping | None = None) -> sp.Expr:
    """The sum of a size over var = start .. stop - 1, in closed form: a polynomial in var, and in floor((var + a) / c)
    for one shift a and one divisor c (what a loop over positions allocates for the whole blocks of c among the first
    var + a of them). Counting j = var + a as c*m + r (0 <= r < c) makes both polynomials, summed over r and m."""
    size = sp.expand(sp.sympify(size))
    if var not in size.free_symbols:
        return sp.expand(size * (stop - start))
    floors = {f for f in size.atoms(sp.floor) if var in f.free_symbols}
    if not floors:
        return sp.expand(sp.summation(size, (var, start, stop - 1)))
    blocks = set()
    for f in floors:
        slope = sp.diff(f.args[0], var)
        c = sp.cancel(1 / slope) if slope != 0 else None
        if c is None or var in c.free_symbols or var in sp.expand(f.args[0] * c - var).free_symbols:
            raise SymparamError(f"a loop's size {size}: only whole blocks of the loop index ({f} is not (i + a) // c) sum in closed form")
        blocks.add((sp.expand(f.args[0] * c - var), c))
    if len(blocks) > 1:
        raise SymparamError(f"a loop's size {size}: blocks of the loop index in one shift and divisor sum in closed form, not {len(blocks)}")
    (a, c), = blocks
    if values and sp.sympify(start + a).xreplace(values).is_number and sp.sympify(start + a).xreplace(values) < 0:
        raise SymparamError(f"a loop's size {size}: its blocks start before position 0")
    m, r = sp.Dummy("m", integer=True, nonnegative=True), sp.Dummy("r", integer=True, nonnegative=True)
    at = lambda j, q: size.xreplace({f: q for f in floors}).xreplace({var: j - a})  # noqa: E731  the size at j = var + a in block q

    def below(n: sp.Expr) -> sp.Expr:  # the sum over j = 0 .. n - 1
        q = sp.floor(n / c)
        whole = sp.summation(sp.summation(at(c * m + r, m), (r, 0, c - 1)), (m, 0, q - 1))
        return whole + sp.summation(at(c * q + r, q), (r, 0, n - c * q - 1))

    return sp.expand(below(stop + a) - below(start + a))


class Reach:
    """What reaches the roots, read backward over the forward's operations: for gradients the loss, for what autograd
    keeps everything the caller holds (the loss, the logits, a cache: their graphs stay alive). A layer stack's input
    and output stand for what its layers return. An operation none of whose results reach it is a branch the forward
    drops (a router's group selection, whose scores only pick indices; DeepSeek-V3.2's indexer): autograd frees what it
    saved when the branch's
    results go, and its parameters get no gradient. A tensor made from nothing that needs a gradient takes it from what
    is written into it (`write`: a loop's rows); one nothing is written into stands for all the code of the module
    call that makes it (a custom Function's output)."""

    def __init__(self, steps: list[Op], roots: list[Storage], stands: Mapping[int, list[Storage]], calls: list[range]):
        self.steps = steps
        self.needed: set[int] = set()  # storages
        self.live: set[int] = set()  # operations (indices) whose results reach
        self.reads: set[int] = set()  # parameter storages read into what reaches
        self.stands = stands
        written = {op.outputs[0].storage.ident for op in steps if op.name == "write"}
        for s in [*roots, *(v.storage for v in (steps[-1].outputs if steps else ()))]:
            self.need(s)
        while self.sweep(written, calls):  # again until nothing new reaches: a loop's body reads what it makes later
            pass

    def sweep(self, written: set[int], calls: list[range]) -> bool:
        """One pass backward over the operations; whether it found one more that reaches."""
        steps, found = self.steps, (len(self.live), len(self.needed))
        for i in range(len(steps) - 1, -1, -1):
            op = steps[i]
            if not any(v.grad and v.storage.ident in self.needed for v in op.outputs):
                continue
            self.feeds(i)
            if not any(v.grad for v in op.inputs) and not any(v.storage.ident in written for v in op.outputs):
                call = min((c for c in calls if i in c), key=len, default=range(0))  # a stand-in: what the module call
                for j in call:  # making it computes, before or after it, feeds it (under no_grad too): a custom
                    if op.name == "requires_grad_" or steps[j].module == op.module:  # Function's output (requires_grad_)
                        self.feeds(j, grad_only=False)  # all of it, the modules it calls included; else its own code's
        return (len(self.live), len(self.needed)) != found

    def need(self, s: Storage) -> None:
        if s.ident not in self.needed:
            self.needed.add(s.ident)
            for part in (*s.kinds, *s.covers, *self.stands.get(s.ident, ())):
                self.need(part)

    def feeds(self, i: int, grad_only: bool = True) -> None:
        op = self.steps[i]
        self.live.add(i)
        for v in op.outputs:
            if v.grad:
                self.need(v.storage)
        for v in op.inputs:
            if v.grad or not grad_only:
                if v.storage.param:
                    self.reads.add(v.storage.ident)
                else:
                    self.need(v.storage)

    def keeps(self, i: int, op: Op) -> bool:
        """Whether the operation's saves stay: its results reach; a custom Function's save_for_backward, which has no
        results, where what it saves reaches (BLOOM's GeLU keeps its input)."""
        return i in self.live or (not op.outputs and any(v.storage.ident in self.needed for v in op.inputs))

    def dropped(self) -> frozenset[int]:
        """The saves of operations whose results reach nothing."""
        return frozenset(j for i, op in enumerate(self.steps) if not self.keeps(i, op) for j in op.saves)

    def untrained(self, tree: Term, trainable: Mapping[int, Term], leaf_of: Mapping[int, Term]) -> frozenset[int]:
        """The trainable leaves (by identity) that get no gradient: none of what reads them reaches (DSA indexers, read
        under no_grad or into indices; Mllama's cross-attention layers without an image, which read nothing, where the
        self-attention layers' modules of the same names do). The leaves of one tensor split in the tree (LongCat-Flash's
        zero experts' rows of gate_up_proj) train together."""
        tensor = tensors_of(tree)
        read = {tensor[id(leaf_of[i])] for i in self.reads if i in leaf_of}
        return frozenset(i for i in trainable if tensor[i] not in read)


def tensors_of(tree: Term) -> dict[int, tuple[int, str]]:
    """Each leaf (by identity) -> the tensor transformers holds it in: its path under its module's parent (the leaves
    of sibling modules sharing a key are one tensor: LongCat-Flash's experts and zero experts)."""
    out: dict[int, tuple[int, str]] = {}

    def visit(term: Term, parent: Term | None, grand: Term | None, path: str) -> None:
        path = f"{path}.{term.key}" if path and term.key else path or term.key
        if term.is_leaf:
            out[id(term)] = (id(grand), path)
        for child in term.children:
            visit(child, term, parent, path)

    visit(tree, None, None, "")
    return out


def runtime_dtype(leaf: Term, act: str) -> str:
    """The dtype a parameter has while the model runs in `act`: float32 where the recipe says transformers keeps it so
    (from_pretrained's _keep_in_fp32_modules; peft's adapters), else the model's; a tied copy is the tensor it shares
    (an LM head kept in fp32 but tied to the embedding table is that table, in the model's dtype)."""
    return "fp32" if leaf.dtype == "F32" and not leaf.tied else act


def together(first: Any, child: Any) -> Any:
    """A child (module or tensor), or the tuple of those sharing its key (an nn.Sequential's layers, indices left out)."""
    if first is None:
        return child
    return (*(first if isinstance(first, tuple) else (first,)), child)


def tree_values(obj: Any) -> list[Value]:
    """The tensors in a value, a tuple or a mapping of them."""
    if isinstance(obj, Value):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [v for item in obj for v in tree_values(item)]
    if isinstance(obj, dict):
        return [v for item in obj.values() for v in tree_values(item)]
    return []


class Absent:
    """A name the module does not have (a bias the config leaves out, a norm it does not build): calling it passes the
    input through, testing it is false, `is None` is true."""

    def __init__(self, name: str):
        self.name = name

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Absent({self.name})"


# ---------------------------------------------------------------- the operations programs call


def _size(x: Any) -> sp.Expr:
    return sp.sympify(x)


def _shape(args: tuple) -> list[sp.Expr]:
    items = args[0] if len(args) == 1 and isinstance(args[0], (tuple, list)) else args
    return [_size(n) for n in items]


def _tensor(ctx: Context, *shape: Any, dtype: str = "act", grad: bool = False, buffer: bool = False) -> Value:
    """A tensor made without autograd (positions, masks, rotary tables, indices): nothing saved for it; `buffer=True`:
    a slice of a module's buffer (a registered position-id or causal-mask table), which is never an activation."""
    value = ctx.new(_shape(shape), ctx.act if dtype == "act" else dtype, "tensor", grad)
    return replace(value, storage=replace(value.storage, param=True)) if buffer else value


def _hold(ctx: Context, x: Value) -> Value:
    """x, which the model's outputs keep alive after the forward (the logits, a KV cache's keys and values)."""
    ctx.held.append(x.storage)
    return x


def _regime(ctx: Context, n: Any) -> sp.Expr:
    """A size as its value at the model's values and S, B (a chunk count): the formula holds where it has that value."""
    n = sp.sympify(n)
    value = n.xreplace(ctx.values) if ctx.values else n
    if not value.is_number:
        raise SymparamError(f"{n} has no value here (give the model's config, --seq and --batch)")
    if n.free_symbols:
        ctx.assumed.append(sp.Eq(n, value))
    return value


def _unsupported(ctx: Context, what: str, name: Any) -> Value:
    raise SymparamError(f"{what} {name!r} is not described")


def _integer(name: str) -> Callable[..., Value]:
    def op(ctx: Context, x: Value, *rest: Any, **kw: Any) -> Value:
        return ctx.new(x.shape, kw.get("dtype", "int64") if name != "floordiv" else x.dtype, name, False)
    return op


OPERATIONS: dict[str, Callable[..., Any]] = {
    "linear": ops.linear,
    "matmul": ops.matmul,
    "embedding": ops.embedding,
    **{n: ops.unary("input", n) for n in ("silu", "gelu", "gelu_tanh", "log", "abs", "softplus", "sin", "cos", "erf", "square")},
    **{n: ops.unary("output", n) for n in ("relu", "sigmoid", "tanh", "exp", "rsqrt", "sqrt", "reciprocal")},
    "neg": ops.unary(None, "neg"),
    "pow": lambda ctx, x, e: ops.unary("input", "pow")(ctx, x),
    "add": lambda ctx, a, b: ops.binary(ctx, "add", a, b),
    "sub": lambda ctx, a, b: ops.binary(ctx, "sub", a, b),
    "mul": lambda ctx, a, b: ops.binary(ctx, "mul", a, b),
    "div": lambda ctx, a, b: ops.binary(ctx, "div", a, b),
    "floordiv": _integer("floordiv"),
    "softmax": ops.softmax,
    "log_softmax": lambda ctx, x, dim=-1, dtype=None: ops.softmax(ctx, x, dim, dtype, log=True),
    "mean": lambda ctx, x, dim=-1, keepdim=False: ops.reduce(ctx, x, dim, keepdim, "mean"),
    "sum": lambda ctx, x, dim=-1, keepdim=False: ops.reduce(ctx, x, dim, keepdim, "sum"),
    "var": lambda ctx, x, dim=-1, keepdim=False: ops.var(ctx, x, dim, keepdim),
    "logsigmoid": ops.log_sigmoid,
    "logsumexp": lambda ctx, x, dim=-1, keepdim=False: ops.logsumexp(ctx, x, int(dim), bool(keepdim)),
    "to": lambda ctx, x, dtype, contiguous=False: ops.to(ctx, x, dtype, bool(contiguous)),
    "float": lambda ctx, x: ops.to(ctx, x, "fp32"),
    "view": lambda ctx, x, *shape: ops.view(ctx, x, _shape(shape)),
    "reshape": lambda ctx, x, *shape: ops.view(ctx, x, _shape(shape), copy_if_needed=True),
    "transpose": lambda ctx, x, a, b: ops.transpose(ctx, x, int(a), int(b)),
    "permute": lambda ctx, x, *dims: ops.permute(ctx, x, *(int(d) for d in dims)),
    "unsqueeze": lambda ctx, x, dim: ops.unsqueeze(ctx, x, int(dim)),
    "squeeze": lambda ctx, x, dim: ops.squeeze(ctx, x, int(dim)),
    "expand": lambda ctx, x, *shape: ops.expand(ctx, x, *_shape(shape)),
    "narrow": lambda ctx, x, dim, start, length: ops.narrow(ctx, x, int(dim), start, length),
    "split": lambda ctx, x, sizes, dim=-1: ops.split(ctx, x, [_size(n) for n in sizes], int(dim)),
    "unfold": lambda ctx, x, dim, size, step=1: ops.unfold(ctx, x, int(dim), size, step),
    "flip": lambda ctx, x, *dims: ops.flip(ctx, x),
    "chunk": lambda ctx, x, parts, dim=-1: ops.chunk(ctx, x, int(parts), int(dim)),
    "contiguous": ops.contiguous,
    "clone": ops.copy,
    "zeros_like": ops.zeros_like,
    "cat": lambda ctx, values, dim=-1, count=None: ops.cat(ctx, list(values), int(dim), count),
    "where": ops.where,
    "dropout": ops.dropout,
    "index": ops.index,
    "index_add": lambda ctx, x, dim, idx, src: ops.index_add(ctx, x, int(dim), idx, src),
    "index_add_": lambda ctx, x, dim, idx, src: ops.index_add(ctx, x, int(dim), idx, src, inplace=True),
    "topk": ops.topk,
    "sort": ops.sort,
    "grouped_mm": ops.grouped_mm,
    "sdpa_flash": ops.sdpa_flash,
    "sdpa_math": ops.sdpa_math,
    "tensor": _tensor,
    "nll_loss": ops.nll_loss,
    "layer_norm_op": ops.layer_norm,
    "pad": ops.pad,
    "mish": ops.unary("input", "mish"),
    "unsupported": _unsupported,
    "hold": _hold,
    "solve_triangular": ops.solve_triangular,
    "forward_substitution": ops.forward_substitution,
    "baddbmm": lambda ctx, base, a, b, beta=1, alpha=1: ops.baddbmm(ctx, base, a, b),  # beta * base + alpha * (a @ b)
    "vector_norm": ops.vector_norm,
    "detach": ops.detach,
    "write": ops.write,
    "cumsum": lambda ctx, x, dim=-1, dtype=None: ctx.new(x.shape, dtype or (x.dtype if x.dtype in ops.FLOATS else "int64"), "cumsum", x.grad),
    "convolution": lambda ctx, x, weight, bias=None, padding=0, groups=1: ops.conv1d(ctx, x, weight, bias or None, padding, groups),
    "select": lambda ctx, x, dim, index: ops.select(ctx, x, int(dim), index),
    "einsum": ops.einsum,
    "regime": _regime,
    "pad_dim": lambda ctx, x, dim, left, right: ops.pad_dim(ctx, x, int(dim), left, right),
    "histc": _integer("histc"),
    **{f"{n}_": (lambda n: lambda ctx, a, b: ops.inplace(ctx, n, a, b))(n) for n in ("add", "sub", "mul", "div")},
    "clamp": lambda ctx, x, low=None, high=None: ops.clamp(ctx, x, low, high),
    "clamp_": lambda ctx, x, low=None, high=None: ops.clamp(ctx, x, low, high, inplace=True),
    "masked_fill": ops.masked_fill,
    "max": lambda ctx, x, dim=-1, keepdim=False: ops.max_dim(ctx, x, int(dim), bool(keepdim)),
    "gather": lambda ctx, x, dim, idx: ops.gather(ctx, x, int(dim), idx),
    "scatter": lambda ctx, x, dim, idx, src=None: ops.scatter(ctx, x, int(dim), idx, src),
    "scatter_": lambda ctx, x, dim, idx, src=None: ops.scatter_(ctx, x, int(dim), idx, src),
    "scatter_reduce": lambda ctx, x, dim, idx, src, reduce="sum": ops.scatter_reduce(ctx, x, int(dim), idx, src, str(reduce)),
    "amax": lambda ctx, x, dim=-1, keepdim=False: ops.amax(ctx, x, int(dim), bool(keepdim)),
    "std": lambda ctx, x, dim=-1, keepdim=False: ops.std(ctx, x, int(dim), bool(keepdim)),
    "save_for_backward": ops.save_for_backward,
    "requires_grad_": lambda ctx, x: replace(x, grad=True),  # a custom autograd Function's output, made without autograd
    "view_as_complex": ops.view_as_complex,
    "view_as_real": ops.view_as_real,
    "repeat": lambda ctx, x, *times: ops.repeat(ctx, x, *_shape(times)),
    "repeat_interleave": lambda ctx, x, times, dim: ops.repeat_interleave(ctx, x, _size(times), int(dim)),
    "compare": ops.compare,
    "stack": lambda ctx, values, dim=0, count=None: ops.stack(ctx, list(values), int(dim), count),
    "expm1": ops.unary("output", "expm1"),
    "minimum": lambda ctx, a, b: ops.extremum(ctx, "minimum", a, b),
    "maximum": lambda ctx, a, b: ops.extremum(ctx, "maximum", a, b),
}


def trace(model: Any, mode: Mode = Mode(), context: Mapping[sp.Symbol, int] | None = None) -> Trace:
    """The forward pass of a configured model; `context` gives S and B where a branch depends on them."""
    return Interpreter(model, mode, context).run()


__all__ = ["Mode", "Trace", "LayerCall", "Interpreter", "trace", "INPUTS", "OPERATIONS"]
