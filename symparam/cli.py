"""The `symparam` command: parse arguments, call the library, print text or JSON; errors exit 2 in one line."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

import sympy as sp

from symparam.config import Note, Source, read_as, read_config, resolve, unwrap
from symparam.errors import SymparamError
from symparam.files import reason, shown, write_atomic
from symparam.hub import REVISION, check_url, read_model
from symparam.model import Model
from symparam.recipes import REGISTRY, Recipe, load_recipe


def add_source(parser: argparse.ArgumentParser) -> None:
    """The ways to name a model: a preset, a config.json, a family, or a recipe file, plus --set."""
    group = parser.add_argument_group("model")
    group.add_argument("--model", metavar="NAME", help="a built-in preset or its Hub id (see `symparam list`), or any Hub id ORG/NAME: "
                       "its config.json from the local Hugging Face cache, else from the Hub (pip install 'symparam[hub]')")
    group.add_argument("--revision", metavar="REV", help="a branch, tag or commit of the --model Hub id (default main; the Hub's config, not the preset)")
    group.add_argument("--config", metavar="FILE", help="a Hugging Face config.json")
    group.add_argument("--arch", metavar="ARCH", help="a family, e.g. qwen3-moe; values from --set")
    group.add_argument("--recipe", metavar="FILE", help="a recipe TOML file describing a new architecture")
    group.add_argument("--as", metavar="FAMILY", dest="read_as", help="read the config (a wrapper's language model) as this family, "
                       "whatever its model_type says; the output says so")
    group.add_argument("--set", metavar="SYMBOL=INT", nargs="+", default=[], dest="sets", help="symbol values, e.g. d=4096 N=36")


def parse_sets(items: list[str]) -> dict[str, int]:
    """`--set d=4096 N=36` as {"d": 4096, "N": 36}; non-integers are errors (resolve refuses symbols the family lacks)."""
    values = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep:
            raise SymparamError(f"--set {shown(item)}: expected SYMBOL=INT")
        try:
            values[name] = int(text.replace("_", ""))
        except ValueError:
            raise SymparamError(f"--set {shown(name)}: expected an integer of at most 4,300 digits, got {shown(repr(text))}") from None
    return values


class Named(NamedTuple):
    """What source() returns: the config, the recipe the options force, a title, where the config came from, and how
    --as read it."""

    raw: dict
    recipe: Recipe | None
    name: str
    origin: Source | None
    read_as: Note | None = None


def source(args: argparse.Namespace) -> Named:
    """The config the options name ({} for --arch or --recipe alone), the recipe they force, a title, and where the config came from."""
    if args.model and args.config:
        raise SymparamError("give only one of --model and --config")
    if args.revision and not args.model:
        raise SymparamError("--revision: names a revision of a Hub id; give --model ORG/NAME")
    if args.read_as and (args.arch or args.recipe):
        raise SymparamError("--as: give it with --model or --config, not with --arch or --recipe")
    recipe = load_recipe(args.recipe) if args.recipe else REGISTRY.family(args.arch) if args.arch else None
    if args.model:
        raw, name, origin = read_model(args.model, args.revision)
    elif args.config:
        raw, name, origin = read_config(args.config), args.config, Source("file", path=args.config)
    elif args.read_as:
        raise SymparamError("--as: reads a config as a family; give --model NAME or --config FILE")
    elif recipe is None:
        raise SymparamError("name a model: --model NAME, --config FILE, --arch ARCH or --recipe FILE")
    else:
        return Named({}, recipe, recipe.title, None)
    if args.read_as:
        if args.read_as.replace("-", "_") not in REGISTRY.by_family:
            raise SymparamError(f"--as: unknown family {args.read_as!r}; `symparam list` shows the {len(REGISTRY.by_family)} families")
        recipe = REGISTRY.family(args.read_as)
        raw, note = read_as(raw, recipe)
        return Named(raw, recipe, name, origin, note)
    return Named(raw, recipe, name, origin)


def model_from(args: argparse.Namespace, named: Named | None = None) -> Model:
    """The Model that the source options name (or `named`, their source() already read), with its values."""
    raw, recipe, name, origin, note = named or source(args)
    resolved = resolve(raw, recipe, parse_sets(args.sets), name, origin)
    if note is not None:  # --as: said in text (a note) and JSON (read_as)
        resolved = replace(resolved, notes=resolved.notes + (note,), scope={**resolved.scope, "read_as": recipe.family})
    return Model.from_resolved(resolved)


def formula(expr: sp.Expr) -> str:
    """A component's formula as one line, written by layer kind as the derivation writes it."""
    from symparam.render import text

    return text(expr)


