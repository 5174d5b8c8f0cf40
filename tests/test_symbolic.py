"""Symbolic sanity of the family expressions: reductions, identities, exactness and the SymPy API a user relies on."""

from __future__ import annotations

from pathlib import Path

import pytest
import sympy as sp

import symparam
from symparam.errors import SymparamError
from symparam.recipes import REGISTRY, load_recipe
from symparam.symbols import make, parse

from families import hints
from symparam.symbols import N, N_dense, V, d, d_ff, g, h, h_d, h_kv, k, n

FAMILIES = sorted(recipe.family for recipe in REGISTRY)
MOE_FAMILIES = sorted(f for f in FAMILIES if symparam.family(f).total != symparam.family(f).active)
# Families whose attention is bare projections by default: no biases, no q/k norms, no sinks.
PLAIN_GQA = ["gemma2", "llama", "mistral", "mixtral", "phi3"]
MHA_PER_HEAD = {h_d: d / h}  # h*h_d = d


def is_zero(expr: sp.Expr) -> bool:
    return sp.simplify(expr) == 0


def attention_per_layer(family: str) -> sp.Expr:
    return symparam.family(family).components["attention"] / N


@pytest.mark.parametrize("family", PLAIN_GQA)
def test_gqa_with_as_many_kv_heads_as_query_heads_is_mha(family):
    assert is_zero(attention_per_layer(family).subs(h_kv, h).subs(MHA_PER_HEAD) - 4 * d**2)


@pytest.mark.parametrize("family", PLAIN_GQA)
def test_attention_is_d2_times_2_plus_2_over_g_under_its_assumptions(family):
    grouped = attention_per_layer(family).subs(MHA_PER_HEAD).subs(h, g * h_kv)
    assert is_zero(grouped - d**2 * (2 + sp.Integer(2) / g))


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_moe_with_every_expert_active_has_active_equal_total(family):
    """Less what no token ever uses, where a family's hints say so (LongCat's zero-expert slices of gate_up_proj)."""
    model = symparam.family(family)
    idle = parse(hints(family).get("symbolic", {}).get("idle", 0), known=make)
    assert is_zero((model.total - model.active).subs(k, n) - idle)
    assert not is_zero(model.total - model.active), "with k < n some experts must be inactive"


def test_one_expert_moe_is_its_dense_ffn_plus_a_router():
    # Mixtral with n = k = 1 is Mistral with one router row of d per layer.
    mixtral, mistral = symparam.family("mixtral"), symparam.family("mistral")
    assert is_zero(mixtral.total.subs({n: 1, k: 1}) - mistral.total - N * d)
    assert is_zero(mixtral.active.subs({n: 1, k: 1}) - mistral.active - N * d)


@pytest.mark.parametrize("family", MOE_FAMILIES)
def test_inactive_parameters_are_never_negative(family):
    spare_experts, moe_layers = sp.Symbol("m", integer=True, nonnegative=True), sp.Symbol("L", integer=True, nonnegative=True)
    model = symparam.family(family)
    counted = [sp.Symbol(name, integer=True, positive=True) for name in model.recipe.layer_symbols]
    # every remainder N - (layer counts) is a number of layers: N is the layer counts plus L >= 0 more
    inactive = (model.total - model.active).subs({n: k + spare_experts, N: sp.Add(*counted) + moe_layers})
    assert sp.factor(sp.expand(inactive)).is_nonnegative


@pytest.mark.parametrize("family", FAMILIES)
def test_components_sum_to_total_and_active(family):
    model = symparam.family(family)
    assert is_zero(sp.Add(*model.components.values()) - model.total)
    assert is_zero(sp.Add(*model.active_components.values()) - model.active)


