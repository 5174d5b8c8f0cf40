"""Rendering: golden files, real LaTeX compilers, real KaTeX, escaping, the CLI, generated/ and a notebook."""

import os
import re
import shutil
import stat
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

import symparam
from symparam import cli
from symparam.derive import derive
from symparam.docs import stale
from symparam.recipes import REGISTRY
from symparam.render import catalog, escape_tex, explain, render, translate

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = Path(__file__).parent / "golden"
KATEX = Path(__file__).parent / "katex"

CASES = [
    ("qwen3-235b-a22b", "markdown", "en"),
    ("qwen3-235b-a22b", "markdown", "zh"),
    ("qwen2.5-3b", "latex", "en"),
    ("qwen3-8b", "latex", "zh"),
    ("classic-512-tied", "markdown", "en"),
]


@contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def need(tool: str) -> str:
    path = shutil.which(tool)
    if path is None:
        pytest.skip(f"{tool} is not installed")
    return path


@pytest.mark.parametrize("name, fmt, lang", CASES)
def test_golden(name, fmt, lang, update_golden):
    text = render(derive(symparam.load(name)), fmt, lang)
    path = GOLDEN / f"{name}.{lang}.{'md' if fmt == 'markdown' else 'tex'}"
    if update_golden:
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
    assert path.is_file(), f"{path} missing: run pytest --update-golden"
    assert text == path.read_text(encoding="utf-8")


def compile_tex(engine: str, text: str, tmp_path: Path) -> Path:
    need(engine)
    (tmp_path / "doc.tex").write_text(text, encoding="utf-8")
    run = subprocess.run([engine, "-interaction=nonstopmode", "-halt-on-error", "doc.tex"], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-3000:]
    return tmp_path / "doc.pdf"


@pytest.mark.parametrize("name", ["qwen3-235b-a22b", "gpt2", "deepseek-v3"])
def test_english_latex_compiles_with_pdflatex(name, tmp_path):
    assert compile_tex("pdflatex", render(derive(symparam.load(name)), "latex", "en"), tmp_path).stat().st_size > 0


@pytest.mark.parametrize("name", ["qwen3-235b-a22b", "classic-512"])
def test_chinese_latex_compiles_with_xelatex(name, tmp_path):
    pdf = compile_tex("xelatex", render(derive(symparam.load(name)), "latex", "zh"), tmp_path)
    text = subprocess.run([need("pdftotext"), str(pdf), "-"], capture_output=True, text=True).stdout
    assert "注意力" in text and "参数量" in text


def test_user_strings_are_escaped_not_compiled(tmp_path):
    model = symparam.load("classic-512")
    model.name = r"my_model {{ 7*7 }} {% raw %} & 100% $x$ #1 \textbf{no}"
    tex = render(derive(model), "latex", "en")
    assert escape_tex(model.name) in tex and "{{ 7*7 }}" not in tex.replace(escape_tex("{{ 7*7 }}"), "")
    compile_tex("pdflatex", tex, tmp_path)
    assert r"my\_model \{\{ 7*7 \}\}" in tex
    md = render(derive(model), "markdown", "en")
    assert r"my\_model \{\{ 7\*7 \}\}" in md