def add_lora(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("LoRA (as peft applies it)")
    group.add_argument("--lora", type=int, metavar="R", help="LoRA adapters of rank R: the base frozen, only the adapters train")
    group.add_argument("--lora-targets", metavar="NAMES", help="modules to adapt: q_proj,v_proj (peft's default for Llama-like models) or all-linear")
    group.add_argument("--lora-alpha", type=int, default=8, metavar="A", help="peft's lora_alpha (default 8): the scaling alpha/r")
    group.add_argument("--dora", action="store_true", help="DoRA: a magnitude vector per adapted module")


def lora_from(args: argparse.Namespace, model: Model) -> Model:
    """The model with the adapters --lora asks for (as peft's get_peft_model adds them), or as it is."""
    if args.lora is None:
        for option, value in (("--lora-targets", args.lora_targets), ("--dora", args.dora or None)):
            if value is not None:
                raise SymparamError(f"{option}: describes LoRA adapters; add --lora R")
        return model
    from symparam.memory.lora import Lora, adapt

    targets = args.lora_targets or "q_proj,v_proj"
    names = "all-linear" if targets == "all-linear" else tuple(t for t in targets.split(",") if t)
    return adapt(model, Lora(args.lora, names, args.dora, args.lora_alpha))


def trainable_report(model: Model) -> dict:
    """What --lora trains: the adapters' parameters, their formula, where they sit, and peft's convention."""
    from symparam.figures import percent
    from symparam.memory.lora import adapted, trainable_parameters
    from symparam.symbols import evaluate

    formula = trainable_parameters(model)
    n = evaluate(formula, model.substitution())
    return {"count": n, "formula": str(formula), "share": percent(n, model.count().total), "adapted": adapted(model),
            "convention": "peft 0.21 get_peft_model: lora_A [r, d_in] and lora_B [d_out, r] per adapted module (DoRA adds a "
                          "magnitude [d_out]), fused experts and routers of converted MoE types adapted per parameter at "
                          "[experts*r, in] and [out, experts*r] (rank 2r where two projections were fused), kept in float32"}


def cmd_count(args: argparse.Namespace) -> str:
    from symparam.derive import grouped
    from symparam.figures import percent, scaled

    from symparam.render import note

    model = lora_from(args, model_from(args))
    count = model.count()
    notes = [note(key, fields) for key, fields in model.notes]
    stored, extras = as_stored(model, args.quant)
    if args.json:
        origin = model.source.as_dict() if model.source else None
        payload = {"name": model.name, "family": model.recipe.family, **model.scope, "source": origin, "notes": notes, **count.as_dict()}
        payload["formulas"] = {"total": str(model.total), "active": str(model.active), **{c: str(e) for c, e in model.components.items()}}
        payload["checkpoint_extras"] = extras
        payload["stored"] = stored
        if args.lora is not None:
            payload["trainable_parameters"] = trainable_report(model)
        return json.dumps(payload, indent=2)
    moe = count.active != count.total
    figures = [("total", count.total, "")]
    if moe:
        figures.append(("active", count.active, "; one token's share of the routed experts"))
    figures.append(("active without input embedding", count.active_without_embedding, "; as vendors often quote"))
    title = model.name if model.name == model.recipe.title else f"{model.name} ({model.recipe.title})"
    unknown = f"unknown (without {', '.join(model.unknown.values())})"
    lines = [title] + notes + [f"{label:<31}{n:>19,}  ({scaled(n)}{why})" if n is not None else f"{label:<31}{unknown:>19}" for label, n, why in figures]
    if extras:
        more = sum(e["values"] for e in extras)
        lines.append(f"{'stored in the checkpoint':<31}{more:>19,}  more values ({scaled(more)}), not parameters transformers builds:")
        lines += [f"  {e['values']:,}: {e['what']}" for e in extras]
    if stored is not None:
        lines.append(f"{'stored as':<31}{stored['bytes']:>19,}  bytes ({stored['title']}, from {stored['source']}: "
                     f"{stored['tensor_count']:,} tensors; `symparam memory` lists them)")
    if args.lora is not None:
        t = trainable_report(model)
        lines.append(f"{'trainable (LoRA adapters)':<31}{t['count']:>19,}  ({scaled(t['count'])}; {t['share']}% of the total) = {t['formula']}")
        lines.append(f"  {t['convention']}; adapted: {', '.join(t['adapted'])}")
    tied = " (tied: stored once, in the input embedding)" if model.flags.get("tied") else ""
    shown = lambda n: "unknown" if n is None else f"{n:,}"  # noqa: E731
    rows = [(c + (tied if c == "LM head" else ""), formula(grouped(model.tree, bucket=c)), f"{n:,}", f"{percent(n, count.total)}%", shown(count.active_components[c])) for c, n in count.components.items()]
    header = ("component", "formula", "parameters", "share") + (("active",) if moe else ())
    table = [header] + [r if moe else r[:4] for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header))]
    lines.append("")
    for r in table:
        lines.append("  ".join(cell.ljust(w) if i < 2 else cell.rjust(w) for i, (cell, w) in enumerate(zip(r, widths))).rstrip())
    return "\n".join(lines)


