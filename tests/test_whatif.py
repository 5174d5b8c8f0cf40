"""whatif: solve against brute force, sensitivities against finite differences, sweeps against per-config counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from symparam import SymparamError, load
from symparam.cli import main
from symparam.config import read_preset
from symparam.recipes import REGISTRY
from symparam.whatif import derived, grid, sensitivities, solve, sweep, sweep_config

LLAMA = dict(N=4, V=1000, h=8, h_kv=2, d_ff=512)  # d to solve for; h_d follows d (= d/h)


def exact_total(family: str, values: dict[str, int]) -> int:
    """The count by the ordinary path: a config built from symbols, resolved and counted."""
    return load({"model_type": REGISTRY.family(family).model_types[0]}, overrides=values).count().total


def brute_force(family: str, symbol: str, fixed: dict[str, int], target: int, values: range, config: dict | None = None) -> int:
    """The allowed value closest to target, by trying every value (d a multiple of h, h of h_kv), ties to the smaller.

    Each total is the ordinary count: the family's bare config (or `config`) resolved with the trial values set."""
    best = None
    for v in values:
        trial = {**fixed, symbol: v}
        if trial.get("d", 0) % trial.get("h", 1) or trial.get("h", 0) % trial.get("h_kv", 1):
            continue
        try:
            total = exact_total(family, trial) if config is None else load(config, overrides=trial).count().total
        except SymparamError:
            continue
        if best is None or abs(total - target) < abs(best[1] - target):
            best = (v, total)
    return best


@pytest.mark.parametrize("target", [2_000_000, 3_333_333, 10**7])
def test_solve_d_is_the_closest_allowed_value(target):
    sol = solve(REGISTRY.family("llama"), "d", target, {}, LLAMA)
    assert sol.best == brute_force("llama", "d", LLAMA, target, range(8, 2000, 1))
    assert all(v % LLAMA["h"] == 0 for v, _ in sol.candidates)
    assert "d**2" in str(sol.equation)  # h_d = d/h makes attention quadratic in d


@pytest.mark.parametrize("symbol,span", [("N", range(1, 60)), ("h_kv", range(1, 9)), ("d_ff", range(1, 4000))])
def test_solve_other_symbols(symbol, span):
    fixed = {**LLAMA, "d": 256}
    fixed.pop(symbol)
    target = 5_000_000
    sol = solve(REGISTRY.family("llama"), symbol, target, {}, fixed)
    assert sol.best == brute_force("llama", symbol, fixed, target, span)


def test_solve_from_a_preset_keeps_its_head_dim():
    config = read_preset("qwen3-8b")
    sol = solve(REGISTRY.family("qwen3"), "N", 7 * 10**9, config, {})
    assert sol.follows == {}
    assert sol.best == brute_force("qwen3", "N", {}, 7 * 10**9, range(1, 80), config) == (30, 7_033_056_768)


def qwen3_moe_every_second_layer() -> dict:
    """Qwen3-235B-A22B with decoder_sparse_step=2: every second layer dense, so N_dense follows N (about N/2)."""
    return {**read_preset("qwen3-235b-a22b"), "decoder_sparse_step": 2, "num_hidden_layers": 48}


@pytest.mark.parametrize("target", [3 * 10**9, 10**10])
def test_solve_N_below_and_above_first_k_dense_replace(target):
    config = read_preset("deepseek-v3")  # first_k_dense_replace = 3: N_dense = min(3, N)
    sol = solve(REGISTRY.family("deepseek_v3"), "N", target, config, {})
    assert sol.best == brute_force("deepseek_v3", "N", {}, target, range(1, 40), config)
    assert sol.rules == {"N_dense": min(3, sol.best[0])}
    assert all(t == load(config, overrides={"N": v}).count().total for v, t in sol.candidates)
    if target == 3 * 10**9:
        assert sol.best[0] == 2  # fewer layers than first_k_dense_replace


