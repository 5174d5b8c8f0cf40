"""The derivation's mathematics: steps compose to the exact count, closed forms hold under their assumptions, errata are computed."""

from pathlib import Path

import pytest
import sympy as sp

import symparam
from symparam.config import presets
from symparam.derive import ASSUMPTIONS, derive, simplify_under
from symparam.errors import SymparamError
from symparam.examples import examples
from symparam.recipes import REGISTRY, load_recipe
from symparam.symbols import d, g, h, h_d, h_kv

PRESETS = list(presets())


@pytest.mark.parametrize("name", PRESETS)
def test_steps_compose_to_the_exact_count(name):
    model = symparam.load(name)
    der = derive(model)
    count = model.count()
    assert (der.total_value, der.active_value) == (count.total, count.active)
    assert der.steps[0].value == count.total and der.steps[0].active_value == count.active
    assert sum(r.total for r in der.rows) == count.total
    values = model.substitution()
    for step in der.steps:  # a step's formula, each sub-step put in (none where the config has no copies), is its value
        parts = {r.placeholder: der.steps[r.step].expanded if r.step is not None else 0 for r in step.refs}
        assert step.formula.doit().xreplace(parts).xreplace(values) == step.value
        assert sp.expand(step.written.doit() - step.expanded) == 0


@pytest.mark.parametrize("recipe", list(REGISTRY), ids=lambda r: r.family)
def test_closed_form_equals_general_form_under_its_assumptions(recipe):
    der = derive(symparam.Model(recipe))
    c = der.closed
    back = c.simplified.doit().xreplace({g: h / h_kv}).xreplace({d: h * h_d})
    assert sp.simplify(back - c.general.xreplace({d: h * h_d})) == 0


def test_attention_is_d2_2_plus_2_over_g():
    der = derive(symparam.family("llama"))
    attention = next(s for s in der.steps if s.title == "attention")
    assert sp.simplify(attention.closed.simplified.doit() - d**2 * (2 + 2 / g)) == 0
    assert [a.key for a in attention.closed.assumptions] == ["heads_tile_d", "grouped_heads"]


def test_purely_symbolic_without_a_config():
    der = derive(symparam.family("qwen3"))
    assert der.values is None and der.total_value is None and der.closed.applies is None
    assert all(s.value is None for s in der.steps)


@pytest.mark.parametrize("name, applies", [("qwen3-8b", True), ("qwen3-32b", False), ("qwen3-235b-a22b", False), ("qwen2.5-3b", True)])
def test_configs_that_break_h_hd_equals_d_are_detected(name, applies):
    c = derive(symparam.load(name)).closed
    assert c.applies is applies
    if not applies:
        (broken,) = c.broken
        assert broken.assumption.key == "heads_tile_d" and broken.lhs != broken.rhs
        assert c.simplified_value != c.value  # and the general form is what counts


def test_estimate_mistral():
    e = derive(symparam.load("mistral-7b")).estimate
    assert e.value == 2 * 32000 * 4096 + 32 * (4 * 4096**2 + 3 * 4096 * 14336) == 8_046_772_224
    assert e.exact == 7_241_732_096
    assert {c.key: c.broken for c in e.checks} == {"untied_head": False, "mha_attention": True, "gated_ffn": False, "minor_terms": True}


def test_tied_head_breaks_the_estimate():
    e = derive(symparam.load("gpt2")).estimate
    assert {c.key: c.broken for c in e.checks}["untied_head"] is True


def test_assumptions_are_data():
    assert [(a.lhs, a.rhs) for a in ASSUMPTIONS] == [(h * h_d, d), (h, g * h_kv)]
    simplified, used = simplify_under([2 * d * h * h_d, 2 * d * h_kv * h_d, 2 * h_d])
    assert simplified == [d**2 * (2 + 2 / g), 2 * h_d] and len(used) == 2  # the lower-order 2h_d stays readable


def test_errata_are_computed():
    claims = {(e.preset, c.what): c for e in examples() for c in e.claims}
    assert claims[("qwen3-235b-a22b", "active (stated figure)")].exact == 22_190_763_520
    assert claims[("qwen3-235b-a22b", "total (stated figure)")].status == "exact"
    assert claims[("qwen3-8b", "total")].exact == 8_190_735_360
    assert claims[("qwen2.5-3b", "embedding V d")].exact == 151936 * 2048
    assert claims[("qwen3-32b", "total of the engine")].status == "exact"
    assert claims[("classic-512", "total")].status == claims[("classic-512-tied", "total")].status == "exact"
    assert claims[("gpt2", "total, 50000 x 768 + (768 x 768 x 3 + 768 x 768 + 768 x 3072 x 2) x 12")].stated_value == 123_334_656


def test_router_erratum_reproduces_the_stated_active_count():
    claim = next(c for e in examples() for c in e.claims if (e.preset, c.what) == ("qwen3-235b-a22b", "active (stated figure)"))
    v = symparam.load("qwen3-235b-a22b").values
    k_rows = claim.exact - v["N"] * (v["n"] - v["k"]) * v["d"]  # only k of the n router rows per layer
    assert k_rows == claim.stated_value
    assert f"exact active minus N(n - k)d = {k_rows:,})" in claim.why