def as_stored(model: Model, quant: str | None) -> tuple[dict | None, list[dict]]:
    """How the checkpoint stores the model (a format's layout, or None) and what it stores beyond the parameters; the
    storage module is loaded only for a model that has either (the cold `count` of most models does without it)."""
    from symparam.components import leaves

    if quant is None and model.quantization is None and not model.recipe.checkpoint and not any(leaf.buffer for leaf, *_ in leaves(model.tree)):
        return None, []
    from symparam.memory import storage

    layout = storage.layout(model, quant)
    return (layout.report(model.values or {}) if layout is not None else None), storage.checkpoint_extras(model)


def cmd_list(args: argparse.Namespace) -> str:
    from symparam import catalog

    families = [{k: h[k] for k in ("family", "title", "model_types", "summary")} for h in REGISTRY.families()]
    entries = catalog.index()
    if args.json:
        return json.dumps({"families": families, "presets": entries}, indent=2)
    width = max(len(f["family"]) for f in families)
    lines = ["families (--arch), with the config.json model_type values each reads:"]
    lines += [f"  {f['family']:<{width}}  {f['summary']}\n  {'':<{width}}  model_type: {', '.join(f['model_types'])}" for f in families]
    lines += ["", catalog.text(entries)]
    return "\n".join(lines)


def add_memory(parser: argparse.ArgumentParser) -> None:
    from symparam.memory import DTYPES

    add_source(parser)
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="storage format of weights and KV cache (default bf16)")
    add_context(parser)
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="sequences held at once (default 1)")
    add_quant(parser)
    train = parser.add_argument_group("training step")
    train.add_argument("--train", action="store_true", help="a training step: activations, gradients, optimizer states and its peak (--seq and --batch)")
    train.add_argument("--optimizer", default=None, metavar="NAME", help="optimizer convention: adamw (default), adamw-mixed, adamw-megatron, sgd, adafactor, adamw-8bit")
    train.add_argument("--attention", default=None, choices=("sdpa", "eager"), help="attention implementation (default sdpa)")
    train.add_argument("--checkpointing", default=None, choices=("none", "full"), help="activation checkpointing of the decoder layers (default none)")
    add_lora(parser)
    add_layout(parser)