def test_markdown_math_renders_in_katex(tmp_path):
    node = need("node")
    if not (KATEX / "node_modules" / "katex").is_dir():
        pytest.skip("katex is not installed: npm ci --prefix tests/katex")
    files = []
    for name, lang in (("qwen3-235b-a22b", "en"), ("qwen3-235b-a22b", "zh"), ("deepseek-v3", "en"), ("gpt2", "zh")):
        path = tmp_path / f"{name}.{lang}.md"
        path.write_text(render(derive(symparam.load(name)), "markdown", lang), encoding="utf-8")
        files.append(str(path))
    files += [str(p) for p in sorted((ROOT / "generated").glob("*.md"))]
    run = subprocess.run([node, str(KATEX / "check.js"), *files], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr


def test_generated_is_current():
    assert stale(ROOT / "generated") == []
    assert cli.main(["docs", "--check", "--dir", str(ROOT / "generated")]) == 0


def test_docs_check_fails_when_stale(tmp_path, capsys):
    assert cli.main(["docs", "--check", "--dir", str(tmp_path)]) == 2
    with umask(0o027):
        assert cli.main(["docs", "--dir", str(tmp_path)]) == 0
    assert {mode(p) for p in tmp_path.iterdir()} == {0o640}  # what open() gives under the umask, not mkstemp's 0600
    assert cli.main(["docs", "--check", "--dir", str(tmp_path)]) == 0
    (tmp_path / "llama.en.md").write_text("edited", encoding="utf-8")
    assert cli.main(["docs", "--check", "--dir", str(tmp_path)]) == 2
    assert "llama.en.md" in capsys.readouterr().err


def test_derive_cli_symbolic_and_output(tmp_path, capsys):
    assert cli.main(["derive", "--arch", "qwen3-moe", "--markdown"]) == 0
    assert "Purely symbolic" in capsys.readouterr().out
    out = tmp_path / "d.tex"
    with umask(0o022):
        assert cli.main(["derive", "--model", "qwen3-8b", "--latex", "--lang", "zh", "-o", str(out)]) == 0
    assert mode(out) == 0o644
    assert out.read_text(encoding="utf-8").startswith(r"\documentclass")
    frag = tmp_path / "f.tex"
    assert cli.main(["derive", "--model", "gpt2", "--latex", "--fragment", "-o", str(frag)]) == 0
    assert r"\documentclass" not in frag.read_text(encoding="utf-8")


def test_failed_derive_leaves_no_file(tmp_path):
    out = tmp_path / "x.md"
    assert cli.main(["derive", "--model", "no-such-model", "--markdown", "-o", str(out)]) == 2
    assert cli.main(["derive", "--model", "gpt2", "--markdown", "-o", str(tmp_path / "missing" / "x.md")]) == 2
    assert list(tmp_path.iterdir()) == []


def test_explanation_and_model_display():
    model = symparam.load("qwen3-8b")
    assert explain(model)._repr_markdown_().startswith("# Parameter count of qwen3-8b")
    assert model._repr_latex_().startswith("$")


def test_notebook_runs_in_a_real_kernel():
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(Path(__file__).parent / "derivation.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    kinds = {k for o in outputs for k in o.get("data", {})}
    assert {"text/latex", "text/markdown"} <= kinds
    markdown = next(o["data"]["text/markdown"] for o in outputs if "text/markdown" in o.get("data", {}))
    assert "235,093,634,560" in markdown
    assert markdown.index("The count in one chain") < markdown.index("## Symbols")  # the chain first


CHROMIUM = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000"]


def open_in_chromium(page: Path, tmp_path: Path) -> tuple[str, str]:
    """The DOM after scripts ran, and the browser's log (console messages included); a screenshot beside the page."""
    browser = need("chromium")
    profile = tmp_path / "profile"
    dom = subprocess.run([browser, *CHROMIUM, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = subprocess.run([browser, *CHROMIUM, f"--user-data-dir={profile}", "--window-size=1200,1800", f"--screenshot={page.with_suffix('.png')}", page.as_uri()], capture_output=True, text=True, timeout=180)
    assert shot.returncode == 0 and page.with_suffix(".png").stat().st_size > 10_000
    return dom.stdout, dom.stderr + shot.stderr


def visible_text(dom: str) -> str:
    """What a reader sees: the DOM's text without scripts, styles and KaTeX's TeX annotations (kept for copy-paste)."""
    from html.parser import HTMLParser

    class Text(HTMLParser):
        hidden = ("script", "style", "annotation")

        def __init__(self):
            super().__init__()
            self.depth, self.out = 0, []

        def handle_starttag(self, tag, attrs):
            self.depth += tag in self.hidden

        def handle_endtag(self, tag):
            self.depth -= tag in self.hidden

        def handle_data(self, data):
            if not self.depth:
                self.out.append(data)

    parser = Text()
    parser.feed(dom)
    return "".join(parser.out)


def console_errors(log: str) -> list[str]:
    return [line for line in log.splitlines() if "CONSOLE" in line or "Uncaught" in line]


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_html_renders_its_math_offline_in_chromium(lang, tmp_path):
    page = tmp_path / f"qwen3-235b-a22b.{lang}.html"
    assert cli.main(["derive", "--model", "qwen3-235b-a22b", "--html", "--lang", lang, "-o", str(page)]) == 0
    text = page.read_text(encoding="utf-8")
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text  # nothing to fetch
    dom, log = open_in_chromium(page, tmp_path)
    assert console_errors(log) == []
    assert dom.count('class="katex"') + dom.count('class="katex-display"') >= text.count('class="math')
    seen = visible_text(dom)
    assert "235,093,634,560" in seen and "$" not in seen
    assert re.search(r"\\[a-zA-Z]+", seen) is None, re.search(r".{40}\\[a-zA-Z]+.{40}", seen)  # no raw TeX left


def test_chromium_check_catches_math_that_does_not_render(tmp_path):
    from symparam.render import page

    bad = tmp_path / "bad.html"
    bad.write_text(page("# x\n\n$$\n\\frac{1}{\n$$\n", "bad"), encoding="utf-8")
    dom, log = open_in_chromium(bad, tmp_path)
    assert console_errors(log) and re.search(r"\\frac", visible_text(dom))


@pytest.mark.parametrize("fmt, lang", [("markdown", "en"), ("markdown", "zh"), ("latex", "en"), ("latex", "zh")])
def test_brief_is_the_chain_and_the_table(fmt, lang, tmp_path, capsys):
    assert cli.main(["derive", "--model", "qwen3-235b-a22b", f"--{fmt}", "--lang", lang, "--brief"]) == 0
    out = capsys.readouterr().out
    full = render(derive(symparam.load("qwen3-235b-a22b")), fmt, lang)
    assert "aligned" in out and "22{,}190{,}763{,}520" in out and "227,096,395,776" in out.replace("{,}", ",")
    assert len(out) < len(full) / 3 and ("Step" not in out if lang == "en" else "第 1 步" not in out)
    if fmt == "latex":
        compile_tex("pdflatex" if lang == "en" else "xelatex", out, tmp_path)


def untranslated(d, lang: str = "zh") -> set[str]:
    """The English words a derivation shows (step and component titles, tensor notes, symbol meanings) that neither
    the language's catalog nor the family's own table translates."""
    table, own = catalog(lang), d.translations.get(lang, {})
    used = {("titles", s.title) for s in d.steps[1:]} | {("titles", r.title) for s in d.steps for r in s.refs}
    used |= {("titles", r.component) for r in d.rows} | {("notes", f.note) for s in d.steps for f in s.factors if f.note}
    used |= {("meanings", d.meanings[str(s)]) for s in d.symbols}
    used |= {("titles", d.storage.title)} if d.storage is not None else set()
    return {text for section, text in used if translate(table, own, section, text) is None}


@pytest.mark.parametrize("recipe", list(REGISTRY), ids=lambda r: r.family)
def test_every_family_reads_in_chinese(recipe):
    assert untranslated(derive(symparam.Model(recipe))) == set()


MEMORY = {"seq": 2048, "batch": 1, "dtype": "bf16", "attention": "sdpa", "checkpointing": "none", "optimizer_name": "adamw"}


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_memory_derivation_compiles_and_renders(lang, tmp_path):
    """derive --memory: the activations by module and layer kind, the step and its peak, the GPT-3 formula beside the
    model's; LaTeX compiles (pdflatex, xelatex), the Markdown's math renders in KaTeX, every word is translated."""
    d = derive(symparam.load("qwen3-0.6b"), memory=MEMORY)
    assert d.memory.peak_value == 12_070_528_224  # tests/test_training.py measures it with a live-storage tracker
    tex = render(d, "latex", lang)
    pdf = compile_tex("pdflatex" if lang == "en" else "xelatex", tex, tmp_path)
    text = subprocess.run([need("pdftotext"), str(pdf), "-"], capture_output=True, text=True).stdout
    assert "12,070,528,224" in text and "406,847,488" in text  # the peak, and the GPT-3 formula's bytes for one layer
    md = render(d, "markdown", lang)
    path = tmp_path / f"memory.{lang}.md"
    path.write_text(md, encoding="utf-8")
    run = subprocess.run([need("node"), str(KATEX / "check.js"), str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    if lang == "zh":
        assert not re.search(r"\b(training step|activations|optimizer|peak)\b", md)


def test_memory_derivation_needs_a_config_and_a_length(capsys):
    assert cli.main(["derive", "--arch", "qwen3", "--markdown", "--memory", "--seq", "8"]) == 2
    assert "--memory" in capsys.readouterr().err
    assert cli.main(["derive", "--model", "qwen3-0.6b", "--markdown", "--memory"]) == 2
    assert "--seq" in capsys.readouterr().err


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_per_gpu_derivation_compiles_and_renders(lang, tmp_path):
    """derive --memory with a layout: the most loaded GPU's terms in the layout's degrees, the same figure `memory`
    prints for it; LaTeX compiles, the Markdown's math renders in KaTeX."""
    from symparam.memory import Train, report
    from symparam.memory.sharding import Layout

    layout = Layout(dp=2, tp=2, sharding="zero1")
    d = derive(symparam.load("qwen3-0.6b"), memory={**MEMORY, "layout": layout})
    per_rank = report(symparam.load("qwen3-0.6b"), "bf16", 2048, 1, None, Train(), layout)["per_rank"]["most_loaded"]
    assert d.memory.rank.value == per_rank["bytes"] and d.memory.rank.rank == per_rank["rank"]
    assert {t.key for t in d.memory.rank.terms} >= {"weights", "gradients", "optimizer_states", "activations"}
    tex = render(d, "latex", lang)
    pdf = compile_tex("pdflatex" if lang == "en" else "xelatex", tex, tmp_path)
    text = subprocess.run([need("pdftotext"), str(pdf), "-"], capture_output=True, text=True).stdout
    assert f"{per_rank['bytes']:,}" in text
    path = tmp_path / f"rank.{lang}.md"
    path.write_text(render(d, "markdown", lang), encoding="utf-8")
    run = subprocess.run([need("node"), str(KATEX / "check.js"), str(path)], capture_output=True, text=True)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]


def test_layout_needs_memory(capsys):
    assert cli.main(["derive", "--model", "qwen3-0.6b", "--markdown", "--tp", "2"]) == 2
    assert "--memory" in capsys.readouterr().err