@pytest.mark.parametrize("family", FAMILIES)
def test_counts_are_exact_ints_beyond_10_to_the_12(family):
    model = symparam.family(family)
    # Large odd-ish sizes keep every term whole (h = h_kv, h | d); the embedding alone (V d) is past float's 2**53.
    big = {str(s): 3 for s in model.symbols} | {"V": 10**11 + 1, "d": 2**17 + 6, "d_ff": 10**6 + 1, "d_moe": 10**6 + 3, "h": 2, "h_kv": 2, "h_d": 2**16 + 3}
    big |= {"N": 100_003, "N_dense": 1, "n": 64, "k": 8, "P": 10**5 + 7}
    count = model.count({key: value for key, value in big.items() if key in map(str, model.symbols)})
    figures = [count.total, count.active, *count.components.values(), *count.active_components.values()]
    assert all(type(x) is int for x in figures)
    assert count.total > 10**12 and count.total > 2**53
    assert 0 < count.active <= count.total


def test_exact_int_against_a_hand_formula_where_floats_would_round():
    values = {"N": 999, "V": 2**40 + 1, "d": 2**20 + 1, "d_ff": 3 * 2**20 + 1, "h": 8, "h_kv": 2, "h_d": 2**17 + 1}
    N_, V_, d_, f_, h_, kv_, hd_ = values.values()
    # Llama: embedding and untied head V x d each; per layer q, o (d x h*h_d), k, v (d x h_kv*h_d), gate, up, down, two norms; final norm.
    expected = 2 * V_ * d_ + N_ * (2 * d_ * h_ * hd_ + 2 * d_ * kv_ * hd_ + 3 * d_ * f_ + 2 * d_) + d_
    total = symparam.load({"model_type": "llama", "vocab_size": V_, "hidden_size": d_, "num_hidden_layers": N_, "intermediate_size": f_,
                           "num_attention_heads": h_, "num_key_value_heads": kv_, "head_dim": hd_}).count().total
    assert type(total) is int and total == expected
    assert float(expected) != expected  # the figure is beyond what a float holds exactly


def test_users_can_subs_diff_and_lambdify():
    llama, gpt2 = symparam.family("llama"), symparam.family("gpt2")
    assert sp.diff(llama.total, V) == 2 * d  # input table and untied head
    assert sp.diff(gpt2.total, V) == d  # tied head: the table counts once
    assert sp.diff(llama.total, d_ff) == 3 * N * d  # gate, up, down
    llama_2_7b = {N: 32, V: 32000, d: 4096, d_ff: 11008, h: 32, h_kv: 32, h_d: 128}
    assert llama.total.subs(llama_2_7b) == 6_738_415_616  # DESIGN.md reference figure
    symbols = sorted(llama.total.free_symbols, key=str)
    assert sp.lambdify(symbols, llama.total)(*(llama_2_7b[s] for s in symbols)) == 6_738_415_616


def test_expressions_use_the_exported_canonical_symbols():
    free = set().union(*(symparam.family(f).total.free_symbols for f in FAMILIES))
    assert free <= set(symparam.symbols.SYMBOLS.values())
    assert symparam.symbols.N is N and symparam.symbols.h_kv is h_kv


PER_LAYER = Path(__file__).parent / "recipes" / "per_layer_heads.toml"
PER_LAYER_CONFIG = {"model_type": "perlayer", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 4, "num_hidden_layers": 3, "num_key_value_heads": 1,
                    "num_attention_heads": 2, "head_dim": 2, "layer_types": ["sliding_attention", "full_attention", "sliding_attention"]}


def test_a_size_read_per_layer_takes_each_kinds_value():
    model = symparam.load(PER_LAYER_CONFIG | {"heads_per_layer": [4, 2, 4]}, recipe=load_recipe(PER_LAYER))
    assert (model.values["h_swa"], model.values["h"]) == (4, 2)
    # by hand: two sliding layers of q and o with 4 heads of 2 over d = 8; one full layer of q, k, v, o (2, 1, 1, 2 heads)
    attention = 2 * (2 * 4 * 2 * 8) + (2 + 1 + 1 + 2) * 2 * 8
    assert model.count().components["attention"] == attention


def test_a_size_read_per_layer_that_differs_within_a_kind_is_an_error():
    with pytest.raises(SymparamError, match=r"^heads_per_layer: h_swa is 4 at layer 0 but 6 at layer 2, within the N_swa layers"):
        symparam.load(PER_LAYER_CONFIG | {"heads_per_layer": [4, 2, 6]}, recipe=load_recipe(PER_LAYER))