def add_layout(parser: argparse.ArgumentParser) -> None:
    """The parallel layout: degrees and the convention each follows (memory/conventions/layouts.toml)."""
    group = parser.add_argument_group("parallel layout (what each GPU holds)")
    for name, what in (("dp", "data-parallel ranks"), ("tp", "tensor-parallel ranks"), ("pp", "pipeline stages"),
                       ("ep", "expert-parallel ranks (routed experts divided, carved from dp x tp)"), ("cp", "context-parallel ranks")):
        group.add_argument(f"--{name}", type=int, default=None, metavar="N", help=f"{what} (default 1)")
    group.add_argument("--sharding", default=None, metavar="NAME", help="data-parallel convention: ddp (default), zero1, zero2, zero3, fsdp2")
    group.add_argument("--tp-plan", default=None, metavar="NAME", help="tensor-parallel convention: transformers (the model's own plan, default) or megatron")
    group.add_argument("--pp-split", default=None, metavar="NAME", help="pipeline split: torchtitan (default), megatron, megatron-balanced, transformers")
    group.add_argument("--schedule", default=None, metavar="NAME", help="pipeline schedule: 1f1b (default), gpipe, naive")
    group.add_argument("--microbatches", type=int, default=None, metavar="M", help="micro-batches per optimizer step (default: pp)")


def layout_from(args: argparse.Namespace) -> object | None:
    """The Layout the options give, or None where none is given."""
    from symparam.memory.sharding import Layout

    names = ("dp", "tp", "pp", "ep", "cp", "sharding", "tp_plan", "pp_split", "schedule", "microbatches")
    given = {name: getattr(args, name) for name in names if getattr(args, name, None) is not None}
    if not given:
        return None
    return Layout(**given)


