"""Memory: weight bytes by dtype, the KV cache for S tokens x B sequences, and training memory; the layer above the model, below the CLI."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

import sympy as sp

from symparam.context import holders, substitution
from symparam.errors import SymparamError
from symparam.figures import decimal
from symparam.model import Model
from symparam.symbols import B, S, W, b, evaluate, make


@dataclass(frozen=True)
class Train:
    """How a training step runs: the optimizer convention (conventions/optimizers.toml), attention backend, checkpointing."""

    optimizer: str = "adamw"
    attention: str = "sdpa"
    checkpointing: str = "none"


TRAIN_DTYPES = ("bf16", "fp32", "fp16")  # what a model can run a training step in


@dataclass(frozen=True)
class DType:
    """A storage format: bytes per value (exact, 1/2 for int4) and what the figure leaves out."""

    name: str
    bytes: sp.Rational  # bytes per stored value
    note: str  # scales, packing: what a real checkpoint adds


DTYPES: dict[str, DType] = {
    t.name: t
    for t in (
        DType("fp32", sp.Integer(4), "IEEE single precision"),
        DType("bf16", sp.Integer(2), "bfloat16, the usual checkpoint format"),
        DType("fp16", sp.Integer(2), "IEEE half precision"),
        DType("fp8", sp.Integer(1), "8-bit float (e4m3); scales not included: DeepSeek-V3's checkpoint adds one fp32 scale per 128x128 block (4 bytes per 16,384 weights, +0.02%), and keeps embeddings, norms and the head in bf16"),
        DType("int8", sp.Integer(1), "8-bit integer; per-channel or per-group scales not included (one fp16 scale per row of d adds 2/d bytes per weight)"),
        DType("int4", sp.Rational(1, 2), "4-bit integer, two weights per byte; group scales not included: one fp16 scale per group of 128 weights adds 2/128 byte per weight (+3.1%), 32-weight groups or zero-points add more"),
    )
}

GB, GiB = 10**9, 2**30


def dtype(name: str) -> DType:
    if name not in DTYPES:
        raise SymparamError(f"--dtype: unknown {name!r}; known: {', '.join(DTYPES)}")
    return DTYPES[name]


def kv_values(model: Model) -> sp.Expr:
    """Values the KV cache holds for B sequences of S tokens: per module, values per token times positions kept."""
    return B * sp.Add(*(sp.sympify(h.fact["per_token"]) * h.positions() for h in holders(model, "cache")))


def kv_cache(model: Model) -> sp.Expr:
    """KV cache bytes for B sequences of S tokens, b bytes per value."""
    return kv_values(model) * b


def state_values(model: Model) -> sp.Expr:
    """Values of the fixed-size states (linear attention, SSM, convolution windows) for B sequences, whatever S."""
    return B * sp.Add(*(sp.sympify(h.fact["size"]) * h.copies for h in holders(model, "state")))


def weights(model: Model) -> sp.Expr:
    """Weight bytes: every parameter (tied ones once) times b bytes."""
    return model.total * b


def whole_bytes(count: int, per_value: sp.Rational) -> int:
    """Bytes for `count` stored values; half bytes (odd int4 counts) round up to a whole byte."""
    return int(sp.ceiling(count * per_value))


def sizes(n_bytes: int) -> dict[str, Any]:
    """Bytes with both units, labelled: GB = 10^9 bytes, GiB = 2^30 bytes."""
    return {"bytes": n_bytes, "GB": float(f"{n_bytes / GB:.6g}"), "GiB": float(f"{n_bytes / GiB:.6g}")}


def report(model: Model, dtype_name: str = "bf16", seq: int | None = None, batch: int = 1, quant: str | None = None,
           train: Train | None = None, parallel: Any = None) -> dict[str, Any]:
    """Every memory figure of a configured model, with its formula; `seq` defaults to the model's maximum context. The
    weights are the checkpoint's stored layout where the config carries a quantization_config or `quant` names a
    format (storage.py), else the parameters times the dtype's bytes. With a `parallel` layout (sharding.Layout), what
    each kind of GPU holds."""
    from symparam.memory import storage

    t = dtype(dtype_name)
    subs = substitution(model, seq, batch)
    seq = int(subs[S])
    parameters = model.count().total

    def exact(expr: sp.Expr) -> int:
        return evaluate(expr, subs, f"{model.name}: {expr}")

    caches = holders(model, "cache")
    parts = [{"module": h.path, "layers": exact(h.copies), "per_token_per_layer_values": exact(sp.sympify(h.fact["per_token"])),
              "sliding_layers": exact(h.windowed), "what": h.fact.get("what", "")} for h in caches]
    sliding = sum(p["sliding_layers"] for p in parts)
    kv = {
        **sizes(whole_bytes(exact(kv_values(model)), t.bytes)),
        "formula": str(kv_cache(model)),
        "per_token_per_layer_values": parts[0]["per_token_per_layer_values"] if len({p["per_token_per_layer_values"] for p in parts}) == 1 else None,
        "what": "; ".join(dict.fromkeys(p["what"] for p in parts)),
        "sliding_layers": sliding,
        "window": int(subs[W]) if sliding else None,
        "parts": parts,
    }
    states = holders(model, "state")
    state = {
        **sizes(whole_bytes(exact(state_values(model)), t.bytes)),
        "formula": str(state_values(model) * b),
        "parts": [{"module": h.path, "layers": exact(h.copies), "per_sequence_per_layer_values": exact(sp.sympify(h.fact["size"])), "what": h.fact.get("what", "")} for h in states],
    }
    weight = {**sizes(whole_bytes(parameters, t.bytes)), "formula": "parameters*b", "note": t.note}
    layout = storage.layout(model, quant)
    stored = layout.report(model.values or {}) if layout is not None else None
    if stored is not None:
        weight = {**sizes(stored["bytes"]), "formula": stored["formula"], "note": f"as the checkpoint stores them: {stored['title']} (read from {stored['source']})"}
    return {
        "name": model.name,
        "family": model.recipe.family,
        "dtype": t.name,
        "bytes_per_value": str(t.bytes),
        "parameters": parameters,
        "seq": seq,
        "batch": batch,
        "weights_bytes": weight["bytes"],
        "kv_cache_bytes": kv["bytes"],
        "state_bytes": state["bytes"],
        "weights": weight,
        "kv_cache": kv,
        "state": state,
        "stored": stored,
        **(step_report(model, t.name, subs, train, layout) if train is not None else {}),
        **({"per_rank": rank_report(model, parallel, t.name, subs, train, quant)} if parallel is not None else {}),
        "units": "GB = 10^9 bytes, GiB = 2^30 bytes",
    }


def step_report(model: Model, dtype_name: str, subs: dict, train: Train, layout: Any = None) -> dict[str, Any]:
    """The training step's figures (training.py): activations per module, the terms, and the peak, each with its formula.
    With LoRA and a stored layout (--quant nf4: QLoRA), the frozen base is held in that format."""
    from symparam.memory.activations import CHECKPOINTING, routed
    from symparam.memory.trace import Mode
    from symparam.memory.training import optimizer, training

    if dtype_name not in TRAIN_DTYPES:
        raise SymparamError(f"--dtype: a training step runs in {', '.join(TRAIN_DTYPES)}, not {dtype_name}")
    if train.attention not in ("sdpa", "eager"):
        raise SymparamError(f"--attention: unknown {train.attention!r}; known: sdpa, eager")
    from symparam.memory.lora import adapted, trainable as adapter

    opt = optimizer(train.optimizer)
    lora = bool(adapted(model))
    mode = Mode(act=dtype_name, attention=train.attention, trainable=adapter if lora else None)
    if layout is not None and not lora:
        raise SymparamError("--quant: a training step updates every weight in its own dtype; a quantized base trains only with adapters (--lora R: QLoRA)")
    held = layout.resident if layout is not None else None
    step = training(model, opt, mode, train.checkpointing, {B: subs[B], S: subs[S]}, held)

    def exact(expr: sp.Expr) -> int:
        return evaluate(expr, subs, f"{model.name}: {expr}")

    a = step.activations
    mode = (f"{step.act} weights and activations, attn_implementation={train.attention}, use_cache={'off' if train.checkpointing != 'none' else bool(model.config.get('use_cache'))}"
            + ("; LoRA: only the adapters train (float32, peft's autocast_adapter_dtype), the base frozen" if lora else "")
            + (f" and held as {layout.title} (bitsandbytes' 4-bit matmul keeps only its packed weight for backward)" if layout is not None else ""))
    activations = {
        **sizes(exact(a.formula)),
        "formula": str(a.formula),
        "by_layer_kind": a.grouped,
        "convention": f"bytes autograd keeps for backward in one training forward with the loss (transformers' implementation, {mode}): "
                      f"each storage once, parameters excluded, fp32 upcasts (norms, softmax, the loss's fp32 logits) included; {CHECKPOINTING[train.checkpointing]}",
        "assumes": [str(c) for c in step.assumed],
        "kernels": [{"module": m, "note": n} for m, n in a.kernels],
        "routing": [{"symbol": s.name, "meaning": s.meaning, "value": exact(make(s.name)), "rule": s.routing} for s in routed(model, a.formula)],
        "parts": [{"module": p.module, "layers": exact(p.layers), "bytes": exact(p.total), "per_layer_bytes": exact(p.bytes),
                   "formula": str(p.total)} for p in a.parts if exact(p.total)],
    }
    peak_name, peak_bytes, peak_formula = step.peak(subs)
    terms = {"weights": step.weights, "gradients": step.gradients, "optimizer_states": step.states, "activations": a.formula, "loss_peak": step.loss_peak}
    total = step.weights + step.gradients + step.states + a.formula
    return {
        "activations": activations,
        "training": {
            **sizes(exact(total)),
            "formula": str(sp.expand(total)),
            "peak_bytes": peak_bytes,
            "peak_at": peak_name,
            "peak_formula": str(peak_formula),
            "convention": f"{opt.title} ({opt.source}); {mode}; a step from the second on: forward, backward, optimizer.step(), "
                          "zero_grad(set_to_none=True), the outputs dropped; live bytes are tensor storages (non-persistent buffers, "
                          "the CUDA context and the allocator's cache left out)",
            "parts": {name: {**sizes(exact(e)), "formula": str(e)} for name, e in terms.items()},
            "moments": [{"at": name, **sizes(exact(e)), "formula": str(e), "live": what} for name, e, what in step.moments],
            "optimizer": opt.name,
        },
    }


LABEL = 18  # width of a row's label


def row(label: str, part: dict[str, Any]) -> str:
    """A labelled figure: bytes, GB (10^9) and GiB (2^30)."""
    return f"{label:<{LABEL}} {part['bytes']:>20,} bytes  {decimal(Fraction(part['bytes'], GB), 3):>10} GB  {decimal(Fraction(part['bytes'], GiB), 3):>10} GiB"


def rank_report(model: Model, layout: Any, dtype_name: str, subs: dict, train: Train | None, quant: str | None) -> dict[str, Any]:
    """What each kind of GPU holds under a parallel layout (sharding.py)."""
    from symparam.memory import sharding

    if train is not None and dtype_name not in TRAIN_DTYPES:
        raise SymparamError(f"--dtype: a training step runs in {', '.join(TRAIN_DTYPES)}, not {dtype_name}")
    return sharding.as_dict(sharding.per_rank(model, layout, dtype_name, {B: subs[B], S: subs[S]}, train, quant))


def text(r: dict[str, Any]) -> str:
    """The report as a few labelled lines (bytes, GB = 10^9, GiB = 2^30), formulas included."""
    pad = " " * (LABEL + 1)
    kv = r["kv_cache"]
    window = f"; {kv['sliding_layers']} of the layers keep at most W = {kv['window']:,} tokens" if kv["window"] else ""
    lines = [
        f"{r['name']} ({r['family']}): {r['parameters']:,} parameters, {r['dtype']} = {r['bytes_per_value']} byte(s) per value",
        row("weights", r["weights"]) + ("    = parameters * b" if r["stored"] is None else ""),
        f"{pad}{r['weights']['note']}",
        *(stored_lines(r["stored"]) if r["stored"] is not None else []),
        row("KV cache", kv) + f"    = {kv['formula']}",
        *[f"{pad}{p['layers']:,} layers ({p['module']}): {p['per_token_per_layer_values']:,} values per token per layer ({p['what']})" for p in kv["parts"]],
        f"{pad}grows with S = {r['seq']:,} tokens, B = {r['batch']} sequence(s){window}",
        *([row("state", r["state"]) + f"    = {r['state']['formula']}"] + [f"{pad}{p['layers']:,} layers ({p['module']}): {p['per_sequence_per_layer_values']:,} values per sequence per layer, whatever S ({p['what']})" for p in r["state"]["parts"]] if r["state"]["parts"] else []),
        *(step_lines(r) if "training" in r else [f"{pad}(a training step, activations included: --train --seq S --batch B)"]),
        *(rank_lines(r, row) if "per_rank" in r else []),
        "units: GB = 10^9 bytes, GiB = 2^30 bytes",
    ]
    return "\n".join(lines)


def step_lines(r: dict[str, Any]) -> list[str]:
    """The training step in labelled lines: activations per module, the terms, the sum, the moments and the peak."""
    pad = " " * (LABEL + 1)
    a, t = r["activations"], r["training"]
    lines = [f"training step: S = {r['seq']:,} tokens, B = {r['batch']:,} sequence(s); {t['convention']}",
             row("  activations", a) + f"    = {a['by_layer_kind']}", f"{pad}{a['convention']}"]
    lines += [f"{pad}valid where {', '.join(a['assumes'])}"] if a["assumes"] else []
    width = max((len(p["module"] or "(loss)") for p in a["parts"]), default=0)
    lines += [f"{pad}{p['module'] or '(loss)':<{width}} {p['bytes']:>18,}" + (f"  = {p['layers']:,} layers x {p['per_layer_bytes']:,}" if p["layers"] != 1 else "")
              for p in a["parts"]]
    lines += [f"{pad}{k['module']}: {k['note']}" for k in a["kernels"]]
    lines += [f"{pad}{x['symbol']} = {x['value']:,}: {x['meaning']}; the figure takes {x['rule']}, its largest (the most the step can "
              f"keep); the formula holds for any routing with the batch's own value (--set {x['symbol']}=...)" for x in a["routing"]]
    for name, label in (("weights", "weights"), ("gradients", "gradients"), ("optimizer_states", "optimizer states")):
        lines.append(row(f"  {label}", t["parts"][name]) + f"    = {t['parts'][name]['formula']}")
    lines.append(row("  sum", t) + "    = weights + gradients + optimizer states + activations")
    lines.append(row("  loss peak", t["parts"]["loss_peak"]) + f"    = {t['parts']['loss_peak']['formula']}  (fp32 gradients of the loss head, at the start of backward)")
    lines.append(row("  peak", {"bytes": t["peak_bytes"]}) + f"    at: {t['peak_at']} = {t['peak_formula']}")
    lines += [f"{pad}{m['at']}: {m['bytes']:,} ({m['live']})" for m in t["moments"]]
    return lines


def rank_lines(r: dict[str, Any], row: Any) -> list[str]:
    from symparam.memory.sharding import text_lines

    return text_lines(r["per_rank"], row)


def stored_lines(stored: dict[str, Any]) -> list[str]:
    """The stored layout in a few lines: its rule per matrix, its total as a formula, what is kept and what is extra."""
    pad = " " * 11
    lines = [f"{pad}{stored['tensor_count']:,} tensors; per packed matrix [d_out, d_in]: {stored['per_matrix']} bytes"] if stored["per_matrix"] else []
    lines.append(f"{pad}= {stored['formula']}")
    lines += [f"{pad}kept as they are: {', '.join(k['tensors'])}: {k['why']}" for k in stored["kept"]]
    extras = {t["extra"]: 0 for t in stored["tensors"] if "extra" in t}
    for t in stored["tensors"]:
        if "extra" in t:
            extras[t["extra"]] += t["bytes"]
    lines += [f"{pad}of which {n:,} bytes: {what}" for what, n in extras.items()]
    lines += [f"{pad}note: {n}" for n in stored["notes"]]
    return lines


__all__ = ["DTYPES", "TRAIN_DTYPES", "Train", "kv_values", "kv_cache", "state_values", "weights", "report", "sizes", "whole_bytes", "text"]
