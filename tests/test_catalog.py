"""The catalog of published models: every preset a supported family reads is exact per tensor against transformers,
answers to its Hub id in any case, and `list` shows what `symparam docs` last computed."""

from __future__ import annotations

import json

import pytest

from symparam.catalog import compute, index
from symparam.cli import main
from symparam.config import catalog, presets, read_preset

from families import hints
from oracle import oracle
from test_exact import assert_same

SUPPORTED = [e["name"] for e in index() if "family" in e]


def test_every_preset_is_in_the_catalog_and_every_entry_has_a_file():
    assert set(catalog()) == set(presets())


def test_the_index_list_reads_is_current():
    assert json.loads(compute()) == index(), "presets/_index.json is stale: run `symparam docs`"


@pytest.mark.parametrize("name", SUPPORTED)
def test_published_config_equals_transformers_per_tensor(name):
    config = read_preset(name)
    family = next(e["family"] for e in index() if e["name"] == name)
    assert_same(config, oracle(config, **hints(family).get("oracle", {})))


@pytest.mark.parametrize("name", [n for n in SUPPORTED if "hub" in catalog()[n]][:5])
def test_a_hub_id_names_its_preset_in_any_case(name, capsys):
    hub = catalog()[name]["hub"]
    assert main(["count", "--model", hub.swapcase(), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["name"] == name and data["total"] == next(e["total"] for e in index() if e["name"] == name)
