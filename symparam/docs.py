"""generated/: one derivation per family (Markdown and LaTeX, English and Chinese), the source documents' examples, and
the coverage matrix of transformers' causal-LM model types (written where transformers is installed: the package itself
does not need it)."""

from __future__ import annotations

import stat
from collections.abc import Callable
from functools import cache
from importlib import resources
from pathlib import Path

from symparam import catalog
from symparam.derive import Derivation, derive
from symparam.errors import SymparamError
from symparam.files import directory as output_directory, existing, read_text, shown, write_atomic
from symparam.model import Model
from symparam.config import resolve
from symparam.recipes import HEADERS, REGISTRY, header_index, scope, wrapper_table
from symparam.render import FORMATS, LANGS, examples_page, render


COVERAGE = "coverage.md"
MAX_PAGE = 64 * 2**20  # bytes of a generated file read to compare (the largest is under 1 MB)


@cache
def _derivation(family: str) -> Derivation:
    return derive(Model(REGISTRY.family(family)))


@cache
def _page(family: str, fmt: str, lang: str) -> str:
    """One family's derivation page, rendered once per process (check and write read the same text)."""
    return render(_derivation(family), fmt, lang)


def pages() -> dict[str, Callable[[], str]]:
    """File name under generated/ -> a function producing its text."""
    out: dict[str, Callable[[], str]] = {}
    for header in REGISTRY.families():
        for fmt, ext in FORMATS.items():
            for lang in LANGS:
                out[f"{header['family']}.{lang}.{ext}"] = lambda r=header["family"], f=fmt, l=lang: _page(r, f, l)
    out["examples.md"] = examples_page
    mapping = causal_lm_types()
    if mapping is not None:
        out[COVERAGE] = lambda: coverage_page(*mapping)
    return out


def causal_lm_types() -> tuple[dict[str, str], str] | None:
    """transformers' model_type -> causal-LM class mapping and its version, or None where transformers is not installed."""
    try:
        import transformers
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    except ImportError:
        return None
    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES), transformers.__version__


def counted_wrapper(model_type: str) -> str | None:
    """The family that counts a multimodal wrapper type's language model (recipes/_wrappers.toml), if one does."""
    spec = wrapper_table()[1].get(model_type)
    if spec is None or spec.reason or spec.text not in REGISTRY.by_type:
        return None
    return REGISTRY.headers[REGISTRY.by_type[spec.text]]["family"]


def coverage(mapping: dict[str, str]) -> dict[str, tuple[str, str | None, str]]:
    """Every model type -> (status, family, how): "exact" for a recipe's own type, "wrapper" for a multimodal config
    whose language model a recipe counts, "out of scope" with the reason, "missing" for none of these."""
    out_of_scope = scope()
    out = {}
    for model_type in sorted(mapping):
        file = REGISTRY.by_type.get(model_type)
        if file is not None:
            out[model_type] = ("exact", REGISTRY.headers[file]["family"], "recipe, tested per tensor against transformers")
        elif counted_wrapper(model_type):
            out[model_type] = ("wrapper", counted_wrapper(model_type), "multimodal config: its language model is counted (see the second table)")
        elif model_type in out_of_scope["types"]:
            out[model_type] = ("out of scope", None, out_of_scope["types"][model_type])
        else:
            out[model_type] = ("missing", None, "no recipe yet")
    return out


@cache
def multimodal_types() -> dict[str, tuple[str, str]] | None:
    """transformers' config types that hold a causal-LM model in a sub-config: type -> (sub-config key, its default
    model_type: a causal-LM type of transformers, or one a recipe reads); None where transformers is not installed."""
    try:
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING, CONFIG_MAPPING_NAMES
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
        from transformers.utils import logging
    except ImportError:
        return None
    logging.set_verbosity_error()  # default configs warn of what they leave unset; the page states what it counts
    out = {}
    for model_type in sorted(CONFIG_MAPPING_NAMES):
        try:
            specs = getattr(CONFIG_MAPPING[model_type], "sub_configs_defaults", None) or {}
        except Exception:  # a config class that does not import here (an optional dependency): it holds no model we count
            continue
        inner = next(((key, spec.model_type) for key, spec in specs.items()
                      if getattr(spec, "model_type", None) in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES or getattr(spec, "model_type", None) in REGISTRY.by_type), None)
        if inner is not None:
            out[model_type] = inner
    return out


def wrapper_coverage(types: dict[str, tuple[str, str]]) -> dict[str, tuple[str, str | None, str]]:
    """Every multimodal type that holds a causal-LM model -> (status, family, how): "exact" where its language model is
    counted (tested per tensor against the whole model), else "not counted" with the reason."""
    out_of_scope = scope()
    out = {}
    for model_type, (key, inner) in types.items():
        spec = wrapper_table()[1].get(model_type)
        family = counted_wrapper(model_type)
        if family is not None:
            out[model_type] = ("exact", family, "its language model and LM head, tested per tensor against the whole model")
        elif model_type in out_of_scope["types"]:
            out[model_type] = ("not counted", None, out_of_scope["reasons"][out_of_scope["types"][model_type]])
        elif inner in out_of_scope["types"]:
            out[model_type] = ("not counted", None, f"its {key} is {inner}: {out_of_scope['reasons'][out_of_scope['types'][inner]]}")
        elif spec is not None and spec.reason:
            out[model_type] = ("not counted", None, spec.reason)
        else:
            out[model_type] = ("missing", None, "not in recipes/_wrappers.toml yet")
    return out


