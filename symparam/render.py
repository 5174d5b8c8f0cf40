"""Lays out derivations with Jinja templates as Markdown or LaTeX, in English or Chinese."""

from __future__ import annotations

import base64
import re
import string
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from importlib import resources

import sympy as sp
from sympy.printing.latex import LatexPrinter
from sympy.printing.precedence import PRECEDENCE
from sympy.printing.str import StrPrinter

from symparam.derive import ASSUMPTIONS, Derivation, derive
from symparam.errors import SymparamError
from symparam.figures import decimal
from symparam.model import Model
from symparam.symbols import BY_NAME, LATEX_NAMES, SYMBOLS

FORMATS = {"markdown": "md", "latex": "tex"}
LANGS = ("en", "zh")


def as_written(printer, expr: sp.UnevaluatedExpr, times: str) -> str:
    """A sum or product the derivation wrote in a chosen order (module order, the count first), printed in that order."""
    arg = expr.args[0]
    if arg.is_Add:
        out = []
        for term in arg.args:
            text = printer._print(term)
            out.append(text if not out else f"- {text[1:].lstrip()}" if text.startswith("-") else f"+ {text}")
        return " ".join(out)
    if arg.is_Mul:
        return times.join(printer.parenthesize(f, PRECEDENCE["Mul"]) for f in arg.args)
    return printer._print(arg)


class Printer(LatexPrinter):
    """SymPy's LaTeX printer with the vocabulary's names, step placeholders by title, grouped digits and written order kept."""

    def __init__(self, names: Mapping[sp.Symbol, str] | None = None):
        super().__init__({"symbol_names": {**LATEX_NAMES, **(names or {})}})

    def _print_Integer(self, expr: sp.Integer) -> str:
        return f"{int(expr):,}".replace(",", "{,}") if abs(expr) >= 10**5 else str(expr)

    def _print_UnevaluatedExpr(self, expr: sp.UnevaluatedExpr) -> str:
        return as_written(self, expr, " ")


class TextPrinter(StrPrinter):
    """SymPy's one-line printer with the written order kept: N*(2*d + ...) + d*(2*V + 1)."""

    def _print_UnevaluatedExpr(self, expr: sp.UnevaluatedExpr) -> str:
        return as_written(self, expr, "*")


def text(expr: sp.Expr) -> str:
    """An expression as one line of text, in the order the derivation wrote it."""
    return TextPrinter().doprint(expr)


_TEX_SPECIAL = {"\\": r"\textbackslash{}", "{": r"\{", "}": r"\}", "$": r"\$", "&": r"\&", "#": r"\#", "%": r"\%", "_": r"\_", "^": r"\^{}", "~": r"\~{}", "<": r"\textless{}", ">": r"\textgreater{}"}
_MD_SPECIAL = set("\\`*_{}[]<>#|$")


def ratio(x: Fraction) -> str:
    """An exact ratio as a terminating decimal ("5.375") where it has one, else "a/b"."""
    x = Fraction(x)
    q = x.denominator
    for p in (2, 5):
        while q % p == 0:
            q //= p
    if q != 1:
        return f"{x.numerator}/{x.denominator}"
    places = 0
    while (x * 10**places).denominator != 1:
        places += 1
    whole = x * 10**places
    text = str(whole.numerator).rjust(places + 1, "0")
    return text if not places else f"{text[:-places]}.{text[-places:]}"


def escape_tex(text: str) -> str:
    """Plain text made safe for LaTeX text mode (also inside \\text{} in math)."""
    return "".join(_TEX_SPECIAL.get(ch, ch) for ch in str(text))


def escape_md(text: str) -> str:
    """Plain text made safe for Markdown (and its tables)."""
    return "".join("\\" + ch if ch in _MD_SPECIAL else ch for ch in str(text))


ESCAPE = {"tex": escape_tex, "md": escape_md}


