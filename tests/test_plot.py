"""Charts are written whole, reopen as images of a sensible size, and bad outputs are one-line errors."""

from __future__ import annotations

import json
import os
import stat

import pytest

from symparam.cli import main
from symparam.errors import SymparamError
from symparam.plot import family_models, plot_model, save
from symparam import load

image = pytest.importorskip("matplotlib.image")


@pytest.mark.parametrize("args", [["--family", "gpt2"], ["--family", "qwen3"], ["--family", "qwen3-moe"], ["--model", "deepseek-v3"], ["--model", "gpt2"]])
def test_png_written_and_reopened(tmp_path, capsys, args):
    out = tmp_path / "chart.png"
    assert main(["plot", *args, "-o", str(out), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["output"] == str(out)
    pixels = image.imread(out)
    height, width = pixels.shape[:2]
    assert 400 <= height <= 2000 and 600 <= width <= 2500
    assert pixels.std() > 0.05  # not a blank canvas
    assert [p.name for p in tmp_path.iterdir()] == ["chart.png"]  # no temporary file left behind


def test_svg(tmp_path):
    out = tmp_path / "q.svg"
    old = os.umask(0o022)
    try:
        plot_model(load("qwen3-8b"), out)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o644  # a plain open()'s mode, not mkstemp's 0600
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "</svg>" in text


def test_family_presets_in_size_order():
    assert [m.name for m in family_models("gpt2")[1]] == ["gpt2", "gpt2-medium", "gpt2-large", "gpt2-xl"]


def test_a_series_draws_every_published_size_dense_and_moe():
    # document 003 plots Qwen3 0.6B to 32B dense and the MoE models: the catalog has six dense and three MoE sizes
    title, models = family_models("qwen3")
    assert [m.name for m in models] == ["qwen3-0.6b", "qwen3-1.7b", "qwen3-4b", "qwen3-8b", "qwen3-14b", "qwen3-30b-a3b", "qwen3-32b",
                                        "qwen3-235b-a22b", "qwen3-coder-480b-a35b"]
    assert "qwen3" in title


def test_bad_outputs(tmp_path, capsys):
    assert main(["plot", "--model", "gpt2", "-o", str(tmp_path / "x.jpg")]) == 2
    assert main(["plot", "--family", "olmoe", "-o", str(tmp_path / "x.png")]) == 2  # a family with no preset
    assert main(["plot", "--family", "gpt2", "--model", "gpt2", "-o", str(tmp_path / "x.png")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 3
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_file(tmp_path):
    class Broken:
        def savefig(self, f, format):
            f.write(b"half")
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save(Broken(), tmp_path / "x.png")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SymparamError):
        save(Broken(), tmp_path / "missing" / "x.png")