def add_quant(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quant", metavar="FORMAT", help="store the weights in a quantization format (fp8-block, mxfp4, nvfp4, gptq-4bit-g128, "
                        "awq-4bit-g128, nf4, int8, ...; none: ignore the config's quantization_config); default: the config's own")


def add_context(parser: argparse.ArgumentParser, required: bool = False) -> None:
    default = "" if required else " (default: the model's maximum context)"
    parser.add_argument("--seq", type=int, default=None, required=required, metavar="S", help=f"tokens in context{default}")


def add_plot(parser: argparse.ArgumentParser) -> None:
    add_source(parser)
    parser.add_argument("--family", metavar="NAME", help="compare the published sizes of a series (qwen3: dense and MoE) or the presets of a family")
    parser.add_argument("-o", "--output", required=True, metavar="FILE", help="FILE.png, FILE.svg or FILE.pdf")


def cmd_memory(args: argparse.Namespace) -> str:
    from symparam import memory

    options = {"--optimizer": args.optimizer, "--attention": args.attention, "--checkpointing": args.checkpointing}
    given = [name for name, value in options.items() if value is not None]
    if given and not args.train:
        raise SymparamError(f"{given[0]}: describes a training step; add --train")
    if args.train and args.seq is None:
        raise SymparamError("--train: give --seq S (and --batch B): a training step's activations grow with them")
    train = memory.Train(args.optimizer or "adamw", args.attention or "sdpa", args.checkpointing or "none") if args.train else None
    if args.lora is not None and not args.train:
        raise SymparamError("--lora: describes a training step; add --train")
    layout = layout_from(args)
    check_serving(layout, args.train)
    report = memory.report(lora_from(args, model_from(args)), args.dtype, args.seq, args.batch, args.quant, train, layout)
    return json.dumps(report, indent=2) if args.json else memory.text(report)


def add_fit(parser: argparse.ArgumentParser) -> None:
    from symparam.memory import DTYPES

    add_source(parser)
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--serve", action="store_true", help="serving: weights and the KV cache")
    what.add_argument("--train", action="store_true", help="a training step: weights, gradients, optimizer states, activations")
    parser.add_argument("--gpu", metavar="NAME", help="a GPU of conventions/gpus.toml (H100-80GB, H200, B200, A100-80GB, ...)")
    parser.add_argument("--gpu-memory", metavar="SIZE", help="the GPU's memory, e.g. 96GiB (overrides --gpu's)")
    parser.add_argument("--reserve", nargs="+", default=[], metavar="NAME=SIZE", help="set a reserve term: cuda_context, fragmentation, "
                        "communication, workspace (1GiB, 500MB, 5%%)")
    parser.add_argument("--seq", type=int, default=None, metavar="S", help="tokens per sequence (without it: the longest that fits)")
    parser.add_argument("--batch", type=int, default=None, metavar="B", help="sequences at once (without it and with --seq: the largest that fits)")
    parser.add_argument("--dtype", default="bf16", choices=list(DTYPES), help="weights, KV cache and activations (default bf16)")
    add_quant(parser)
    parser.add_argument("--optimizer", default=None, metavar="NAME", help="optimizer convention (default adamw)")
    parser.add_argument("--attention", default=None, choices=("sdpa", "eager"), help="attention implementation (default sdpa)")
    parser.add_argument("--checkpointing", default=None, choices=("none", "full"), help="activation checkpointing (default none)")
    add_layout(parser)


def cmd_fit(args: argparse.Namespace) -> str:
    from symparam import memory
    from symparam.memory import fit

    for name, value in (("--seq", args.seq), ("--batch", args.batch)):
        if value is not None and value < 1:
            raise SymparamError(f"{name}: expected a positive whole number, got {value}")
    options = {"--optimizer": args.optimizer, "--attention": args.attention, "--checkpointing": args.checkpointing}
    given = [name for name, value in options.items() if value is not None]
    if given and not args.train:
        raise SymparamError(f"{given[0]}: describes a training step; use --train")
    device = fit.gpu(args.gpu, args.gpu_memory)
    reserved = fit.reserve(device, args.reserve)
    layout = layout_from(args)
    check_serving(layout, args.train)
    train = memory.Train(args.optimizer or "adamw", args.attention or "sdpa", args.checkpointing or "none") if args.train else None
    if train is not None and args.dtype not in memory.TRAIN_DTYPES:
        raise SymparamError(f"--dtype: a training step runs in {', '.join(memory.TRAIN_DTYPES)}, not {args.dtype}")
    result = fit.fit(model_from(args), device, reserved, layout, args.dtype, args.seq, args.batch, train, args.quant)
    return json.dumps(result, indent=2) if args.json else fit.text(result)


def check_serving(layout: object | None, train: bool) -> None:
    """Options of a layout that describe a training step, given for serving."""
    from symparam.memory.sharding import Layout

    if layout is None or train:
        return
    default = Layout()
    for name in ("sharding", "schedule", "microbatches"):
        if getattr(layout, name) != getattr(default, name):
            raise SymparamError(f"--{name.replace('_', '-')}: describes a training step; add --train")


def cmd_flops(args: argparse.Namespace) -> str:
    from symparam import flops

    report = flops.report(model_from(args), args.seq)
    return json.dumps(report, indent=2) if args.json else flops.text(report)


def add_shapes(parser: argparse.ArgumentParser) -> None:
    add_source(parser)
    add_context(parser, required=True)
    parser.add_argument("--batch", type=int, default=1, metavar="B", help="sequences (default 1)")
    parser.add_argument("--attention", default="eager", choices=("eager", "sdpa"), help="attention written out, scores and all (eager, the default), or sdpa's fused kernel")
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp32", "fp16"), help="the dtype the model runs in (default bf16)")
    parser.add_argument("--train", action="store_true", help="mark the tensors autograd keeps for backward")


def cmd_shapes(args: argparse.Namespace) -> str:
    from symparam import shapes

    model = model_from(args)
    steps = shapes.report(model, args.seq, args.batch, args.attention, args.dtype, args.train)
    if args.json:
        return json.dumps({"name": model.name, "seq": args.seq, "batch": args.batch, "attention": args.attention, "steps": steps}, indent=2)
    return shapes.text(steps)


def cmd_plot(args: argparse.Namespace) -> str:
    from symparam import plot

    if args.family and (args.model or args.config or args.arch or args.recipe):
        raise SymparamError("give --family NAME or a model (--model, --config, ...), not both")
    result = plot.plot_family(args.family, args.output) if args.family else plot.plot_model(model_from(args), args.output)
    return json.dumps(result, indent=2) if args.json else f"wrote {result['output']}"


def config_and_recipe(args: argparse.Namespace) -> tuple[dict, Recipe]:
    """The config the source options name ({} for --arch or --recipe alone) and its recipe (a wrapper's: its language model's)."""
    named = source(args)
    return named.raw, named.recipe or unwrap(named.raw, None)[1]


def add_verify(p: argparse.ArgumentParser) -> None:
    add_source(p)
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--checkpoint", metavar="PATH", help="a .safetensors file, a directory of shards, or a model.safetensors.index.json")
    where.add_argument("--remote", metavar="URL", nargs="?", const="", help="the published checkpoint of the --model Hub id, or the URL of a "
                       ".safetensors file or index: only its headers are read, by HTTP Range requests (pip install 'symparam[hub]')")
    p.add_argument("--dtype", help="bytes per parameter when only an index is given (default: the config's torch_dtype, else bf16)")


def remote_target(url: str, origin: Source | None, revision: str | None) -> tuple[str, str]:
    """What `--remote [URL]` reads, and at which revision: the URL, else the model's Hub id at the commit its config came
    from (so config and weights agree), else at --revision or main."""
    if url:
        return url, revision or REVISION
    if origin is None or not origin.hub:
        raise SymparamError("--remote: this model has no Hub id; give --remote URL of a .safetensors file or index, or --model ORG/NAME")
    return origin.hub, origin.commit or revision or REVISION


def cmd_verify(args: argparse.Namespace) -> tuple[str, int]:
    from symparam import verify
    from symparam.render import note

    if args.remote:
        check_url(args.remote)  # before the config is read, let alone fetched
    named = source(args)
    model = model_from(args, named)
    if args.remote is None:
        report = verify.verify(model, args.checkpoint, args.dtype or verify.config_dtype(named[0]))
    else:
        report = verify.verify_remote(model, *remote_target(args.remote, named[3], args.revision))
    report = replace(report, notes=[note(key, fields) for key, fields in model.notes] + report.notes)
    out = json.dumps(report.as_dict(), indent=2) if args.json else verify.text(report)
    return out, 0 if report.match else 1


def parse_target(text: str) -> int:
    """7e9, 7_000_000_000, 7B or 350M as an integer number of parameters."""
    from decimal import Decimal, InvalidOperation

    from symparam.whatif import MAX_TARGET

    scale = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}.get(text[-1:].upper(), 1)
    try:
        value = Decimal(text[:-1] if scale > 1 else text.replace("_", ""))
    except InvalidOperation:
        raise SymparamError(f"--target: expected a number such as 7e9 or 7B, got {shown(repr(text))}") from None
    if not value.is_finite() or not 0 < value <= Decimal(MAX_TARGET) / scale or value * scale != (value * scale).to_integral_value():
        raise SymparamError(f"--target: expected a whole number of parameters from 1 to {MAX_TARGET:.0e}, got {shown(repr(text))}")
    return int(value * scale)