def test_solve_N_when_every_second_layer_is_dense():
    config = qwen3_moe_every_second_layer()
    target = 10**11
    sol = solve(REGISTRY.family("qwen3_moe"), "N", target, config, {})
    assert sol.best == brute_force("qwen3_moe", "N", {}, target, range(1, 120), config)
    assert sol.rules == {"N_dense": (sol.best[0] + 1) // 2}  # layers 0, 2, 4, ... stay dense


def test_solve_cli_for_N_below_first_k_dense_replace(capsys):
    assert main(["solve", "--model", "deepseek-v3", "--for", "N", "--target", "3B", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["best"] == {"value": 2, "total": load("deepseek-v3", overrides={"N": 2}).count().total}


def test_solve_errors():
    with pytest.raises(SymparamError, match="does not depend"):
        solve(REGISTRY.family("llama"), "n", 10**6, {}, {**LLAMA, "d": 256})
    with pytest.raises(SymparamError, match="unknown symbol"):
        solve(REGISTRY.family("llama"), "zz", 10**6, {}, LLAMA)


@pytest.mark.parametrize("preset", ["qwen3-8b", "mixtral-8x7b", "gpt2", "deepseek-v3"])
def test_sensitivity_is_the_finite_difference(preset):
    model = load(preset)
    for s in sensitivities(model):
        if s.symbol == "N_dense":
            continue  # set by the layout rule, not by --set
        base = model.values[s.symbol]
        up, down = ({**model.values, s.symbol: base + step} for step in (1, -1))
        f = lambda values: model.count(values).total  # noqa: E731  exact counts at neighbouring values
        assert s.step == f(up) - f(model.values)
        # central differences are exact for polynomials of degree <= 2, which these totals are in each symbol
        assert 2 * s.at == f(up) - f(down)


def test_sensitivity_follows_derived_head_dim():
    model = load({"model_type": "llama"}, overrides={**LLAMA, "d": 256})
    formulas = derived(model.recipe, {}, LLAMA)
    [s] = sensitivities(model, formulas, ["d"])
    counts = [exact_total("llama", {**LLAMA, "d": d}) for d in (248, 256, 264)]  # h_d = d/h must stay whole
    assert 16 * s.at == counts[2] - counts[0]  # quadratic in d: the central difference over +-8 is exact


def test_sweep_equals_per_config_counts():
    rng = np.random.default_rng(0)
    model = load("mixtral-8x7b")
    h_kv = rng.choice([1, 2, 4, 8], 40)
    columns = {"d": rng.integers(1, 64, 40) * 64, "N": rng.integers(1, 80, 40), "h_kv": h_kv, "n": rng.integers(1, 16, 40) + 2, "V": rng.integers(1000, 200_000, 40)}
    result = sweep(model, columns)
    assert result["total"].dtype == np.int64
    for i in range(40):
        row = {**model.values, **{k: int(v[i]) for k, v in columns.items()}}
        count = model.count(row)
        assert (result["total"][i], result["active"][i]) == (count.total, count.active)


def test_sweep_derives_head_dim_per_row_and_refuses_fractions():
    model = load({"model_type": "llama"}, overrides={**LLAMA, "d": 256})
    formulas = derived(model.recipe, {}, LLAMA)
    d = np.array([64, 128, 1024])
    totals = sweep(model, {"d": d}, formulas)["total"]
    assert list(totals) == [exact_total("llama", {**LLAMA, "d": int(x)}) for x in d]
    with pytest.raises(SymparamError, match="not a whole number"):
        sweep(model, {"d": np.array([100])}, formulas)


def test_overflow_guard():
    model = load("qwen3-8b")
    huge = {"N": np.array([36, 10**12]), "d": np.array([4096, 4096])}
    with pytest.raises(SymparamError, match="beyond int64"):
        sweep(model, huge, on_overflow="raise")
    result = sweep(model, huge)  # falls back to exact Python integers
    assert result["total"].dtype == object
    assert [int(x) for x in result["total"]] == [model.count({**model.values, "N": n}).total for n in (36, 10**12)]
    assert result["total"][1] > 2**63


def test_grid():
    columns = grid({"d": "1024:4096:1024", "N": "12,24"})
    assert list(columns["d"]) == [1024, 1024, 2048, 2048, 3072, 3072, 4096, 4096] and list(columns["N"]) == [12, 24] * 4


def test_cli(tmp_path, capsys):
    assert main(["solve", "--arch", "llama", "--target", "7e9", "--for", "d", "--set", "N=32", "V=32000", "h=32", "h_kv=8", "d_ff=11008", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["best"]["value"] % 32 == 0 and payload["equation"] == "80*d**2 + 1120833*d"
    assert main(["sensitivity", "--model", "qwen3-8b", "--for", "d", "N"]) == 0
    assert "3*N*d_ff" in capsys.readouterr().out
    (tmp_path / "in.csv").write_text("d,N\n4096,36\n2048,24\n")
    assert main(["sweep", "--model", "qwen3-8b", "--csv", str(tmp_path / "in.csv"), "-o", str(tmp_path / "out.csv")]) == 0
    lines = (tmp_path / "out.csv").read_text().splitlines()
    assert lines[0] == "d,N,total,active" and lines[1] == "4096,36,8190735360,8190735360"
    assert main(["sweep", "--model", "qwen3-8b", "--grid", "d=4096", "N=1000000000000", "--on-overflow", "raise"]) == 2
    assert main(["solve", "--arch", "llama", "--target", "lots", "--for", "d"]) == 2


def count_rows(config: dict, columns: dict[str, list[int]], sets: dict[str, int] | None = None) -> list[tuple[int, int]]:
    """(total, active) per row by the ordinary path: the config resolved with the row set, then counted."""
    rows = len(next(iter(columns.values())))
    out = []
    for i in range(rows):
        count = load(config, overrides={**(sets or {}), **{k: int(v[i]) for k, v in columns.items()}}).count()
        out.append((count.total, count.active))
    return out


def test_sweep_deepseek_v3_N_row_by_row():
    config = read_preset("deepseek-v3")  # N_dense = min(first_k_dense_replace, N) must follow each row's N
    columns = {"N": [61, 2, 1, 3, 4, 2, 10]}
    result = sweep_config(REGISTRY.family("deepseek_v3"), config, columns)
    assert list(zip(result["total"].tolist(), result["active"].tolist())) == count_rows(config, columns)
    assert all(t > 0 for t in result["total"].tolist())


def test_sweep_qwen3_moe_every_second_layer_row_by_row():
    config = qwen3_moe_every_second_layer()
    columns = grid({"N": "1:9", "d": "2048,4096"})
    result = sweep_config(REGISTRY.family("qwen3_moe"), config, columns)
    assert list(zip(result["total"].tolist(), result["active"].tolist())) == count_rows(config, columns)


def test_sweep_cli_rows_are_what_count_gives(capsys):
    assert main(["sweep", "--model", "deepseek-v3", "--grid", "N=61,2", "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert list(zip(payload["total"], payload["active"])) == count_rows(read_preset("deepseek-v3"), {"N": [61, 2]})


@pytest.mark.parametrize("spec,message", [
    ("k=2,9", "row 1: num_experts_per_tok: 9 is more than the 8 experts"),
    ("N=1,0", "row 1: N = 0: expected a positive integer"),
    ("h_kv=32,5", "row 1: num_key_value_heads: 5 does not divide num_attention_heads 32"),
    ("N=0,1", "row 0: N = 0: expected a positive integer"),
])
def test_sweep_refuses_a_bad_row_naming_it(spec, message, capsys):
    name, values = spec.split("=")
    with pytest.raises(SymparamError, match=message):
        sweep_config(REGISTRY.family("mixtral"), read_preset("mixtral-8x7b"), grid({name: values}))
    assert main(["sweep", "--model", "mixtral-8x7b", "--grid", spec]) == 2
    err = capsys.readouterr().err
    assert message in err and "--set" not in err and len(err.strip().splitlines()) == 1


def test_sweep_on_a_model_checks_every_row():
    model = load("deepseek-v3")  # the model's own N_dense = 3 stays: a row with fewer layers is refused, not negative
    with pytest.raises(SymparamError, match="row 1: N_dense = 3 .* is more than the N = 2 layers"):
        sweep(model, {"N": np.array([61, 2])})
    with pytest.raises(SymparamError, match="row 2: num_experts_per_tok: 9 is more than the 8 experts"):
        sweep(load("mixtral-8x7b"), {"k": np.array([1, 2, 9])})


def test_derived_reads_the_recipes_own_keys():
    gpt2 = REGISTRY.family("gpt2")  # GPT-2 reads d_ff from n_inner only; intermediate_size is not its field
    assert "d_ff" not in derived(gpt2, {"n_inner": 1000})
    assert "d_ff" in derived(gpt2, {"intermediate_size": 1000})