@cache
def catalog(lang: str) -> dict:
    """The phrases of a language, from templates/<lang>.toml."""
    if lang not in LANGS:
        raise SymparamError(f"lang: unknown {lang!r}; known: {', '.join(LANGS)}")
    return tomllib.loads(templates().joinpath(f"{lang}.toml").read_text(encoding="utf-8"))


def templates():
    """The packaged templates directory (the top-level templates/ in a checkout)."""
    return resources.files("symparam.templates")


def _load(name: str) -> str:
    return templates().joinpath(name).read_text(encoding="utf-8")


WORD_SECTIONS = ("titles", "notes", "meanings")  # a word in one section translates the same in another


def translate(table: Mapping, own: Mapping[str, str], section: str, text: str) -> str | None:
    """`text` in a catalog's language: its entry in `section`, the family's own words, or a [patterns] entry whose
    captured parts are translated in turn ("pre-FFN norm: scale" from "{1}: scale" and "pre-FFN norm"); else None."""
    found = table.get(section, {}).get(text) or own.get(text) or next(
        (words[text] for name, words in table.items() if name in WORD_SECTIONS and text in words), None)
    if found or not text:
        return found
    for pattern, template in table.get("patterns", {}).items():
        match = re.fullmatch(pattern, text)
        if match:
            parts = [translate(table, own, section, part) for part in match.groups()]
            if all(parts):
                return template.format(None, *parts)
    return None


@dataclass
class Words:
    """The translated words of one document: phrases, titles, notes and symbol meanings, escaped for its format."""

    lang: str
    fmt: str
    own: Mapping[str, str] = field(default_factory=dict)  # the family's own words in this language (recipe [zh], symbol zh)

    def __post_init__(self) -> None:
        self.table = catalog(self.lang)
        self.esc = ESCAPE[self.fmt]

    def word(self, section: str, text: str) -> str:
        """A title, note or meaning in this language (the English text where the catalog has none), escaped."""
        return self.esc(translate(self.table, self.own, section, text) or text)

    def phrase(self, name: str, /, **fields: str) -> str:
        """A catalog phrase with its literal text escaped and the fields (already formatted) put in."""
        source = self.table["phrases"][name]
        out = []
        for literal, field, _, _ in string.Formatter().parse(source):
            out.append(self.esc(literal))
            if field is not None:
                out.append(str(fields[field]))
        return "".join(out)


def placeholder_names(d: Derivation, words: Words) -> dict[sp.Symbol, str]:
    """P_{title} for every step and absent part, in the document's language."""
    names = {}
    for step in d.steps:
        label = words.phrase("model") if step.index == 0 else words.word("titles", step.title)
        names[step.placeholder] = rf"P_{{\text{{{label}}}}}"
        names[step.active_placeholder] = rf"P^{{\mathrm{{act}}}}_{{\text{{{label}}}}}"
        for ref in step.refs:
            names.setdefault(ref.placeholder, rf"P_{{\text{{{words.word('titles', ref.title)}}}}}")
    return names


def note(key: str, fields: dict[str, str], lang: str = "en") -> str:
    """How a config was read, as plain text in a language (a catalog phrase with its fields)."""
    return catalog(lang)["phrases"][key].format(**fields)