def add_solve(p: argparse.ArgumentParser) -> None:
    add_source(p)
    p.add_argument("--target", required=True, help="total parameters to aim at, e.g. 7e9 or 7B")
    p.add_argument("--for", dest="symbol", required=True, metavar="SYMBOL", help="the symbol to solve for, e.g. d or N")


def cmd_solve(args: argparse.Namespace) -> str:
    from symparam import whatif

    raw, recipe = config_and_recipe(args)
    sol = whatif.solve(recipe, args.symbol, parse_target(args.target), raw, parse_sets(args.sets))
    return json.dumps(sol.as_dict(), indent=2) if args.json else whatif.solution_text(sol)


def add_sensitivity(p: argparse.ArgumentParser) -> None:
    add_source(p)
    p.add_argument("--for", dest="symbols", nargs="+", metavar="SYMBOL", help="symbols (default: every one the total depends on)")


def cmd_sensitivity(args: argparse.Namespace) -> str:
    from symparam import whatif

    named = source(args)
    model = model_from(args, named)
    formulas = whatif.derived(model.recipe, named[0], parse_sets(args.sets))
    items = whatif.sensitivities(model, formulas, args.symbols)
    return json.dumps([s.as_dict() for s in items], indent=2) if args.json else whatif.sensitivity_text(items, formulas)


def add_sweep(p: argparse.ArgumentParser) -> None:
    add_source(p)
    p.add_argument("--csv", metavar="FILE", help="rows of symbol values, a header of symbol names")
    p.add_argument("--grid", nargs="+", default=[], metavar="SYMBOL=SPEC", help="every combination, e.g. d=1024:8192:512 N=12,24,36")
    p.add_argument("-o", "--output", metavar="FILE", help="write the CSV here instead of printing it")
    p.add_argument("--on-overflow", choices=("fallback", "raise"), default="fallback", help="beyond int64: exact Python integers (default) or an error")


