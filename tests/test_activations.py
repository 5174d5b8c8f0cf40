"""Activation memory, exact per module: symparam's formula against what autograd saves in a real training forward of
every family's tiny random transformers model on CPU (saved_tensors_hooks, each storage once, parameters excluded),
for several batches and sequence lengths (a polynomial in B and S equal at more points than its degree is an
identity), in bf16 and fp32, with sdpa and eager attention, with and without activation checkpointing."""

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
# (dtype, attention, checkpointing, B, S): each mode at two sizes; S = 20 passes the tiny configs' window of 16
CASES = [
    ("bf16", "sdpa", False, 2, 5),
    ("bf16", "sdpa", False, 1, 20),
    ("fp32", "eager", False, 2, 5),
    ("fp32", "eager", False, 1, 9),
    ("fp32", "sdpa", False, 1, 7),
    ("bf16", "eager", True, 2, 6),
    ("bf16", "sdpa", True, 1, 20),
]


def compare(config: dict[str, Any], dtype: str, attention: str, checkpointing: bool, batch: int, seq: int) -> None:
    """Per module, then the total: a miss names the module."""
    model = symparam.load(config)
    mode = Mode(act=dtype, attention=attention)
    found = activations(model, mode, "full" if checkpointing else "none", {B: batch, S: seq})
    subs = {**as_subs(model.values), B: sp.Integer(batch), S: sp.Integer(seq)}
    mine = {name: int(expr.xreplace(subs)) for name, expr in found.by_module().items()}
    mine = {k: v for k, v in mine.items() if v}
    tree = frozenset(path for node, _, _, path in walk(model.tree) if not node.is_leaf)
    reference = saved_bytes(config, dtype, attention, checkpointing, batch, seq, modules=set(tree))
    assert mine == reference, "\n".join(f"{k}: symparam {mine.get(k, 0):,}, autograd {reference.get(k, 0):,}"
                                        for k in sorted(set(mine) | set(reference)) if mine.get(k) != reference.get(k))


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
@pytest.mark.parametrize("family", FAMILIES)
def test_activations_equal_what_autograd_saves(family: str, case: tuple) -> None:
    compare(tiny_config(family), *case)


@pytest.mark.parametrize("family", FAMILIES)
def test_random_configs(family: str) -> None:
    """Random small configs of the family (sizes, switches, layer patterns), bf16 with sdpa and fp32 with eager."""
    @settings(max_examples=3, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(random_config(family))
    def check(config: dict[str, Any]) -> None:
        compare(config, "bf16", "sdpa", False, 2, 5)
        compare(config, "fp32", "eager", False, 1, 6)

    check()