def environment(fmt: str, lang: str, d: Derivation | None = None):
    """A strict Jinja environment for one format and language; user strings reach it only as escaped values."""
    import jinja2  # here, not at import: `count` prints through this module and need not load Jinja

    words = Words(lang, fmt, d.translations.get(lang, {}) if d is not None else {})
    printer = Printer(placeholder_names(d, words) if d is not None else {})
    env = jinja2.Environment(
        loader=jinja2.FunctionLoader(_load),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    sep = "," if fmt == "md" else "{,}"
    env.filters.update(
        esc=words.esc,
        escfields=lambda fields: {k: words.esc(v) for k, v in fields.items()},
        math=lambda e: printer.doprint(sp.sympify(e)),
        ratio=ratio,
        num=lambda n: f"{n:,}".replace(",", sep),
        billions=lambda n: decimal(Fraction(n) / 10**9),
        number=lambda x: f"{int(x):,}".replace(",", sep) if Fraction(x).denominator == 1 else ratio(x),
        pct=lambda x: decimal(Fraction(x) * 100),
        signed_pct=lambda x: ("+" if x >= 0 else "") + decimal(Fraction(x) * 100),
        title=lambda t: words.word("titles", t),
        note=lambda t: words.word("notes", t),
        meaning=lambda name: words.word("meanings", d.meanings[name] if d is not None else BY_NAME[name].meaning),
    )
    env.globals.update(t=words.phrase, lang=lang, fmt=fmt, SYMBOLS=SYMBOLS, ASSUMPTIONS=ASSUMPTIONS)
    return env


def render(d: Derivation, fmt: str = "markdown", lang: str = "en", fragment: bool = False, brief: bool = False) -> str:
    """A derivation as a Markdown or LaTeX document (or a LaTeX fragment for \\input); brief: the chain and the component table only."""
    ext = FORMATS.get(fmt, fmt)
    if ext not in ESCAPE:
        raise SymparamError(f"format: unknown {fmt!r}; known: {', '.join(FORMATS)}")
    return environment(ext, lang, d).get_template(f"derivation.{ext}.j2").render(d=d, fragment=fragment, brief=brief)


def examples_page(lang: str = "en") -> str:
    """The source documents' worked examples beside the exact counts, as Markdown."""
    from symparam.examples import examples

    return environment("md", lang).get_template("examples.md.j2").render(examples=examples())


def katex_assets() -> tuple[str, str]:
    """KaTeX's script and stylesheet as shipped in symparam/assets/katex, with its woff2 fonts inlined as data URIs."""
    root = resources.files("symparam").joinpath("assets", "katex")

    def font(match: re.Match) -> str:
        data = base64.b64encode(root.joinpath("fonts", f"{match[1]}.woff2").read_bytes()).decode("ascii")
        return f'src:url(data:font/woff2;base64,{data}) format("woff2")'

    css = re.sub(r"src:url\(fonts/([\w-]+)\.woff2\)[^;}]*", font, root.joinpath("katex.min.css").read_text(encoding="utf-8"))
    return root.joinpath("katex.min.js").read_text(encoding="utf-8"), css


def page(markdown: str, title: str, lang: str = "en") -> str:
    """Markdown with $...$ math as one self-contained HTML page: tables and math as HTML elements, KaTeX inlined."""
    import jinja2
    from markdown_it import MarkdownIt
    from markupsafe import Markup
    from mdit_py_plugins.dollarmath import dollarmath_plugin

    parser = MarkdownIt("commonmark", {"html": False}).enable("table").use(dollarmath_plugin, double_inline=True)
    script, css = katex_assets()
    env = jinja2.Environment(loader=jinja2.FunctionLoader(_load), undefined=jinja2.StrictUndefined, autoescape=True)
    return env.get_template("page.html.j2").render(
        title=title, lang=lang, body=Markup(parser.render(markdown)), katex_js=Markup(script.replace("</script", "<\\/script")), katex_css=Markup(css)
    )


def html(d: Derivation, lang: str = "en", brief: bool = False) -> str:
    """A derivation as one self-contained HTML page whose math renders offline."""
    return page(render(d, "markdown", lang, brief=brief), catalog(lang)["phrases"]["heading"].format(name=d.name), lang)


class Explanation:
    """A model's derivation that Jupyter shows as Markdown with math."""

    def __init__(self, model: Model, lang: str = "en"):
        self.derivation = derive(model)
        self.lang = lang

    def markdown(self) -> str:
        return render(self.derivation, "markdown", self.lang)

    def _repr_markdown_(self) -> str:
        return self.markdown()


def explain(model: Model, lang: str = "en") -> Explanation:
    """The displayable derivation of a model (Markdown in Jupyter)."""
    return Explanation(model, lang)


__all__ = ["Explanation", "Printer", "environment", "escape_md", "escape_tex", "explain", "render"]