def cmd_sweep(args: argparse.Namespace) -> str:
    from symparam import whatif

    if bool(args.csv) == bool(args.grid):
        raise SymparamError("give one of --csv FILE and --grid SYMBOL=SPEC ...")
    specs = dict(item.partition("=")[::2] for item in args.grid)
    columns = whatif.read_csv(args.csv) if args.csv else whatif.grid(specs)
    raw, recipe = config_and_recipe(args)
    results = whatif.sweep_config(recipe, raw, columns, parse_sets(args.sets), args.on_overflow)  # each row as `count --set` it
    if args.json:
        return json.dumps({**{k: [int(x) for x in v] for k, v in columns.items()}, **{k: None if v is None else [int(x) for x in v] for k, v in results.items()}})
    out = whatif.csv_text(columns, results)
    if args.output:
        write_atomic(Path(args.output), out + "\n")
        return f"wrote {args.output} ({len(results['total'])} rows)"
    return out


def add_derive(parser: argparse.ArgumentParser) -> None:
    add_source(parser)
    fmt = parser.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--latex", action="store_const", const="latex", dest="format", help="a LaTeX document")
    fmt.add_argument("--markdown", action="store_const", const="markdown", dest="format", help="Markdown with $...$ math")
    fmt.add_argument("--html", action="store_const", const="html", dest="format", help="one self-contained HTML page (math renders offline)")
    parser.add_argument("--lang", choices=("en", "zh"), default="en", help="English or Chinese (default en)")
    parser.add_argument("--brief", action="store_true", help="only the chain of equations and the component table")
    parser.add_argument("--fragment", action="store_true", help="LaTeX without preamble, for \\input")
    parser.add_argument("-o", "--output", metavar="FILE", help="write to FILE (atomically) instead of printing")
    add_quant(parser)
    group = parser.add_argument_group("the training step's memory")
    group.add_argument("--memory", action="store_true", help="derive the training step's memory too: activations per module, the step, its peak (--seq)")
    group.add_argument("--seq", type=int, metavar="S", help="tokens per sequence (with --memory)")
    group.add_argument("--batch", type=int, default=1, metavar="B", help="sequences (default 1)")
    group.add_argument("--dtype", default="bf16", choices=("bf16", "fp32", "fp16"), help="the dtype the model trains in (default bf16)")
    group.add_argument("--attention", default="sdpa", choices=("sdpa", "eager"), help="attention implementation (default sdpa)")
    group.add_argument("--checkpointing", default="none", choices=("none", "full"), help="activation checkpointing (default none)")
    group.add_argument("--optimizer", default="adamw", metavar="NAME", help="optimizer convention (default adamw)")
    add_layout(parser)


def cmd_derive(args: argparse.Namespace) -> str:
    from symparam.derive import derive
    from symparam.render import html, render

    given_values = args.model or args.config or args.sets
    model = model_from(args) if given_values else Model(source(args)[1])  # no values: purely symbolic
    if args.memory and args.seq is None:
        raise SymparamError("--memory: give --seq S (and --batch B): the training step's activations grow with them")
    if args.seq is not None and not args.memory:
        raise SymparamError("--seq: describes the training step's memory; add --memory")
    memory = {"seq": args.seq, "batch": args.batch, "dtype": args.dtype, "attention": args.attention,
              "checkpointing": args.checkpointing, "optimizer_name": args.optimizer, "layout": layout_from(args)} if args.memory else None
    if not args.memory and layout_from(args) is not None:
        raise SymparamError("--dp/--tp/--pp/--ep/--cp: derive the per-GPU memory of a training step; add --memory --seq S")
    d = derive(model, args.quant, memory)
    text = html(d, args.lang, args.brief) if args.format == "html" else render(d, args.format, args.lang, args.fragment, args.brief)
    if not args.output:
        return text.rstrip("\n")
    write_atomic(Path(args.output), text)
    return f"wrote {args.output}"


def add_docs(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="exit 2 if generated/ is stale, writing nothing")
    parser.add_argument("--dir", default="generated", metavar="DIR", help="output directory (default generated)")


