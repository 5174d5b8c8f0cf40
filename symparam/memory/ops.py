"""Tensor operations as autograd sees them: output shapes, dtypes and layouts, and what each saves for backward.

Each operation is PyTorch's (aten's, as `torch.autograd.graph.saved_tensors_hooks` observes it on CPU): a Value carries
a symbolic shape, a dtype, strides and the Storage it lives in; views share their base's storage. An operation saves
an input for backward only when the gradient that needs it is wanted (derivatives.yaml: `mul` saves `other` for the
gradient of `self`); parameters are never activations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from itertools import count as _counter

import sympy as sp

from symparam.errors import SymparamError

ONE = sp.Integer(1)
BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "int64": 8, "int32": 4, "bool": 1, "int8": 1, "uint8": 1, "fp8": 1, "complex64": 8}
FLOATS = ("fp16", "bf16", "fp32")
_ids = _counter()


@dataclass(frozen=True, eq=False)
class Storage:
    """Memory one operation allocates: elements, dtype, the module whose code allocated it, and how many copies of it
    one forward pass makes (the layers of its kind). Compared by identity: views share it."""

    numel: sp.Expr
    dtype: str
    module: str  # dotted module path as transformers names it, layer indices left out; "(inputs)" for the batch
    op: str  # the operation that allocated it
    copies: sp.Expr = ONE  # per forward pass
    param: bool = False  # a parameter or buffer: never an activation
    owners: tuple[tuple[str, sp.Expr], ...] = ()  # a stack's layer input: (module, copies) of what it stands for
    covers: tuple[Storage, ...] = ()  # storages it stands for (the embedding output that is layer 0's input)
    kinds: tuple[Storage, ...] = ()  # a tensor merged from layer kinds: the storage each kind's layers allocated
    partial: bool = False  # saved by the layers of one kind only: `copies` are those layers
    earlier: tuple[Storage, ...] = ()  # a loop's carried tensor: the part made before its last iteration (covered too)
    ident: int = field(default_factory=lambda: next(_ids))

    @property
    def bytes(self) -> sp.Expr:
        """Bytes of one copy."""
        return self.numel * BYTES[self.dtype]

    def allocated(self) -> tuple[Storage, ...]:
        """What it is in memory: itself, or for a tensor merged from layer kinds the storage each kind allocated."""
        return tuple(k for part in self.kinds for k in part.allocated()) if self.kinds else (self,)


@dataclass(frozen=True)
class Value:
    """A tensor of the forward pass: shape and strides in symbols, dtype, storage, and whether it needs a gradient."""

    shape: tuple[sp.Expr, ...]
    strides: tuple[sp.Expr, ...]
    dtype: str
    storage: Storage
    grad: bool

    @property
    def param(self) -> bool:
        return self.storage.param

    @property
    def numel(self) -> sp.Expr:
        return sp.Mul(*self.shape)



def identical(a: sp.Expr, b: sp.Expr, values: dict | None = None) -> bool:
    """Whether two sizes are the same formula (their difference cancels); one that is not zero at the model's values
    is not (a quick answer: SymPy's simplify is slow, and a size equal only at the values is an assumption elsewhere)."""
    difference = sp.sympify(a - b)
    if difference == 0:
        return True
    if values:
        at = difference.xreplace(values)
        if at.is_number and at != 0:
            return False
    return sp.expand(difference) == 0 or sp.cancel(difference) == 0


def dense(shape: Sequence[sp.Expr]) -> tuple[sp.Expr, ...]:
    """Row-major strides of a shape."""
    out, step = [], ONE
    for n in reversed(shape):
        out.append(step)
        step = step * n
    return tuple(reversed(out))


@dataclass
class Context:
    """Where operations run: the module path to attribute allocations to, copies per pass, and the record of saves."""

    module: str
    copies: sp.Expr
    saved: list[tuple[Storage, str]]  # (storage, module that saved it), in order
    steps: list[Step]  # every operation's outputs, in order (the shape walk)
    act: str  # the dtype activations run in ("bf16", "fp32")
    ops: list[Op] = field(default_factory=list)  # every operation with its inputs and outputs, in order
    held: list[Storage] = field(default_factory=list)  # what the caller holds after the forward (logits, a KV cache)
    values: dict = field(default_factory=dict)  # the model's sizes (and S, B): sizes equal there may broadcast
    assumed: list = field(default_factory=list)  # equalities of sizes the trace relied on (h = h_kv)
    kinds: list = field(default_factory=list)  # layer kinds running now: (copies around them, their own copies)
    grad_enabled: bool = True  # False inside `with no_grad():`: results need no gradient and nothing is saved

    def contiguous(self, x: Value) -> bool:
        """Whether x is laid out row-major, as PyTorch checks it (innermost first, each stride the product of the sizes
        inside it): dimensions of size 1 do not count, nor multiply; a size or stride that is 1, or equal, only at the
        model's values and S, B (one head: [B, h, S, d] transposed is [B, S, h, d] already) is an assumption of the formula."""
        expected = ONE
        for n, s in reversed(list(zip(x.shape, x.strides))):
            if identical(s, expected, self.values):
                expected = expected * n
            elif self.unit(n):
                continue
            elif self.same(s, expected):
                expected = expected * n
            else:
                return False
        return True

    def unit(self, n: sp.Expr) -> bool:
        """Whether a size is 1, where layouts treat it apart: as a formula, or at the model's values (B = 1 lets a
        transposed tensor fold as a view); either answer on a size with symbols is an assumption of the formula."""
        if self.same(n, ONE):
            return True
        if self.values and sp.sympify(n).free_symbols and sp.sympify(n).xreplace(self.values).is_number:
            self.differs(n)
        return False

    def one(self, n: sp.Expr) -> bool:
        """Whether a size is 1, as a formula or at the model's values; decided by the values either way, it is an
        assumption of the formula (B = 1, or B != 1: a copy the layout needs only past one sequence)."""
        if self.same(n, ONE):
            return True
        if self.values and sp.sympify(n).free_symbols:
            self.differs(n)
        return False

    def differs(self, n: sp.Expr) -> None:
        """n != 1 as an assumption of the formula, unless it holds as a formula (a sum of positive sizes, S + S/m_c)."""
        if sp.Ne(n, ONE) is not sp.true:
            self.assumed.append(sp.Ne(n, ONE))

    def same(self, a: sp.Expr, b: sp.Expr) -> bool:
        """Whether two sizes are equal: as formulas, or at the model's values (remembered as an assumption)."""
        if identical(a, b, self.values):
            return True
        if self.values and sp.sympify(a - b).xreplace(self.values) == 0:
            self.assumed.append(sp.Eq(a, b))
            return True
        return False

    def new(self, shape: Sequence[sp.Expr], dtype: str, op: str, grad: bool, strides: Sequence[sp.Expr] | None = None) -> Value:
        """A freshly allocated tensor (dense, or in the given layout)."""
        shape = tuple(sp.sympify(n) for n in shape)
        storage = Storage(sp.Mul(*shape), dtype, self.module, op, self.copies)
        return Value(shape, tuple(strides) if strides is not None else dense(shape), dtype, storage, grad and self.grad_enabled)

    def save(self, *values: Value | None) -> None:
        """Record what backward keeps; a tensor every layer made, saved in the layers of one kind, is kept in those."""
        if not self.grad_enabled:
            return
        for v in values:
            if v is not None and not v.param:
                storage = v.storage
                if any(identical(outer, storage.copies, self.values) for outer, _ in self.kinds):
                    storage = replace(storage, copies=self.kinds[-1][1], partial=True)
                self.saved.append((storage, self.module))


@dataclass(frozen=True)
class Op:
    """One operation as it ran: name, module, its tensor inputs and outputs, and which of the saves it made."""

    name: str
    module: str
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    saves: range  # indices into Context.saved
    copies: sp.Expr = ONE  # how many times it runs in one forward pass (the layers of its kind)

    @property
    def allocates(self) -> bool:
        """Whether it made a new tensor (not a view of an input)."""
        ins = {v.storage.ident for v in self.inputs}
        return any(v.storage.ident not in ins for v in self.outputs)


@dataclass(frozen=True)
class Step:
    """One operation of the walk: where it ran, what it is, its output's shape and dtype, how many layers repeat it."""

    module: str
    op: str
    shape: tuple[sp.Expr, ...]
    dtype: str
    copies: sp.Expr
    saved: bool = False  # set afterwards: autograd keeps this output (its storage) for backward
    storage: Storage | None = field(default=None, compare=False, repr=False)


def promote(*dtypes: str) -> str:
    """PyTorch's type promotion among the dtypes of tensors (scalars do not promote)."""
    floats = [t for t in dtypes if t in FLOATS]
    if not floats:
        return max(dtypes, key=lambda t: BYTES[t])
    if "fp32" in floats or {"bf16", "fp16"} <= set(floats):
        return "fp32"
    return floats[0]


def result_type(*values: Value) -> str:
    """The dtype of an operation on tensors: a 0-dim tensor promotes like a scalar (only where it is floating and the
    others are not), as torch.result_type does."""
    dims = [v.dtype for v in values if v.shape]
    zero = [v.dtype for v in values if not v.shape]
    if dims and (all(t in FLOATS for t in dims) or not any(t in FLOATS for t in zero)):
        return promote(*dims)
    return promote(*dims, *zero)


def broadcast(ctx: Context, *shapes: tuple[sp.Expr, ...]) -> tuple[sp.Expr, ...]:
    """NumPy broadcasting over symbolic sizes: equal sizes (as formulas or at the model's values), or one of them 1 (as
    a formula, or else at the model's values: an assumption of the formula)."""
    width = max(len(s) for s in shapes)
    padded = [(ONE,) * (width - len(s)) + tuple(s) for s in shapes]
    out = []
    for sizes in zip(*padded):
        big = [n for n in sizes if n != 1]
        if any(not ctx.same(big[0], n) for n in big[1:]):
            big = [n for n in big if not ctx.same(n, ONE)]
        if any(not ctx.same(big[0], n) for n in big[1:]):
            raise SymparamError(f"shapes {[list(s) for s in shapes]} do not broadcast")
        out.append(big[0] if big else ONE)
    return tuple(out)


def _layout_like(v: Value, shape: tuple[sp.Expr, ...]) -> tuple[sp.Expr, ...]:
    """Strides of an elementwise result: dense in the dimension order of an input of the full shape (TensorIterator
    keeps a permuted layout), else row-major."""
    if v.shape != shape or any(s == 0 for s in v.strides):
        return dense(shape)
    order = sorted(range(len(shape)), key=lambda i: (-_rank(v.strides[i]), i))
    strides = [ONE] * len(shape)
    step = ONE
    for i in reversed(order):
        strides[i] = step
        step = step * shape[i]
    return tuple(strides)


def _rank(stride: sp.Expr) -> float:
    """A stride's size for ordering dimensions: symbols are taken large and equal-degree terms by their degree."""
    stride = sp.sympify(stride)
    if stride.is_number:
        return float(stride)
    num, den = sp.fraction(sp.together(stride))
    degree = sp.Poly(num).total_degree() - (sp.Poly(den).total_degree() if den.free_symbols else 0)  # d_inner/g_ssm: 0
    return 1e6 * float(degree) + float(stride.subs({s: 1000 for s in stride.free_symbols}))


# ---------------------------------------------------------------- views (no allocation, nothing saved)


def view(ctx: Context, x: Value, shape: Sequence[sp.Expr], copy_if_needed: bool = False) -> Value:
    """x with another shape over the same storage (`view`; `reshape` copies where no view is possible)."""
    shape = _infer(ctx, x, shape)
    if tuple(shape) == x.shape:
        return x
    strides = _view_strides(ctx, x, shape)
    if strides is None:
        if not copy_if_needed:
            raise SymparamError(f"view: a tensor of shape {list(x.shape)} and strides {list(x.strides)} cannot be viewed as {list(shape)}; use reshape")
        return view(ctx, contiguous(ctx, x), shape)
    return replace(x, shape=tuple(shape), strides=strides)


def _infer(ctx: Context, x: Value, shape: Sequence[sp.Expr]) -> tuple[sp.Expr, ...]:
    """The shape with its -1 filled in; its elements must be x's, as formulas or at the model's values (OLMoE's query
    norm of width d viewed as h*h_d: the figure then holds where they are equal)."""
    shape = [sp.sympify(n) for n in shape]
    if sum(1 for n in shape if n == -1) > 1:
        raise SymparamError("view: at most one -1")
    if any(n == -1 for n in shape):
        known = sp.Mul(*(n for n in shape if n != -1))
        shape = [sp.cancel(x.numel / known) if n == -1 else n for n in shape]
    if not identical(sp.Mul(*shape), x.numel) and not ctx.same(sp.Mul(*shape), x.numel):
        raise SymparamError(f"view: {list(x.shape)} has {x.numel} elements, {list(shape)} has {sp.Mul(*shape)}")
    return tuple(shape)


def _view_strides(ctx: Context, x: Value, shape: tuple[sp.Expr, ...]) -> tuple[sp.Expr, ...] | None:
    """PyTorch's computeStride over symbolic sizes: the strides of a view, or None where only a copy can reshape. Sizes
    and strides equal, or 1, only at the model's values (one head: a transposed [B, h, S, h_d] folds as a view) are
    assumptions of the formula."""
    if ctx.contiguous(x):
        return dense(shape)
    new = [ONE] * len(shape)
    view_d = len(shape) - 1
    base = x.strides[-1]
    tensor_numel = view_numel = ONE
    for d in range(len(x.shape) - 1, -1, -1):
        tensor_numel = tensor_numel * x.shape[d]
        if d == 0 or (not ctx.unit(x.shape[d - 1]) and not ctx.same(x.strides[d - 1], tensor_numel * base)):
            while view_d >= 0 and (not ctx.same(view_numel, tensor_numel) or ctx.unit(shape[view_d])):
                new[view_d] = view_numel * base
                view_numel = view_numel * shape[view_d]
                view_d -= 1
            if not ctx.same(view_numel, tensor_numel):
                return None
            if d > 0:
                base = x.strides[d - 1]
                tensor_numel = view_numel = ONE
    return tuple(new) if view_d == -1 else None


def transpose(ctx: Context, x: Value, a: int, b: int) -> Value:
    shape, strides = list(x.shape), list(x.strides)
    a, b = a % len(shape), b % len(shape)
    shape[a], shape[b] = shape[b], shape[a]
    strides[a], strides[b] = strides[b], strides[a]
    return replace(x, shape=tuple(shape), strides=tuple(strides))


def permute(ctx: Context, x: Value, *dims: int) -> Value:
    dims = [d % len(x.shape) for d in dims]
    return replace(x, shape=tuple(x.shape[d] for d in dims), strides=tuple(x.strides[d] for d in dims))


def unsqueeze(ctx: Context, x: Value, dim: int) -> Value:
    dim = dim % (len(x.shape) + 1)
    stride = x.strides[dim] * x.shape[dim] if dim < len(x.shape) else ONE
    return replace(x, shape=x.shape[:dim] + (ONE,) + x.shape[dim:], strides=x.strides[:dim] + (stride,) + x.strides[dim:])


def squeeze(ctx: Context, x: Value, dim: int) -> Value:
    dim = dim % len(x.shape)
    if x.shape[dim] != 1:
        return x
    return replace(x, shape=x.shape[:dim] + x.shape[dim + 1:], strides=x.strides[:dim] + x.strides[dim + 1:])


def expand(ctx: Context, x: Value, *shape: sp.Expr) -> Value:
    shape = tuple(sp.sympify(n) for n in shape)
    pad = len(shape) - len(x.shape)
    sizes, strides = (ONE,) * pad + x.shape, (sp.Integer(0),) * pad + x.strides
    out = tuple(o if n == -1 else n for n, o in zip(shape, sizes))
    kept = lambda n, o: n == o or (o != 1 and ctx.same(n, o))  # noqa: E731  (h and h_kv equal at the model's values: no broadcast)
    return replace(x, shape=out, strides=tuple(s if kept(n, o) else sp.Integer(0) for n, o, s in zip(out, sizes, strides)))


def narrow(ctx: Context, x: Value, dim: int, start: sp.Expr, length: sp.Expr) -> Value:
    dim = dim % len(x.shape)
    return replace(x, shape=x.shape[:dim] + (sp.sympify(length),) + x.shape[dim + 1:])


def select(ctx: Context, x: Value, dim: int, index: sp.Expr) -> Value:
    """x[..., index, ...] along `dim`: a view without that dimension."""
    dim = dim % len(x.shape)
    return replace(x, shape=x.shape[:dim] + x.shape[dim + 1:], strides=x.strides[:dim] + x.strides[dim + 1:])


def unfold(ctx: Context, x: Value, dim: int, size: sp.Expr, step: sp.Expr = 1) -> Value:
    """Tensor.unfold: the windows of `size` along `dim`, `step` apart, as a new last dimension; a view (overlapping
    windows share their elements)."""
    dim = dim % len(x.shape)
    size, step = sp.sympify(size), sp.sympify(step)
    count = sp.floor((x.shape[dim] - size) / step) + 1 if step != 1 else x.shape[dim] - size + 1
    shape = x.shape[:dim] + (count,) + x.shape[dim + 1:] + (size,)
    strides = x.strides[:dim] + (x.strides[dim] * step,) + x.strides[dim + 1:] + (x.strides[dim],)
    return replace(x, shape=shape, strides=strides)


def split(ctx: Context, x: Value, sizes: Sequence[sp.Expr], dim: int = -1) -> tuple[Value, ...]:
    """Views of consecutive pieces along `dim` (torch.split with a list of sizes)."""
    dim = dim % len(x.shape)
    if not identical(sp.Add(*sizes), x.shape[dim]):
        raise SymparamError(f"split: sizes {list(sizes)} do not add up to {x.shape[dim]}")
    return tuple(narrow(ctx, x, dim, 0, n) for n in sizes)


def chunk(ctx: Context, x: Value, parts: int, dim: int = -1) -> tuple[Value, ...]:
    dim = dim % len(x.shape)
    return split(ctx, x, [x.shape[dim] / parts] * int(parts), dim)


# ---------------------------------------------------------------- allocating operations


def copy(ctx: Context, x: Value, op: str = "clone") -> Value:
    return ctx.new(x.shape, x.dtype, op, x.grad)


def flip(ctx: Context, x: Value) -> Value:
    """torch.flip: a copy in x's dimension order (row-major for overlapping windows), reversed along the dimensions it
    flips; nothing saved (its gradient flips back)."""
    return ctx.new(x.shape, x.dtype, "flip", x.grad, _layout_like(x, x.shape))


def zeros_like(ctx: Context, x: Value) -> Value:
    """torch.zeros_like: a new tensor of x's shape and dtype in x's layout (preserve_format), no gradient."""
    return ctx.new(x.shape, x.dtype, "zeros_like", False, _layout_like(x, x.shape))


def contiguous(ctx: Context, x: Value) -> Value:
    return x if ctx.contiguous(x) else copy(ctx, x, "contiguous")


def to(ctx: Context, x: Value, dtype: str, contiguous: bool = False) -> Value:
    """A cast; to the dtype it has already, the same tensor. `contiguous`: memory_format=torch.contiguous_format, a
    row-major result, which aliases x where x's dtype is already right and its suggested format is not channels-last
    (a transposed tensor of up to three dimensions stays as it is)."""
    dtype = ctx.act if dtype == "act" else dtype
    channels_last = len(x.shape) == 4 and _stride_order(x) == [1, 3, 2, 0]
    if dtype == x.dtype and not (contiguous and channels_last):
        return x
    layout = dense(x.shape) if contiguous else _layout_like(x, x.shape)
    return ctx.new(x.shape, dtype, f"to {dtype}", x.grad and dtype in FLOATS, layout)


def unary(save: str | None, name: str) -> Callable[[Context, Value], Value]:
    """An elementwise function that saves its input ("input"), its result ("output") or nothing for backward."""

    def op(ctx: Context, x: Value) -> Value:
        out = ctx.new(x.shape, x.dtype, name, x.grad, _layout_like(x, x.shape))
        if x.grad:
            ctx.save(x if save == "input" else out if save == "output" else None)
        return out

    op.__name__ = name
    return op


def binary(ctx: Context, op: str, a: Value | sp.Expr, b: Value | sp.Expr) -> Value:
    """+, -, *, / between tensors (broadcast) or a tensor and a scalar: mul saves the other operand for each gradient
    it computes, div saves the divisor (and the dividend where the divisor needs a gradient)."""
    tensors = [v for v in (a, b) if isinstance(v, Value)]
    shape = broadcast(ctx, *(v.shape for v in tensors))
    dtype = result_type(*tensors)
    grad = any(v.grad for v in tensors)
    lead = next((v for v in tensors if v.shape == shape), tensors[0])
    out = ctx.new(shape, dtype, op, grad, _layout_like(lead, shape))
    a_t, b_t = isinstance(a, Value), isinstance(b, Value)
    if op == "mul" and a_t and b_t:
        ctx.save(b if a.grad else None, a if b.grad else None)
    elif op == "div" and b_t:
        ctx.save(b if (a_t and a.grad) or b.grad else None, a if b.grad and a_t else None)
    return out


def linear(ctx: Context, x: Value, weight: Value, bias: Value | None = None) -> Value:
    """x W^T (+ b): saves x for the weight's gradient (W, a parameter, for x's); an input of more than two dimensions
    is folded to 2-D first, as aten's linear and matmul do (`reshape`: a copy where its layout allows no view, such as a
    transposed input), and the folded input is what is saved."""
    out = ctx.new(x.shape[:-1] + (weight.shape[-2],), promote(x.dtype, weight.dtype), "linear", x.grad or weight.grad or bool(bias and bias.grad))
    if len(x.shape) > 2:
        x = view(ctx, x, (sp.Mul(*x.shape[:-1]), x.shape[-1]), copy_if_needed=True)
    if weight.grad:
        ctx.save(x)
    if x.grad:
        ctx.save(weight)
    return out


def matmul(ctx: Context, a: Value, b: Value) -> Value:
    """torch.matmul of batched tensors: each operand is folded to 3-D (a copy where it is not laid out for that, as
    `reshape` copies) and bmm saves each for the other's gradient."""
    batch = broadcast(ctx, a.shape[:-2], b.shape[:-2])
    a3 = _fold(ctx, a, batch)
    b3 = _fold(ctx, b, batch)
    out = ctx.new(batch + (a.shape[-2], b.shape[-1]), promote(a.dtype, b.dtype), "matmul", a.grad or b.grad)
    ctx.save(b3 if a.grad else None, a3 if b.grad else None)
    return out


def _fold(ctx: Context, x: Value, batch: tuple[sp.Expr, ...]) -> Value:
    if len(x.shape) <= 2:
        return x
    expanded = expand(ctx, x, *(batch + x.shape[-2:]))
    return view(ctx, expanded, (sp.Mul(*batch),) + x.shape[-2:], copy_if_needed=True)


def conv1d(ctx: Context, x: Value, weight: Value, bias: Value | None = None, padding: sp.Expr = 0, groups: sp.Expr = 1) -> Value:
    """torch.nn.functional.conv1d of [B, C_in, L] with a weight [C_out, C_in/groups, k]: [B, C_out, L + 2 padding - k + 1];
    aten's convolution saves its input and weight for backward."""
    length = x.shape[-1] + 2 * sp.sympify(padding) - weight.shape[-1] + 1
    out = ctx.new(x.shape[:-2] + (weight.shape[0], length), promote(x.dtype, weight.dtype), "conv1d", x.grad or weight.grad)
    if x.grad or weight.grad:
        ctx.save(x)
    return out


def embedding(ctx: Context, ids: Value, weight: Value) -> Value:
    """Rows of a table: saves the indices (the weight's gradient scatters into them)."""
    out = ctx.new(ids.shape + (weight.shape[-1],), weight.dtype, "embedding", weight.grad)
    if weight.grad:
        ctx.save(ids)
    return out


def softmax(ctx: Context, x: Value, dim: int = -1, dtype: str | None = None, log: bool = False) -> Value:
    """softmax (or log_softmax) along `dim`, in `dtype` if given: saves its result."""
    src = to(ctx, x, dtype) if dtype else x
    out = ctx.new(x.shape, src.dtype, "log_softmax" if log else "softmax", x.grad, _layout_like(x, x.shape))
    if x.grad:
        ctx.save(out)
    return out


def reduce(ctx: Context, x: Value, dim: int | Sequence[int] = -1, keepdim: bool = False, op: str = "sum") -> Value:
    """sum / mean over dimensions: nothing saved (the gradient needs only the shape)."""
    dims = {int(d) % len(x.shape) for d in (dim if isinstance(dim, (list, tuple)) else [dim])}
    shape = tuple(ONE if i in dims else n for i, n in enumerate(x.shape) if keepdim or i not in dims)
    return ctx.new(shape, x.dtype, op, x.grad)


def var(ctx: Context, x: Value, dim: int = -1, keepdim: bool = False) -> Value:
    """Tensor.var along dimensions (any correction): saves its input (var_backward reads it)."""
    out = reduce(ctx, x, dim, keepdim, "var")
    if x.grad:
        ctx.save(x)
    return out


def log_sigmoid(ctx: Context, x: Value) -> Value:
    """F.logsigmoid (log_sigmoid_forward): its result and, on CPU, a buffer of x's shape and dtype (CUDA's is empty);
    saves x and the buffer."""
    out = ctx.new(x.shape, x.dtype, "log_sigmoid", x.grad, _layout_like(x, x.shape))
    if x.grad:
        ctx.save(x, ctx.new(x.shape, x.dtype, "log_sigmoid buffer", False))
    return out


def logsumexp(ctx: Context, x: Value, dim: int = -1, keepdim: bool = False) -> Value:
    """torch.logsumexp along one dimension: saves its input and its result (derivatives.yaml)."""
    dim = dim % len(x.shape)
    shape = tuple(ONE if i == dim else n for i, n in enumerate(x.shape) if keepdim or i != dim)
    out = ctx.new(shape, x.dtype, "logsumexp", x.grad)
    if x.grad:
        ctx.save(x, out)
    return out


def cat(ctx: Context, values: Sequence[Value], dim: int = -1, count: sp.Expr | None = None) -> Value:
    """torch.cat along `dim`, of the values or of `count` tensors shaped like values[0] (a loop's outputs, one per
    iteration); nothing saved."""
    dim = dim % len(values[0].shape)
    shape = list(values[0].shape)
    shape[dim] = values[0].shape[dim] * sp.sympify(count) if count is not None else sp.Add(*(v.shape[dim] for v in values))
    return ctx.new(shape, promote(*(v.dtype for v in values)), "cat", any(v.grad for v in values))


def stack(ctx: Context, values: Sequence[Value], dim: int = 0, count: sp.Expr | None = None) -> Value:
    """torch.stack: a new tensor with a new dimension at `dim` of len(values), or of `count` tensors shaped like
    values[0] (a loop's outputs, one per iteration); nothing saved."""
    first = values[0]
    dim = dim % (len(first.shape) + 1)
    n = sp.sympify(count) if count is not None else sp.Integer(len(values))
    shape = first.shape[:dim] + (n,) + first.shape[dim:]
    return ctx.new(shape, promote(*(v.dtype for v in values)), "stack", any(v.grad for v in values))


def where(ctx: Context, cond: Value, a: Value | sp.Expr, b: Value | sp.Expr) -> Value:
    """where(cond, a, b): saves the condition."""
    tensors = [v for v in (cond, a, b) if isinstance(v, Value)]
    shape = broadcast(ctx, *(v.shape for v in tensors))
    values = [v for v in (a, b) if isinstance(v, Value)]
    grad = any(v.grad for v in values)
    out = ctx.new(shape, promote(*(v.dtype for v in values)) if values else ctx.act, "where", grad)
    if grad:
        ctx.save(cond)
    return out


def dropout(ctx: Context, x: Value, p: float) -> Value:
    """Dropout in training, as CPU autograd runs it (`_dropout_impl`): p = 0 returns its input; otherwise a noise tensor
    of x's dtype (bernoulli, divided by 1 - p) multiplies x, and the product saves the noise for x's gradient (CUDA's
    fused `native_dropout` saves a boolean mask instead)."""
    if not p:
        return x
    noise = ctx.new(x.shape, x.dtype, "dropout noise", False, _layout_like(x, x.shape))
    return binary(ctx, "mul", x, noise)


def index(ctx: Context, x: Value, idx: Value | Sequence[Value], dim: int = 0) -> Value:
    """x[idx] along the first dimension, or along `dim` (x[..., [i], ...]): a copy; saves the indices. A sequence of
    index tensors indexes as many dimensions at once (x[rows, cols]: one result per index position), saving each."""
    indices = tuple(idx) if isinstance(idx, (tuple, list)) else (idx,)
    dim = int(dim) % len(x.shape)
    out = ctx.new(x.shape[:dim] + indices[0].shape + x.shape[dim + len(indices):], x.dtype, "index", x.grad)
    if x.grad:
        ctx.save(*indices)
    return out


def index_add(ctx: Context, x: Value, dim: int, idx: Value, src: Value, inplace: bool = False) -> Value:
    """x.index_add(dim, idx, src): rows of src added into a copy of x at the indices (into x itself in place,
    index_add_); saves the indices and src (its gradient, index_select(grad).expand_as(src), reads src)."""
    grad = (x.grad or src.grad) and ctx.grad_enabled
    out = replace(x, grad=grad) if inplace else ctx.new(x.shape, promote(x.dtype, src.dtype), "index_add", grad)
    if out.grad:
        ctx.save(idx, src)
    return out


def topk(ctx: Context, x: Value, k: sp.Expr) -> tuple[Value, Value]:
    """The k largest along the last dimension: values and int64 indices; saves the indices for the gradient."""
    shape = x.shape[:-1] + (sp.sympify(k),)
    values, indices = ctx.new(shape, x.dtype, "topk", x.grad), ctx.new(shape, "int64", "topk indices", False)
    if x.grad:
        ctx.save(indices)
    return values, indices


def sort(ctx: Context, x: Value) -> tuple[Value, Value]:
    values, indices = ctx.new(x.shape, x.dtype, "sort", x.grad), ctx.new(x.shape, "int64", "sort indices", False)
    if x.grad:
        ctx.save(indices)
    return values, indices


def grouped_mm(ctx: Context, x: Value, weight: Value, offsets: Value) -> Value:
    """Grouped matmul of token-expert rows with stacked expert weights [n, out, in]: saves the rows and the offsets."""
    out = ctx.new(x.shape[:-1] + (weight.shape[-2],), x.dtype, "grouped_mm", x.grad or weight.grad)
    if weight.grad or x.grad:
        ctx.save(x if weight.grad else None, weight if x.grad else None, offsets)
    return out


def sdpa_flash(ctx: Context, q: Value, k: Value, v: Value, mask: Value | None) -> Value:
    """PyTorch's fused attention kernel (CPU `_scaled_dot_product_flash_attention_for_cpu`; CUDA's flash kernel keeps
    the same): saves q, k, v, its output (laid out in q's dimension order, measured: [B, S, h, d_v] for heads split
    from a projection, [B, h, S, d_v] for a contiguous q) and the fp32 log-sum-exp per query row; a boolean
    mask is first turned into an additive mask of the query's dtype, which it saves too. Where none of q, k, v needs
    a gradient (a frozen module fed what needs none: BLT's patcher), nothing."""
    b, h, s, _ = q.shape
    dv = v.shape[-1]
    shape = (b, h, s, dv)
    out = ctx.new(shape, q.dtype, "sdpa", q.grad or k.grad or v.grad, strides=_layout_like(replace(q, shape=shape), shape))
    lse = ctx.new((b, h, s), "fp32", "sdpa logsumexp", False)
    if mask is not None and mask.dtype == "bool":
        mask = ctx.new(mask.shape, q.dtype, "sdpa mask", False)
    if q.grad or k.grad or v.grad:
        ctx.save(q, k, v, out, lse, mask)
    return out


def sdpa_math(ctx: Context, q: Value, k: Value, v: Value, mask: Value | None, p: float = 0, gqa: bool = True) -> Value:
    """PyTorch's reference attention (`_scaled_dot_product_attention_math`), where no fused kernel applies (on CPU: a
    value head size unlike the key's, attention dropout): q, k, v upcast to fp32 where they are bf16/fp16 (measured),
    key and value heads repeated for grouped queries (enable_gqa; gqa=False: a caller without it, whose single key and
    value head the matmuls broadcast), q and k^T each scaled by sqrt(scale), scores (the mask added), softmax, dropout,
    weighted values cast back; autograd keeps what those ops save."""
    origin = q.dtype
    q, k, v = (to(ctx, t, "fp32") if t.dtype in ("bf16", "fp16") else t for t in (q, k, v))
    if gqa and not ctx.same(k.shape[-3], q.shape[-3]):  # enable_gqa: each key/value head repeated for its query heads
        k, v = (repeat_interleave(ctx, t, q.shape[-3] / k.shape[-3], -3) for t in (k, v))
    q = binary(ctx, "mul", q, sp.Symbol("scale"))
    w = matmul(ctx, q, binary(ctx, "mul", transpose(ctx, k, -2, -1), sp.Symbol("scale")))
    if mask is not None:
        w = binary(ctx, "add", w, mask if mask.dtype != "bool" else ctx.new(mask.shape, q.dtype, "sdpa mask", False))
    w = dropout(ctx, softmax(ctx, w), p)
    return to(ctx, matmul(ctx, w, v), origin)


def solve_triangular(ctx: Context, a: Value, b: Value) -> Value:
    """torch.linalg.solve_triangular(a, b): x with a x = b, in b's shape; one backward formula for both inputs reads
    a and the result, so it saves both."""
    out = ctx.new(broadcast(ctx, a.shape[:-2], b.shape[:-2]) + b.shape[-2:], promote(a.dtype, b.dtype), "solve_triangular", a.grad or b.grad)
    if a.grad or b.grad:
        ctx.save(a, out)
    return out


def forward_substitution(ctx: Context, a: Value) -> Value:
    """The rows of [..., n, n] matrices remade one at a time in place, as the reference chunked delta rules invert
    their unit lower-triangular systems (`for i in range(1, n)`: `row, sub = a[..., i, :i].clone(), a[..., :i,
    :i].clone()`, `a[..., i, :i] = row + (row.unsqueeze(-1) * sub).sum(-2)`): each step's product saves both clones,
    i + i^2 elements per matrix for i = 1 .. n - 1; the writes into views of a save nothing."""
    n = a.shape[-1]
    if a.grad:
        matrices = sp.Mul(*a.shape[:-2])
        rows = ctx.new((matrices * n * (n - 1) / 2,), a.dtype, "forward substitution rows", False)
        blocks = ctx.new((matrices * (n - 1) * n * (2 * n - 1) / 6,), a.dtype, "forward substitution blocks", False)
        ctx.save(rows, blocks)
    return a


def baddbmm(ctx: Context, base: Value, a: Value, b: Value) -> Value:
    """base + a @ b over a batch of matrices (base broadcast to the product's shape): saves each factor for the other's gradient."""
    out = ctx.new(broadcast(ctx, base.shape, a.shape[:-1] + b.shape[-1:]), base.dtype, "baddbmm", base.grad or a.grad or b.grad)
    ctx.save(b if a.grad else None, a if b.grad else None)
    return out


def vector_norm(ctx: Context, x: Value, dim: int) -> Value:
    """torch.linalg.norm along one dimension: saves its input and result."""
    dim = int(dim) % len(x.shape)
    out = ctx.new(x.shape[:dim] + x.shape[dim + 1:], x.dtype, "norm", x.grad)
    if x.grad:
        ctx.save(x, out)
    return out


def write(ctx: Context, dst: Value, src: Value) -> Value:
    """dst[...] = src: src copied into a slice of dst (copy_), which then takes its gradient; nothing saved, nothing
    allocated (the rows a loop writes into its output)."""
    return replace(dst, grad=dst.grad or (src.grad and ctx.grad_enabled))


def detach(ctx: Context, x: Value) -> Value:
    """The same tensor, cut from the graph."""
    return replace(x, grad=False)


def nll_loss(ctx: Context, logp: Value, target: Value) -> Value:
    """The negative log-likelihood of the targets (cross entropy after log_softmax): saves the targets and the fp32
    total weight it divides by."""
    out = ctx.new((), logp.dtype, "nll_loss", logp.grad)
    if logp.grad:
        ctx.save(target, ctx.new((), logp.dtype, "nll_loss total weight", False))
    return out


def layer_norm(ctx: Context, x: Value, weight: Value | None, bias: Value | None) -> Value:
    """torch.nn.functional.layer_norm over the last dimension: saves its input, weight and bias (activations only where
    computed: Nemotron's weight + 1) and the per-row mean and 1/std, which the CPU kernel keeps in the input's dtype
    (fp32 only where a bf16/fp16 input meets fp32 parameters; CUDA's are fp32)."""
    out = ctx.new(x.shape, x.dtype, "layer_norm", x.grad or bool(weight and weight.grad))
    rows = x.shape[:-1] + (ONE,)
    stats = "fp32" if x.dtype in ("bf16", "fp16") and weight is not None and weight.dtype == "fp32" else x.dtype
    ctx.save(x, weight or None, bias or None, ctx.new(rows, stats, "layer_norm mean", False), ctx.new(rows, stats, "layer_norm rstd", False))
    return out


def pad(ctx: Context, x: Value, left: sp.Expr, right: sp.Expr) -> Value:
    """torch.nn.functional.pad of the last dimension: a new tensor, nothing saved."""
    return ctx.new(x.shape[:-1] + (x.shape[-1] + left + right,), x.dtype, "pad", x.grad)


def inplace(ctx: Context, op: str, a: Value, b: Value | sp.Expr) -> Value:
    """a.add_(b), a.sub_(b), a.mul_(b), a.div_(b): the result lives in a's storage; where a gradient needs a's value
    from before the update (mul_ and div_ by a tensor that needs a gradient), autograd saves a clone of it, and mul_
    and div_ save the tensor operand as their out-of-place forms do."""
    b_t = isinstance(b, Value)
    out = replace(a, grad=a.grad or (b_t and b.grad))
    if op in ("mul", "div") and b_t:
        ctx.save(b if a.grad or (op == "div" and b.grad) else None)
        if b.grad:
            ctx.save(copy(ctx, a))
    return out


def clamp(ctx: Context, x: Value, low: sp.Expr | None = None, high: sp.Expr | None = None, inplace: bool = False) -> Value:
    """clamp between scalars: saves its input for the gradient's mask; in place (clamp_), the result lives in x's
    storage and autograd saves a clone of x's old value instead."""
    if inplace:
        if x.grad:
            ctx.save(copy(ctx, x))
        return x
    out = ctx.new(x.shape, x.dtype, "clamp", x.grad, _layout_like(x, x.shape))
    if x.grad:
        ctx.save(x)
    return out


def masked_fill(ctx: Context, x: Value, mask: Value, value: sp.Expr | None = None) -> Value:
    """x.masked_fill(mask, value): saves the mask for the gradient."""
    out = ctx.new(broadcast(ctx, x.shape, mask.shape), x.dtype, "masked_fill", x.grad)
    if x.grad:
        ctx.save(mask)
    return out


def max_dim(ctx: Context, x: Value, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    """x.max(dim): values and int64 indices; saves the indices for the gradient."""
    dim = dim % len(x.shape)
    shape = tuple(ONE if i == dim else n for i, n in enumerate(x.shape) if keepdim or i != dim)
    values, indices = ctx.new(shape, x.dtype, "max", x.grad), ctx.new(shape, "int64", "max indices", False)
    if x.grad:
        ctx.save(indices)
    return values, indices


def amax(ctx: Context, x: Value, dim: int = -1, keepdim: bool = False) -> Value:
    """x.amax(dim): the largest values; saves its input and result (the gradient goes where they are equal)."""
    out = reduce(ctx, x, dim, keepdim, "amax")
    if x.grad:
        ctx.save(x, out)
    return out


def std(ctx: Context, x: Value, dim: int = -1, keepdim: bool = False) -> Value:
    """x.std(dim), any correction: saves its input and result (std_backward)."""
    out = reduce(ctx, x, dim, keepdim, "std")
    if x.grad:
        ctx.save(x, out)
    return out


def gather(ctx: Context, x: Value, dim: int, idx: Value) -> Value:
    """torch.gather: values of x at the indices along `dim`, in the indices' shape; saves x and the indices (measured)."""
    out = ctx.new(idx.shape, x.dtype, "gather", x.grad)
    if x.grad:
        ctx.save(idx, x)
    return out


def scatter(ctx: Context, x: Value, dim: int, idx: Value, src: Value | sp.Expr | None = None) -> Value:
    """x.scatter(dim, idx, src or a scalar): saves the indices."""
    grad = x.grad or (isinstance(src, Value) and src.grad)
    out = ctx.new(x.shape, x.dtype, "scatter", grad)
    if grad:
        ctx.save(idx)
    return out


def scatter_(ctx: Context, x: Value, dim: int, idx: Value, src: Value | sp.Expr | None = None) -> Value:
    """x.scatter_(dim, idx, src or a scalar): the result lives in x's storage; saves the indices."""
    grad = x.grad or (isinstance(src, Value) and src.grad)
    if grad:
        ctx.save(idx)
    return replace(x, grad=grad)


def scatter_reduce(ctx: Context, x: Value, dim: int, idx: Value, src: Value, reduce: str = "sum") -> Value:
    """x.scatter_reduce(dim, idx, src, reduce): src's entries reduced into a copy of x at the indices. One backward
    formula serves x and src (scatter_reduce_backward, derivatives.yaml), reading x, the indices, src and the result:
    it saves all four, whichever of x and src needs the gradient (measured with amax into zeros that need none)."""
    grad = x.grad or src.grad
    out = ctx.new(x.shape, x.dtype, f"scatter_reduce {reduce}", grad)
    if grad:
        ctx.save(x, idx, src, out)
    return out


def save_for_backward(ctx: Context, *values: Value) -> None:
    """A custom autograd Function's ctx.save_for_backward: keeps these tensors (its forward runs without autograd)."""
    ctx.save(*values)


def repeat(ctx: Context, x: Value, *times: sp.Expr) -> Value:
    """Tensor.repeat: x tiled `times` along each dimension (leading ones added); nothing saved (its gradient sums)."""
    sizes = (ONE,) * (len(times) - len(x.shape)) + x.shape
    return ctx.new(tuple(n * t for n, t in zip(sizes, times)), x.dtype, "repeat", x.grad)


def repeat_interleave(ctx: Context, x: Value, times: sp.Expr, dim: int) -> Value:
    """torch.repeat_interleave by a number: each entry along `dim` `times` times; nothing saved (its gradient sums)."""
    dim = dim % len(x.shape)
    return ctx.new(x.shape[:dim] + (x.shape[dim] * times,) + x.shape[dim + 1:], x.dtype, "repeat_interleave", x.grad)


def compare(ctx: Context, a: Value | sp.Expr, b: Value | sp.Expr) -> Value:
    """An elementwise comparison (x > 0): a boolean tensor of the broadcast shape, no gradient, nothing saved."""
    shape = broadcast(ctx, *(v.shape for v in (a, b) if isinstance(v, Value)))
    return ctx.new(shape, "bool", "compare", False)


def extremum(ctx: Context, op: str, a: Value, b: Value) -> Value:
    """torch.minimum / torch.maximum of two tensors: saves both (the gradient goes where each is the extremum)."""
    shape = broadcast(ctx, a.shape, b.shape)
    lead = a if a.shape == shape else b
    out = ctx.new(shape, result_type(a, b), op, a.grad or b.grad, _layout_like(lead, shape))
    if a.grad or b.grad:
        ctx.save(a, b)
    return out


def view_as_complex(ctx: Context, x: Value) -> Value:
    """torch.view_as_complex: pairs of fp32 as complex64 over the same storage (the last dimension, of 2, dropped)."""
    if x.dtype != "fp32" or x.shape[-1] != 2:
        raise SymparamError(f"view_as_complex needs fp32 pairs, not {x.dtype} {list(x.shape)}")
    return replace(x, shape=x.shape[:-1], strides=tuple(s / 2 for s in x.strides[:-1]), dtype="complex64")


def view_as_real(ctx: Context, x: Value) -> Value:
    """torch.view_as_real: complex64 as pairs of fp32 over the same storage."""
    return replace(x, shape=x.shape + (sp.Integer(2),), strides=tuple(s * 2 for s in x.strides) + (ONE,), dtype="fp32")



def pad_dim(ctx: Context, x: Value, dim: int, left: sp.Expr, right: sp.Expr) -> Value:
    """torch.nn.functional.pad of one dimension (constant): a new tensor in the memory format PyTorch suggests for the
    input (channels-last where a 4-D input is laid out so), nothing saved."""
    dim = dim % len(x.shape)
    shape = x.shape[:dim] + (x.shape[dim] + left + right,) + x.shape[dim + 1:]
    channels_last = len(shape) == 4 and _stride_order(x) == [1, 3, 2, 0]
    return ctx.new(shape, x.dtype, "pad", x.grad, _dense_in_order(shape, [0, 2, 3, 1]) if channels_last else None)


def _stride_order(x: Value) -> list[int]:
    """The dimensions of size other than 1 from the smallest stride to the largest."""
    dims = [i for i, n in enumerate(x.shape) if n != 1]
    return sorted(dims, key=lambda i: (_rank(x.strides[i]), -i))


def _dense_in_order(shape: tuple[sp.Expr, ...], outer_to_inner: list[int]) -> tuple[sp.Expr, ...]:
    """Dense strides laying the dimensions out from the outermost to the innermost in the given order."""
    strides, step = [ONE] * len(shape), ONE
    for i in reversed(outer_to_inner):
        strides[i] = step
        step = step * shape[i]
    return tuple(strides)


def einsum(ctx: Context, equation: str, a: Value, b: Value) -> Value:
    """torch.einsum of two operands as aten computes it (no ellipsis, no repeated label): each operand permuted to the
    output's labels then the contracted ones (A-Z, then a-z), size-1 dimensions added for labels it lacks; dimensions
    only one operand has and the output does not are summed away first; then sumproduct_pair. The result is a view."""
    lhs, rhs = equation.replace(" ", "").split("->")
    names = lhs.split(",")
    if len(names) != 2 or any(len(set(n)) != len(n) for n in names) or "." in equation:
        raise SymparamError(f"einsum {equation!r}: two operands without ellipsis or repeated labels are described")
    out = list(rhs)
    labels = out + sorted({c for n in names for c in n} - set(out), key=lambda c: (c.islower(), c))
    aligned = [_align(ctx, v, n, labels) for v, n in zip((a, b), names)]
    counts = [sum(1 for v in aligned if not ctx.unit(v.shape[d])) for d in range(len(labels))]
    left, right = aligned
    summed, only_left, only_right = [], [], []
    for d in range(len(out), len(labels)):
        big_l, big_r = not ctx.unit(left.shape[d]), not ctx.unit(right.shape[d])
        if big_l and big_r:
            summed.append(d)
        elif counts[d] == 1:
            (only_left if big_l else only_right).append(d)
    if only_left:
        left = reduce(ctx, left, only_left, True, "sum")
    if only_right:
        right = reduce(ctx, right, only_right, True, "sum")
    result = _sumproduct_pair(ctx, left, right, summed)
    return view(ctx, result, result.shape[:len(out)]) if len(labels) > len(out) else result


def _align(ctx: Context, x: Value, names: str, labels: list[str]) -> Value:
    """An einsum operand as a view over every label, in the order of `labels` (size 1 where it lacks one)."""
    if len(names) != len(x.shape):
        raise SymparamError(f"einsum: {names!r} names {len(names)} dimensions of a tensor with {len(x.shape)}")
    order, extra = [], len(names)
    for label in labels:
        if label in names:
            order.append(names.index(label))
        else:
            x = unsqueeze(ctx, x, len(x.shape))
            order.append(extra)
            extra += 1
    return permute(ctx, x, *order)


def _sumproduct_pair(ctx: Context, left: Value, right: Value, summed: list[int]) -> Value:
    """aten's sumproduct_pair: (left * right).sum(summed) as permute, reshape to [lro, lo, sum] and [lro, sum, ro]
    (a copy where no view can), bmm (saves each operand for the other's gradient), and a view back."""
    if not summed:
        return binary(ctx, "mul", left, right)
    lro, lo, ro = [], [], []
    sum_size = ONE
    for i in range(len(left.shape)):
        big_l, big_r = not ctx.unit(left.shape[i]), not ctx.unit(right.shape[i])
        if i in summed:
            if big_l and big_r:
                sum_size = sum_size * left.shape[i]
            elif big_l:
                left = reduce(ctx, left, i, True, "sum")
            elif big_r:
                right = reduce(ctx, right, i, True, "sum")
        elif big_l == big_r:  # aten puts a dimension of size 1 in both with ro; lro keeps a symbolic 1 (B = 1) on both sides
            lro.append(i)
        elif big_l:
            lo.append(i)
        else:
            ro.append(i)
    left = replace(left, shape=tuple(ONE if i in ro + summed and not big else n for i, (n, big) in enumerate((n, not ctx.unit(n)) for n in left.shape)))
    right = replace(right, shape=tuple(ONE if i in lo + summed and not big else n for i, (n, big) in enumerate((n, not ctx.unit(n)) for n in right.shape)))
    size = lambda x, dims: sp.Mul(*(x.shape[d] for d in dims))  # noqa: E731
    out_size = [left.shape[d] for d in lro + lo] + [ONE] * len(summed) + [right.shape[d] for d in ro]
    order = lro + lo + summed + ro
    l3 = view(ctx, permute(ctx, left, *(lro + lo + summed + ro)), (size(left, lro), size(left, lo), sum_size), copy_if_needed=True)
    r3 = view(ctx, permute(ctx, right, *(lro + summed + ro + lo)), (size(left, lro), sum_size, size(right, ro)), copy_if_needed=True)
    out = ctx.new((l3.shape[0], l3.shape[1], r3.shape[2]), promote(left.dtype, right.dtype), "bmm", left.grad or right.grad)
    ctx.save(r3 if left.grad else None, l3 if right.grad else None)
    return permute(ctx, view(ctx, out, out_size), *(order.index(i) for i in range(len(order))))


__all__ = ["BYTES", "Storage", "Value", "Context", "Op", "Step", "dense", "promote", "broadcast"]
