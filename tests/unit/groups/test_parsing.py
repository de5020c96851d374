"""The one member-list parser and the mappings parser (core/groups/admin.py) that the
operators, the CLI and the admin API share."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.config import MemberMapping
from airflow_provider_cg.core.groups.membership import parse_mappings, parse_members


def test_members_from_text_lists_and_repeated_options():
    assert parse_members("members", "a, b,,c") == ["a", "b", "c"]
    assert parse_members("members", ["a,b", " c "]) == ["a", "b", "c"]  # --members a,b --members c
    assert parse_members("members", ("a",)) == ["a"]


@pytest.mark.parametrize(("value", "field"), [
    ("", "members"), (",", "members"), ([], "members"), ([" "], "members"), (None, "members"), (5, "members"),
    ([1], "members[0]"), (["a", None], "members[1]"), (["a b"], "members[0]"), (["ok", "x*"], "members[1]"),
    (["a.b"], "members[0]"),
])
def test_bad_member_lists_name_the_field(value, field):
    with pytest.raises(ConfigError) as e:
        parse_members("members", value)
    assert e.value.field == field


def test_mappings_in_both_shapes():
    want = [MemberMapping("m1", (0, 1)), MemberMapping("m2", (2,))]
    assert parse_mappings('{"m1": [0, 1], "m2": [2]}') == want
    assert parse_mappings('[{"member": "m1", "partitions": [0, 1]}, {"member": "m2", "partitions": [2]}]') == want
    for bad in ("[", "null", '"m1"', '[{"member": "m1"}]', '[{"member": "m1", "partitions": [0], "x": 1}]'):
        with pytest.raises(ConfigError) as e:
            parse_mappings(bad)
        assert e.value.field.startswith("member_mappings")