def default_total(model_type: str) -> tuple[int | None, str]:
    """The total symparam counts for a wrapper's library-default config, or None and why that default is refused."""
    from transformers import AutoConfig

    from symparam.errors import SymparamError

    try:
        return Model.from_resolved(resolve(AutoConfig.for_model(model_type).to_dict())).count().total, ""
    except SymparamError as e:
        return None, f"; its library default is refused: {e}"


def coverage_page(mapping: dict[str, str], version: str) -> str:
    """generated/coverage.md: every causal-LM model type of transformers with its family and status, or its reason; then
    every multimodal type that holds a causal-LM model, counted by its language model or with its reason."""
    rows = coverage(mapping)
    counts = {status: sum(1 for s, _, _ in rows.values() if s == status) for status in ("exact", "wrapper", "out of scope", "missing")}
    families = len({family for _, family, _ in rows.values() if family})
    lines = [
        f"# Coverage: transformers {version}, causal-LM model types",
        "",
        f"transformers {version} maps {len(rows)} model types to a causal-LM class (`MODEL_FOR_CAUSAL_LM_MAPPING_NAMES`). "
        f"symparam counts {counts['exact']} of them exactly with a recipe of their own ({families} families), "
        f"{counts['wrapper']} multimodal wrappers by their language model, and leaves {counts['out of scope']} out of scope, "
        f"each with its reason; {counts['missing']} have neither a recipe nor a reason.",
        "",
        "| model type | class | status | family | how |",
        "|---|---|---|---|---|",
    ]
    for model_type, (status, family, how) in rows.items():
        link = f"[{family}]({family}.en.md)" if family else ""
        lines.append(f"| `{model_type}` | `{mapping[model_type]}` | {status} | {link} | {how} |")
    reasons = scope()["reasons"]
    lines += ["", "Out of scope, by reason:", ""] + [f"- **{key}**: {text}." for key, text in reasons.items()]
    types = multimodal_types() or {}
    wrapped = wrapper_coverage(types)
    exact = [t for t, (status, _, _) in wrapped.items() if status == "exact"]
    lines += [
        "",
        f"## Multimodal configs: transformers {version}",
        "",
        f"transformers {version} has {len(wrapped)} config types that keep a causal-LM model in a sub-config (a sub-config whose "
        f"default model_type is a causal-LM type, or one a recipe reads). symparam counts the language model and LM head of "
        f"{len(exact)} of them, read by structure (`symparam/recipes/_wrappers.toml` says what a config.json cannot: defaults, "
        f"how the head is tied); the other {len(wrapped) - len(exact)} are not counted, each with its reason. The default total "
        f"is symparam's count of the library-default config, the towers left out (blank where that default is refused: why is said).",
        "",
        "| model type | language model | status | family | default total | how |",
        "|---|---|---|---|---:|---|",
    ]
    for model_type, (status, family, how) in wrapped.items():
        key, inner = types[model_type]
        link = f"[{family}]({family}.en.md)" if family else ""
        total, refused = default_total(model_type) if status == "exact" else (None, "")
        lines.append(f"| `{model_type}` | `{key}`: `{inner}` | {status} | {link} | {'' if total is None else f'{total:,}'} | {how}{refused} |")
    return "\n".join(lines) + "\n"


def package_files() -> dict[Path, Callable[[], str]]:
    """Data files inside the package that docs derives: the catalog's counts and the recipes' header index."""
    headers = Path(str(resources.files("symparam.recipes").joinpath(HEADERS)))
    return {catalog.index_path(): catalog.compute, headers: lambda: header_index(REGISTRY)}


def current(path: Path) -> str | None:
    """The text a generated file holds now, None if there is none (a FIFO or a device there is a one-line error)."""
    return read_text(path, MAX_PAGE, "generated page") if existing(path) else None


def stale(directory: Path) -> list[str]:
    """Files under `directory` that are missing or differ from what the code generates now, and strays; and the
    catalog's index of counts if it is stale."""
    found = existing(directory)
    if found is not None and not stat.S_ISDIR(found.st_mode):
        raise SymparamError(f"{shown(directory)}: not a directory")
    wanted = pages()
    out = [name for name, make in wanted.items() if (text := current(directory / name)) is None or text != make()]  # a missing page is not rendered
    strays = sorted(p.name for p in directory.glob("*") if p.is_file() and p.name not in wanted and p.suffix in (".md", ".tex"))
    out += [str(path) for path, make in package_files().items() if current(path) != make()]
    return out + [f"{name} (not generated by symparam docs)" for name in strays]


def regenerate(directory: Path) -> list[str]:
    """Write every page and the catalog's index; returns the names of the files whose content changed."""
    directory = output_directory(directory)
    changed = []
    targets = {directory / name: make for name, make in pages().items()} | package_files()
    for path, make in targets.items():
        text = make()
        if current(path) != text:
            write_atomic(path, text)
            changed.append(path.name if path.parent == directory else str(path))
    return changed
