"""The offline ``cg`` commands (``plan``, ``hash``) and argument handling, through ``main``."""

from __future__ import annotations

import io
import json

import pytest

from airflow_provider_cg.core.tools.cli import main
from airflow_provider_cg.core.tools.cli_text import ranges, table


def run(*argv: str, stdin: str | None = None) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    rc = main(list(argv), stdout=out, stderr=err, stdin=io.StringIO(stdin) if stdin is not None else None)
    return rc, out.getvalue(), err.getvalue()


def test_plan_shows_each_members_partitions():
    rc, out, err = run("plan", "--max-members", "8", "--members", "m3,m1", "--members", "m2")
    assert (rc, err) == (0, "")
    assert out.splitlines() == [
        "MEMBER  PARTITIONS  COUNT",
        "m1      0-1,6       3",
        "m2      2-3,7       3",
        "m3      4-5         2",
    ]


def test_plan_json_and_members_beyond_max_members():
    rc, out, _ = run("plan", "--max-members", "2", "--members", "c,a,b", "--json")
    assert rc == 0
    assert json.loads(out) == {"max_members": 2, "assignment": {"a": [0], "b": [1], "c": []}}


def test_plan_next_members_lists_the_moves():
    rc, out, _ = run("plan", "--max-members", "4", "--members", "m1,m2", "--next-members", "m1,m2,m3,m4", "--json")
    assert rc == 0
    data = json.loads(out)
    assert data["assignment"] == {"m1": [0, 1], "m2": [2, 3]}
    assert data["next_assignment"] == {"m1": [0], "m2": [1], "m3": [2], "m4": [3]}
    assert data["moves"] == [
        {"partition": 1, "from": "m1", "to": "m2"},
        {"partition": 2, "from": "m2", "to": "m3"},
        {"partition": 3, "from": "m2", "to": "m4"},
    ]
    assert data["moved"] == {"block": 3, "sticky": 2}
    rc, out, _ = run("plan", "--max-members", "4", "--members", "m1,m2", "--next-members", "m1,m2,m3,m4")
    lines = out.splitlines()
    assert lines[:3] == ["MEMBER  PARTITIONS  NEXT (BLOCK)  NEXT (STICKY)", "m1      0-1         0             0",
                         "m2      2-3         1             2"]
    assert "partitions that move: block 3, sticky 2 (of 4)" in lines and "block: 3 of 4 partitions move:" in lines
    assert lines[-3:] == ["1          m1    m2", "2          m2    m3", "3          m2    m4"]


def test_plan_sticky_moves_only_what_must_move():
    data = json.loads(run("plan", "--max-members", "12", "--members", "m1,m2,m3", "--next-members", "m1,m2,m3,m4",
                          "--assignment", "sticky", "--json")[1])
    assert data["next_assignment"] == {"m1": [0, 1, 2], "m2": [4, 5, 6], "m3": [8, 9, 10], "m4": [3, 7, 11]}
    assert [m["to"] for m in data["moves"]] == ["m4"] * 3 and data["moved"] == {"block": 6, "sticky": 3}


def test_plan_with_mappings_and_nothing_moving():
    mappings = '[{"member":"x","partitions":[1,0]},{"member":"y","partitions":[2]}]'
    rc, out, _ = run("plan", "--max-members", "3", "--mappings", mappings, "--next-mappings", '{"x":[0,1],"y":[2]}')
    assert rc == 0
    assert out.splitlines()[-1] == "no partition moves"
    rc, out, _ = run("plan", "--max-members", "3", "--members", "a", "--next-mappings", '{"a":[0],"b":[1,2]}', "--json")
    assert json.loads(out)["moves"] == [{"partition": 1, "from": "a", "to": "b"}, {"partition": 2, "from": "a", "to": "b"}]


@pytest.mark.parametrize(
    "argv, field",
    [
        (["plan", "--max-members", "0", "--members", "a"], "max_members"),
        (["plan", "--max-members", "2", "--members", "a", "--mappings", '{"a":[0,1]}'], "member_mappings"),
        (["plan", "--max-members", "2", "--mappings", '{"a":[0]}'], "member_mappings"),
        (["plan", "--max-members", "2", "--mappings", "not json"], "member_mappings"),
        (["plan", "--max-members", "2", "--members", "a.b"], "members[0]"),
        (["plan", "--max-members", "two"], "max-members"),
        (["plan"], "max-members"),
        (["hash", "--partitions", "0", "x"], "partitions"),
        (["hash", "--partitions", "2", "--wildcards", "1", "foo.a"], "wildcards"),
        (["hash", "--partitions", "2", "--filter", "foo.*", "--wildcards", "2", "foo.a"],
         "partitioning_filters[0].partitioning_wildcards[0]"),
        (["hash", "--partitions", "2", "--filter", "foo.*", "--wildcards", "1", "bar.a"], "subject"),
        (["hash", "--partitions", "2", "foo.*"], "subject"),
        (["hash", "--partitions", "2", "--wildcards", "x", "--filter", "foo.*", "foo.a"], "wildcards"),
        (["hash", "--partitions", "2"], "SUBJECT"),
        ([], "COMMAND"),
        (["frobnicate"], "COMMAND"),
    ],
)
def test_invalid_input_exits_1_naming_the_field(argv, field):
    rc, out, err = run(*argv)
    assert rc == 1 and out == ""
    assert err.startswith(f"cg: error: {field}: "), err
    assert err.count("\n") == 1


def test_hash_agrees_with_the_servers_values():
    rc, out, _ = run("hash", "--partitions", "10", "foo", "baz", "qux", "foo.bar", "foo.baz", "--json")
    assert rc == 0
    assert {r["subject"]: r["partition"] for r in json.loads(out)} == {
        "foo": 3, "baz": 0, "qux": 9, "foo.bar": 6, "foo.baz": 4
    }
    rc, out, _ = run("hash", "--partitions", "5", "test.subject")
    assert out.splitlines() == ["SUBJECT       PARTITION", "test.subject  0"]


def test_hash_with_filter_wildcards_and_stdin():
    # wildcard 1 of foo.*.* hashes only the first token: same key, same partition
    rc, out, _ = run("hash", "--partitions", "16", "--filter", "foo.*.*", "--wildcards", "1", "--json", "-",
                     stdin="foo.k1.a\n\nfoo.k1.b\n  foo.k2.a  \n")
    assert rc == 0
    rows = json.loads(out)
    assert [r["subject"] for r in rows] == ["foo.k1.a", "foo.k1.b", "foo.k2.a"]
    assert rows[0]["partition"] == rows[1]["partition"]
    # the same as hashing the bare key with the whole-subject form
    rc, out, _ = run("hash", "--partitions", "16", "--json", "k1", "k2")
    assert [r["partition"] for r in json.loads(out)] == [rows[0]["partition"], rows[2]["partition"]]
    # stdin mixed with arguments, in order
    rc, out, _ = run("hash", "--partitions", "10", "foo", "-", "qux", stdin="baz\n")
    assert [line.split()[0] for line in out.splitlines()[1:]] == ["foo", "baz", "qux"]


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "create" in capsys.readouterr().out
    assert main(["create", "--help"]) == 0
    assert "--password-file" in capsys.readouterr().out


def test_secrets_are_not_command_line_options():
    for opt in ("--password", "--token", "--seed"):
        rc, _, err = run("ls", opt, "x")
        assert rc == 1 and "unrecognized arguments" in err


def test_table_and_ranges():
    assert table(["A", "BB"], [("xyz", 1), ("q", None)]) == "A    BB\nxyz  1\nq"
    assert ranges([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8" and ranges([]) == "-" and ranges([3]) == "3"