def cmd_docs(args: argparse.Namespace) -> str:
    from symparam import docs

    directory = Path(args.dir)
    if args.check:
        stale = docs.stale(directory)
        if stale:
            raise SymparamError(f"{directory}/ is stale ({', '.join(stale)}); run `symparam docs`")
        return f"{directory}/ is up to date"
    changed = docs.regenerate(directory)
    return f"wrote {len(changed)} file(s) in {directory}/" + "".join(f"\n  {name}" for name in changed)


# name -> (help, add arguments, run); each run returns the text to print.
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], str]]] = {
    "count": ("exact total, active and per-component parameter counts", lambda p: (add_source(p), add_quant(p), add_lora(p)), cmd_count),
    "list": ("families and presets", lambda p: None, cmd_list),
    "memory": ("weights, KV cache and training memory in bytes, GB and GiB; per GPU under a parallel layout", add_memory, cmd_memory),
    "fit": ("what fits on a GPU: the longest context, the largest batch, or the fewest GPUs", add_fit, cmd_fit),
    "flops": ("forward and training FLOPs per token", lambda p: (add_source(p), add_context(p)), cmd_flops),
    "shapes": ("every tensor of one forward pass, in order, with its shape (--train: what backward keeps)", add_shapes, cmd_shapes),
    "plot": ("charts of the parameter distribution (a family's sizes, or one model)", add_plot, cmd_plot),
    "derive": ("step-by-step derivation as LaTeX, Markdown or HTML, English or Chinese", add_derive, cmd_derive),
    "docs": ("regenerate generated/ (or --check that it is current)", add_docs, cmd_docs),
    "verify": ("compare with a safetensors checkpoint's headers; exit 1 on a mismatch", add_verify, cmd_verify),
    "solve": ("the integer values of a symbol closest to a target total", add_solve, cmd_solve),
    "sensitivity": ("d(total)/d(symbol), symbolic and at a config", add_sensitivity, cmd_sensitivity),
    "sweep": ("exact counts over a grid or a CSV of configs (CSV out)", add_sweep, cmd_sweep),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="symparam", description="Exact, closed-form parameter counts of transformer language models.")
    sub = top.add_subparsers(dest="command", required=True)
    for name, (help_text, add_arguments, run) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_arguments(p)
        p.add_argument("--json", action="store_true", help="print one JSON object")
        p.set_defaults(run=run)
    return top


def dashed_values(argv: list[str]) -> list[str]:
    """`--model -org/name` read as `--model=-org/name`: a value that starts with '-' and holds a '/' (a Hub id, a path)
    is no option, though argparse would take it for one and answer with its usage."""
    out: list[str] = []
    for token in argv:
        if out and out[-1].startswith("--") and "=" not in out[-1] and token.startswith("-") and "/" in token.split("=", 1)[0]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def silence_stdout() -> None:
    """stdout pointed at /dev/null, so that what its buffer still holds cannot fail again when Python exits (which would
    print 'Exception ignored' and exit 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # not a real file (a test's capture)
        pass


def main(argv: list[str] | None = None) -> int:
    """Run one command: its output on stdout, exit 0 (or the command's own code); bad input is one line on stderr and
    exit 2; a closed pipe is a quiet exit 141 and Ctrl-C exit 130 (as if killed by SIGPIPE or SIGINT, like C tools);
    text an ASCII-only stdout cannot encode is escaped (\\u4e2d), never a crash."""
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="backslashreplace")
    try:
        args = parser().parse_args(dashed_values(sys.argv[1:] if argv is None else argv))
        result = args.run(args)  # text, or (text, exit code) for commands that judge (verify)
        text, code = result if isinstance(result, tuple) else (result, 0)
        try:
            print(text)
            sys.stdout.flush()
        except BrokenPipeError:  # `symparam list | head -1`
            silence_stdout()
            return 141
        except OSError as e:  # stdout is /dev/full, or a disk that filled up
            silence_stdout()
            raise SymparamError(f"stdout: cannot write ({reason(e)})") from None
        return code
    except SymparamError as e:
        message = str(e).replace("\r", "\\r").replace("\n", "\\n")  # one line, whatever a message holds
        print(f"symparam: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        silence_stdout()
        print("symparam: error: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
