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
    with pytest.raises(SymparamError, match=r"^olmoe-thirds: model\.layers\..*gate_proj\.weight: 56/3 is not a whole number"):
        derive(symparam.Model(load_recipe(path), values=values, name="olmoe-thirds"))
