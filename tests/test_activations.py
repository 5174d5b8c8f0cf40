"""Activation memory, exact per module: symparam's formula against what autograd saves in a real training forward of
every family's tiny random transformers model on CPU (saved_tensors_hooks, each storage once, parameters excluded),
in bf16 and fp32, with sdpa and eager attention, with and without activation checkpointing, each at several batch
sizes and sequence lengths: the formula is a polynomial in B and S of degree at most 2 in S and 1 in B, so equal at
these points it is the same polynomial (within the regime its branches took, e.g. S <= W)."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
import sympy as sp
from hypothesis import HealthCheck, given, settings

import symparam
from symparam.components import walk
from symparam.config import as_subs
from symparam.memory.activations import activations
from symparam.memory.trace import Mode
from symparam.recipes import REGISTRY
from symparam.symbols import B, S

from families import random_config, tiny_config
from oracle import saved_bytes

logging.getLogger("transformers").setLevel(logging.ERROR)
warnings.filterwarnings("ignore")

FAMILIES = sorted(r.family for r in REGISTRY if r.family != "classic")  # classic's oracle is torch.nn, not transformers
POINTS = ((1, 5), (2, 5), (1, 7), (1, 9))  # (B, S) below the tiny configs' window of 16
LONG = ((1, 17), (2, 17), (1, 19), (1, 21))  # past it: sliding layers mask and keep only the window
MODES = {  # name -> (dtype, attention, checkpointing, points)
    "bf16-sdpa": ("bf16", "sdpa", False, POINTS),
    "bf16-sdpa-long": ("bf16", "sdpa", False, LONG),
    "fp32-eager": ("fp32", "eager", False, POINTS),
    "bf16-sdpa-checkpointing": ("bf16", "sdpa", True, POINTS[:2]),
}


def compare(config: dict[str, Any], dtype: str, attention: str, checkpointing: bool, points) -> None:
    """Per module, then the total, at each (B, S): a miss names the module and the point."""
    model = symparam.load(config)
    tree = {path for node, _, _, path in walk(model.tree) if not node.is_leaf}
    mode = Mode(act=dtype, attention=attention)
    found = activations(model, mode, "full" if checkpointing else "none", {B: points[0][0], S: points[0][1]})
    formulas = found.by_module()
    for batch, seq in points:
        subs = {**as_subs(model.values), B: sp.Integer(batch), S: sp.Integer(seq)}
        if not all(bool(a.xreplace(subs)) for a in found.assumed):  # another regime (B = 1 lets a transposed input fold as a view)
            found = activations(model, mode, "full" if checkpointing else "none", {B: batch, S: seq})
            formulas = found.by_module()
        mine = {name: int(expr.xreplace(subs)) for name, expr in formulas.items()}
        mine = {k: v for k, v in mine.items() if v}
        reference = saved_bytes(config, dtype, attention, checkpointing, batch, seq, modules=tree)
        assert mine == reference, f"B={batch}, S={seq}:\n" + "\n".join(
            f"  {k}: symparam {mine.get(k, 0):,}, autograd {reference.get(k, 0):,}" for k in sorted(set(mine) | set(reference)) if mine.get(k) != reference.get(k))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("family", FAMILIES)
def test_activations_equal_what_autograd_saves(family: str, mode: str) -> None:
    compare(tiny_config(family), *MODES[mode])


@pytest.mark.parametrize("family", FAMILIES)
def test_random_configs(family: str) -> None:
    """Random small configs of the family (sizes, switches, layer patterns)."""

    @settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(random_config(family))
    def check(config: dict[str, Any]) -> None:
        compare(config, "bf16", "sdpa", False, POINTS[:3])

    check()
