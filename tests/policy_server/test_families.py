"""The model-family registry: looked up by name and by a model directory's config.json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from policy_server.models.families import (
    HERMES,
    UnknownFamilyError,
    family,
    family_for_model_type,
    family_names,
    family_of,
)


def test_every_registered_family_is_found_by_its_name_and_by_each_of_its_model_types() -> None:
    for name in family_names():
        found = family(name)
        assert found.name == name
        for model_type in found.model_types:
            assert family_for_model_type(model_type) is found


def test_no_model_type_belongs_to_two_families() -> None:
    owners: dict[str, str] = {}
    for name in family_names():
        for model_type in family(name).model_types:
            assert model_type not in owners, f"{model_type} is claimed by {owners[model_type]} and {name}"
            owners[model_type] = name


def test_the_tiny_models_are_found_as_the_families_that_built_them(tiny_model_dir: Path) -> None:
    assert family_of(tiny_model_dir) is family("llama")


def test_an_unknown_name_is_refused_with_the_known_ones() -> None:
    with pytest.raises(UnknownFamilyError, match=r"unknown model family 'mamba'; choose one of: llama, "):
        family("mamba")


def test_a_model_type_no_family_covers_has_no_family_and_is_served_as_hermes(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "phi3"}))
    assert family_of(tmp_path) is None
    assert HERMES.parse_text('<tool_call>{"name": "f", "arguments": {}}</tool_call>', tools=True).tool_calls


def test_a_directory_without_config_names_the_file_it_could_not_read(tmp_path: Path) -> None:
    with pytest.raises(UnknownFamilyError, match=r"cannot read the model's family from .*config.json"):
        family_of(tmp_path)


def test_the_fallback_builds_no_tiny_model_and_says_which_do(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"name a registered family \(rft model tiny DIR --family NAME\)"):
        HERMES.build_tiny(tmp_path / "model")
