"""whatif: solve against brute force, sensitivities against finite differences, sweeps against per-config counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from symparam import SymparamError, load
from symparam.cli import main
from symparam.recipes import REGISTRY
from symparam.whatif import derived, grid, sensitivities, solve, sweep

LLAMA = dict(N=4, V=1000, h=8, h_kv=2, d_ff=512)  # d to solve for; h_d follows d (= d/h)


def exact_total(family: str, values: dict[str, int]) -> int:
    """The count by the ordinary path: a config built from symbols, resolved and counted."""
    return load({"model_type": REGISTRY.family(family).model_types[0]}, overrides=values).count().total


def brute_force(family: str, symbol: str, fixed: dict[str, int], target: int, values: range) -> int:
    """The allowed value closest to target, by trying every value (d a multiple of h, h of h_kv), ties to the smaller."""
    best = None
    for v in values:
        trial = {**fixed, symbol: v}
        if trial.get("d", 0) % trial.get("h", 1) or trial.get("h", 0) % trial.get("h_kv", 1):
            continue
        try:
            total = exact_total(family, trial)
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
    config = json.loads((__import__("symparam.config", fromlist=["presets"]).presets()["qwen3-8b"]).read_text())
    sol = solve(REGISTRY.family("qwen3"), "N", 7 * 10**9, config, {})
    assert sol.follows == {} and sol.best[0] in (30, 31)
    assert sol.best[1] == load(config, overrides={"N": sol.best[0]}).count().total


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
