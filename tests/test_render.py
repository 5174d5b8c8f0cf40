"""Rendering: golden files, real LaTeX compilers, real KaTeX, escaping, the CLI, generated/ and a notebook."""

import os
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
from symparam.render import escape_tex, explain, render

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