def test_a_fraction_is_an_error_naming_the_tensor(tmp_path):
    toml = (Path(symparam.__file__).parent / "recipes" / "olmoe.toml").read_text(encoding="utf-8")
    path = tmp_path / "thirds.toml"
    path.write_text(toml.replace('size = "d_ff"', 'size = "d_ff/3"'), encoding="utf-8")
    values = dict(N=2, V=10, d=8, h=2, h_kv=2, h_d=4, n=4, k=2, d_ff=7)
    with pytest.raises(SymparamError, match=r"^olmoe-thirds: model\.layers\.mlp\.experts\.gate_up_proj: 112/3 is not a whole number"):
        derive(symparam.Model(load_recipe(path), values=values, name="olmoe-thirds"))


def test_the_documents_formulas_are_symparams_expressions():
    """Typed in from the source documents where they are right; symparam's expressions must equal them exactly."""
    from symparam.symbols import N, N_dense, V, d_ff, d_moe, n

    # 003: Qwen3ForCausalLM and Qwen3MoeForCausalLM (its d_ff of an expert is our d_moe), total
    qwen3 = N * (2 * d + 3 * d * d_ff + 2 * h * h_d * d + 2 * h_kv * h_d * d + 2 * h_d) + d * (2 * V + 1)
    qwen3_moe = N * (2 * d + n * d + 3 * n * d * d_moe + h * h_d * d + 2 * h_kv * h_d * d + d * h * h_d + 2 * h_d) + d * (2 * V + 1)
    assert sp.expand(symparam.family("qwen3").total - qwen3) == 0
    assert sp.expand(symparam.family("qwen3_moe").total.subs(N_dense, 0) - qwen3_moe) == 0
    # ... and so is the chain symparam prints, line by line
    for line in derive(symparam.family("qwen3")).chain.lines[-1:]:
        assert sp.expand(sp.Add(*line).doit() - qwen3) == 0
    # 001: GQA self-attention per layer, 2 H d_head n_head + 2 H d_head n_head_kv = H^2 (2 + 2/group_size)
    llama = derive(symparam.family("llama"))
    attention = next(s for s in llama.steps if s.title == "attention")
    assert sp.expand(attention.expanded - (2 * d * h_d * h + 2 * d * h_d * h_kv)) == 0
    assert sp.expand(attention.closed.simplified.doit() - d**2 * (2 + 2 / g)) == 0
    # 000: the classic model, untied, FFN 4d, LayerNorms of gamma and beta, no final norm: 57,987,072 at its config
    classic = symparam.load("classic-512")
    stated = 2 * V * d + N * ((4 * d * d + 4 * d) + (d * 4 * d + 4 * d * d + 4 * d + d) + 2 * (2 * d))
    assert sp.expand(classic.total.subs(d_ff, 4 * d) - stated) == 0
    assert classic.count().total == 57_987_072 == stated.subs({V: 32000, d: 512, N: 8})


def test_the_chain_reads_like_the_document():
    from symparam.render import text

    der = derive(symparam.load("qwen3-8b"))
    lines = [" + ".join(text(x) for x in line) for line in der.chain.lines]
    assert lines[-1] == "N*(2*d*h*h_d + 2*d*h_d*h_kv + 3*d*d_ff + 2*d + 2*h_d) + d*(2*V + 1)"
    assert der.chain.value == 8_190_735_360
    for line in der.chain.lines:  # each line equals the count once the placeholders are put in
        steps = {s.placeholder: s.expanded for s in der.steps}
        assert sp.expand(sp.Add(*line).doit().xreplace(steps) - der.total) == 0
    moe = derive(symparam.load("qwen3-235b-a22b"))
    assert moe.active_chain.value == 22_190_763_520 and "k" in text(moe.active_chain.lines[-1][-2])
    closed = text(derive(symparam.family("qwen3")).closed.simplified)
    assert closed == "N*(d**2*(2 + 2/g) + 3*d*d_ff + 2*d + 2*h_d) + d*(2*V + 1)"  # 2*h_d, not 2*d/(g*h_kv)


def test_only_what_the_model_has():
    """Qwen3-235B-A22B builds no dense layer: no N_dense and no dense FFN anywhere in its derivation or count table."""
    from symparam import cli
    from symparam.render import render

    model = symparam.load("qwen3-235b-a22b")
    assert "N_dense" not in str(model.total)
    der = derive(model)
    md = render(der, "markdown", "en")
    assert "N_{dense}" not in md and "dense FFN" not in md and "dense decoder layer" not in md
    assert all(r.total for r in der.rows if not r.tied)
    out = cli.parser().parse_args(["count", "--model", "qwen3-235b-a22b"])
    table = out.run(out)
    assert "dense FFN" not in table and "N_dense" not in table
    # the family-level derivation keeps the general form
    assert "N_{dense}" in render(derive(symparam.family("qwen3_moe")), "markdown", "en")


def test_counts_print_from_exact_integers_at_any_size(capsys):
    from symparam import cli

    assert cli.main(["count", "--model", "qwen3-8b", "--set", "d=4096000000000000"]) == 0
    out = capsys.readouterr().out
    total = symparam.load("qwen3-8b", {"d": 4_096_000_000_000_000}).count().total
    whole, frac = divmod(total * 100 // 10**9 + (1 if total * 100 % 10**9 * 2 >= 10**9 else 0), 100)
    assert f"{total:,}  ({whole:,}.{frac:02d} B)" in out
    assert "e+" not in out and "e1" not in out
