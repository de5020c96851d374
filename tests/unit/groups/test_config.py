"""Group configs: orbit's JSON (current and old names), every validation rule, changes."""

from __future__ import annotations

import json

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups.codec import dump_config, load_config
from airflow_provider_cg.core.groups.config import (
    ElasticGroupConfig,
    MemberMapping,
    PartitioningFilter,
    StaticGroupConfig,
    in_membership,
    with_mappings,
    with_members,
)
from airflow_provider_cg.core.groups.names import (
    KV_BUCKETS,
    MAX_PARTITIONS,
    config_key,
    static_consumer_name,
    subjects_intersect,
    validate_name,
    validate_names,
    validate_subject,
    work_queue_stream,
)
from airflow_provider_cg.core.groups.rules import check_change, validate_against_stream

ORBIT_EXAMPLE = (
    b'{"max_members":4,"partitioning_filters":[{"filter":"foo.*","partitioning_wildcards":[1]}],'
    b'"max_buffered_msg":1000,"max_buffered_bytes":10000,"members":["m1","m2"]}'
)


def elastic(**kw) -> ElasticGroupConfig:
    base = dict(max_members=4, partitioning_filters=(PartitioningFilter("foo.*", (1,)),))
    base.update(kw)
    return ElasticGroupConfig(**base)


def static(**kw) -> StaticGroupConfig:
    base = dict(max_members=4, filters=(">",))
    base.update(kw)
    return StaticGroupConfig(**base)


def mm(member: str, *parts: int) -> MemberMapping:
    return MemberMapping(member, parts)


def rejects(cfg, field: str, *, stream=None, group=None) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        cfg.validate(stream, group)
    assert e.value.field == field, (e.value.field, e.value.rule)
    return e.value


# --------------------------------------------------------------------------- names


def test_names_and_keys():
    assert KV_BUCKETS == {"static": "static-consumer-groups", "elastic": "elastic-consumer-groups"}
    assert config_key("ORDERS", "g1") == "ORDERS.g1"
    assert work_queue_stream("ORDERS", "g1") == "ORDERS-g1"
    assert static_consumer_name("g1", "m1") == "g1-m1"
    assert ElasticGroupConfig(1).kind == "elastic"
    assert StaticGroupConfig(1, ()).kind == "static"


# --------------------------------------------------------------------------- JSON


def test_orbit_example_round_trips_byte_identical():
    cfg = load_config("elastic", ORBIT_EXAMPLE)
    assert cfg == ElasticGroupConfig(4, (PartitioningFilter("foo.*", (1,)),), 1000, 10000, ("m1", "m2"))
    cfg.validate()
    assert dump_config(cfg) == ORBIT_EXAMPLE
    assert dump_config(load_config("elastic", ORBIT_EXAMPLE.decode())) == ORBIT_EXAMPLE
    assert dump_config(load_config("elastic", json.loads(ORBIT_EXAMPLE))) == ORBIT_EXAMPLE


def test_json_omits_empty_like_go_and_escapes_like_go():
    # created here with none: Go's nil, as orbit writes it (partitioning_filters has no omitempty)
    cfg = ElasticGroupConfig(2, (PartitioningFilter("a.>", ()),))
    assert (
        dump_config(cfg)
        == b'{"max_members":2,"partitioning_filters":[{"filter":"a.\\u003e","partitioning_wildcards":null}]}'
    )
    assert json.loads(dump_config(cfg))["partitioning_filters"][0]["filter"] == "a.>"
    mapped = ElasticGroupConfig(2, member_mappings=(mm("m1", 1, 0),))
    assert dump_config(mapped) == (
        b'{"max_members":2,"partitioning_filters":null,"member_mappings":[{"member":"m1","partitions":[1,0]}]}'
    )
    # static filters are `omitempty` in orbit
    assert dump_config(StaticGroupConfig(2, (), ("m",))) == b'{"max_members":2,"members":["m"]}'
    s = StaticGroupConfig(3, ("ü.*", "b.>"), ("m1",))
    assert dump_config(s) == '{"max_members":3,"filters":["ü.*","b.\\u003e"],"members":["m1"]}'.encode()
    assert load_config("static", dump_config(s)) == s


def test_json_nulls_are_written_back_as_null():
    # Go keeps nil and [] apart and orbit compares configs with DeepEqual: preserve them.
    raw = b'{"max_members":2,"partitioning_filters":[{"filter":"a.*","partitioning_wildcards":null}],"members":["x"]}'
    assert dump_config(load_config("elastic", raw)) == raw
    raw = b'{"max_members":2,"partitioning_filters":null,"members":["x"]}'
    cfg = load_config("elastic", raw)
    assert cfg.partitioning_filters == ()
    assert dump_config(cfg) == raw
    assert (
        dump_config(with_members(cfg, ["y"])) == b'{"max_members":2,"partitioning_filters":null,"members":["y"]}'
    )
    # read as [], written back as []
    raw = b'{"max_members":2,"partitioning_filters":[{"filter":"a.*","partitioning_wildcards":[]}],"members":["x"]}'
    assert dump_config(load_config("elastic", raw)) == raw
    raw = b'{"max_members":2,"partitioning_filters":[],"members":["x"]}'
    assert dump_config(load_config("elastic", raw)) == raw
    # Go reads a static null or [] as nil and omits it on the way out
    for raw in (b'{"max_members":2,"filters":null}', b'{"max_members":2,"filters":[]}'):
        assert dump_config(load_config("static", raw)) == b'{"max_members":2}'


def test_orbit_v01_shapes_are_read_and_written_back_in_that_shape():
    """orbit pcgroups v0.1.0 (ElasticConsumerGroupConfig / StaticConsumerGroupConfig field tags)."""
    raw = (b'{"max_members":4,"filter":"foo.*.*","partitioning_wildcards":[2],"max_buffered_msg":10,'
           b'"members":["m1","m2"]}')
    cfg = load_config("elastic", raw)
    assert cfg.orbit_v01 and cfg.partitioning_filters == (PartitioningFilter("foo.*.*", (2,)),)
    assert cfg.max_buffered_msgs == 10
    cfg.validate()
    assert dump_config(cfg) == raw
    assert dump_config(with_members(cfg, ["m3"])) == raw.replace(b'"m1","m2"', b'"m3"')
    raw = b'{"max_members":2,"filter":"foo.*","partitioning_wildcards":null,"member_mappings":[{"member":"a","partitions":[1,0]}]}'
    assert dump_config(load_config("elastic", raw)) == raw
    st = b'{"max_members":3,"filter":"","members":["a"]}'
    cfg = load_config("static", st)
    assert cfg.orbit_v01 and cfg.filters == ()
    assert dump_config(cfg) == st


def test_old_names_are_read_and_current_names_written():
    old = {
        "max_members": 3,
        "filter": "orders.*.*",
        "partitioning-wildcards": [2],
        "msg-buffer-size": 50,
        "member-mappings": [{"member": "a", "partitions": [0, 1]}, {"member": "b", "partitions": [2]}],
    }
    cfg = load_config("elastic", json.dumps(old))
    assert cfg == ElasticGroupConfig(
        3, (PartitioningFilter("orders.*.*", (2,)),), 50, 0, (), (mm("a", 0, 1), mm("b", 2))
    )
    cfg.validate()
    assert json.loads(dump_config(cfg)) == {
        "max_members": 3,
        "partitioning_filters": [{"filter": "orders.*.*", "partitioning_wildcards": [2]}],
        "max_buffered_msg": 50,
        "member_mappings": [{"member": "a", "partitions": [0, 1]}, {"member": "b", "partitions": [2]}],
    }
    st = load_config("static", b'{"max_members":2,"filter":"x.>","members":["m"]}')
    assert st == StaticGroupConfig(2, ("x.>",), ("m",))
    assert load_config("static", b'{"max_members":2,"filter":""}').filters == ()
    seed_whole = load_config("elastic", b'{"max_members":2,"filter":">","partitioning-wildcards":[]}')
    assert seed_whole.partitioning_filters == (PartitioningFilter(">", ()),)


@pytest.mark.parametrize(
    "kind, doc, field",
    [
        ("elastic", b"{not json", "config"),
        ("elastic", b"\xff\xfe", "config"),
        ("elastic", b"[1, 2]", "config"),
        ("elastic", b'{"max_members":"4"}', "max_members"),
        ("elastic", b'{"max_members":4.0}', "max_members"),
        ("elastic", b'{"max_members":true}', "max_members"),
        ("elastic", b'{"max_members":4,"members":"m1"}', "members"),
        ("elastic", b'{"max_members":4,"members":["m1",2]}', "members[1]"),
        ("elastic", b'{"max_members":4,"partitioning_filters":{"filter":"a.*"}}', "partitioning_filters"),
        ("elastic", b'{"max_members":4,"partitioning_filters":["a.*"]}', "partitioning_filters[0]"),
        (
            "elastic",
            b'{"max_members":4,"partitioning_filters":[{"filter":7}]}',
            "partitioning_filters[0].filter",
        ),
        (
            "elastic",
            b'{"max_members":4,"partitioning_filters":[{"filter":"a.*","partitioning_wildcards":[1,"2"]}]}',
            "partitioning_filters[0].partitioning_wildcards[1]",
        ),
        (
            "elastic",
            b'{"max_members":4,"partitioning_filters":[{"filter":"a.*","partitioning_wildcards":[null]}]}',
            "partitioning_filters[0].partitioning_wildcards[0]",
        ),
        ("elastic", b'{"max_members":4,"max_buffered_msg":"10"}', "max_buffered_msg"),
        ("elastic", b'{"max_members":4,"msg-buffer-size":1.5}', "msg-buffer-size"),
        ("elastic", b'{"max_members":4,"max_buffered_bytes":[]}', "max_buffered_bytes"),
        (
            "elastic",
            b'{"max_members":4,"member_mappings":[{"member":"a","partitions":[0,"1"]}]}',
            "member_mappings[0].partitions[1]",
        ),
        (
            "elastic",
            b'{"max_members":4,"member_mappings":[{"member":1,"partitions":[0]}]}',
            "member_mappings[0].member",
        ),
        ("elastic", b'{"max_members":4,"member-mappings":["a"]}', "member-mappings[0]"),
        ("elastic", b'{"max_members":4,"filter":"a.*","partitioning_filters":[]}', "filter"),
        ("elastic", b'{"max_members":4,"max_buffered_msg":1,"msg-buffer-size":1}', "msg-buffer-size"),
        ("static", b'{"max_members":4,"filters":"a.>"}', "filters"),
        ("static", b'{"max_members":4,"filters":["a.>",null]}', "filters[1]"),
        ("static", b'{"max_members":4,"filter":["a.>"]}', "filter"),
        ("static", b'{"max_members":4,"filter":"a.>","filters":["b.>"]}', "filter"),
    ],
)
def test_bad_json_and_types_name_the_field(kind, doc, field):
    with pytest.raises(ConfigError) as e:
        load_config(kind, doc)
    assert e.value.field == field, e.value


def test_unknown_kind():
    with pytest.raises(ConfigError) as e:
        load_config("dynamic", b"{}")
    assert e.value.field == "kind"


def test_classmethod_parsers():
    assert dump_config(load_config("elastic", ORBIT_EXAMPLE)) == ORBIT_EXAMPLE
    assert load_config("static", {"max_members": 1, "filters": ["a.>"]}) == StaticGroupConfig(
        1, ("a.>",)
    )


# --------------------------------------------------------------------------- validation: orbit's rules


def test_valid_configs_pass():
    elastic(members=("m1", "m2", "m1")).validate()  # duplicates are tolerated, as in orbit
    elastic(members=tuple(f"m{i}" for i in range(10))).validate()  # more than max_members too
    elastic(member_mappings=(mm("a", 0, 2), mm("b", 1, 3))).validate()
    elastic(partitioning_filters=()).validate()
    elastic(partitioning_filters=(PartitioningFilter("foo.>"),)).validate()
    elastic(
        partitioning_filters=(PartitioningFilter("a.*.*.>", (2, 1)), PartitioningFilter("b.*"))
    ).validate()
    static(filters=()).validate()
    static(filters=("orders.eu", "orders.us.>")).validate()  # literal filters are fine for static
    assert elastic().validate() == elastic()


@pytest.mark.parametrize("n", [0, -1, MAX_PARTITIONS + 1])
def test_max_members_range(n):
    rejects(elastic(max_members=n), "max_members")
    rejects(static(max_members=n), "max_members")
    elastic(max_members=MAX_PARTITIONS).validate()


def test_members_and_mappings_are_mutually_exclusive():
    rejects(elastic(members=("m1",), member_mappings=(mm("m1", 0, 1, 2, 3),)), "member_mappings")
    rejects(static(members=("m1",), member_mappings=(mm("m1", 0, 1, 2, 3),)), "member_mappings")


def test_mapping_rules():
    # orbit's own test vectors, max_members 2 then 3
    two = dict(max_members=2, partitioning_filters=(PartitioningFilter("foo.*", (1,)),))
    ElasticGroupConfig(**two, member_mappings=(mm("m1", 0, 1),)).validate()
    rejects(ElasticGroupConfig(**two, member_mappings=(mm("m1", 1, 1),)), "member_mappings[0].partitions[1]")
    rejects(ElasticGroupConfig(**two, member_mappings=(mm("m1", 1),)), "member_mappings")
    rejects(
        ElasticGroupConfig(**two, member_mappings=(mm("m1", 0, 1, 2),)), "member_mappings[0].partitions[2]"
    )
    rejects(ElasticGroupConfig(**two, member_mappings=(mm("m1", 0, 2),)), "member_mappings[0].partitions[1]")
    rejects(
        ElasticGroupConfig(**two, member_mappings=(mm("m1", 0, 1), mm("m1", 0, 1))),
        "member_mappings[1].member",
    )
    rejects(
        ElasticGroupConfig(**two, member_mappings=(mm("m1", 0, 1), mm("m2", 0, 1))),
        "member_mappings[1].partitions[0]",
    )
    rejects(
        ElasticGroupConfig(**two, member_mappings=(mm("m1", 0, 1), mm("m2", 2, 3))),
        "member_mappings[1].partitions[0]",
    )
    ElasticGroupConfig(**two, member_mappings=(mm("m1", 0), mm("m2", 1))).validate()
    three = dict(two, max_members=3)
    rejects(ElasticGroupConfig(**three, member_mappings=(mm("m1", 0), mm("m2", 1))), "member_mappings")
    rejects(
        ElasticGroupConfig(**three, member_mappings=(mm("m1", 0, 2), mm("m2", 1, 2))),
        "member_mappings[1].partitions[1]",
    )
    ElasticGroupConfig(**three, member_mappings=(mm("m1", 0, 2), mm("m2", 1))).validate()


def test_mapping_count_and_partition_types():
    too_many = tuple(mm(f"m{i}", i) for i in range(5))
    e = rejects(elastic(member_mappings=too_many), "member_mappings")
    assert "between 1 and max_members" in e.rule
    rejects(elastic(member_mappings=(mm("a", 0, 1, 2, -1),)), "member_mappings[0].partitions[3]")
    rejects(
        elastic(member_mappings=(MemberMapping("a", (0, 1, 2, True)),)), "member_mappings[0].partitions[3]"
    )
    rejects(static(member_mappings=(mm("a", 0, 1), mm("b", 2, 4))), "member_mappings[1].partitions[1]")
    rejects(static(member_mappings=(mm("a", 0, 1), mm("b", 2))), "member_mappings")
    rejects(elastic(member_mappings=({"member": "a"},)), "member_mappings[0]")


def test_partitioning_filter_rules():
    def pf(f, *w):
        return elastic(partitioning_filters=(PartitioningFilter(f, w),))

    rejects(pf(""), "partitioning_filters[0].filter")
    rejects(pf("foo.bar"), "partitioning_filters[0].filter")  # no '*' and no final '>'
    rejects(pf("foo.*.*", 1, 1), "partitioning_filters[0].partitioning_wildcards[1]")  # unique
    rejects(pf("foo.*", 0), "partitioning_filters[0].partitioning_wildcards[0]")  # 1-based
    rejects(pf("foo.*.*", 3), "partitioning_filters[0].partitioning_wildcards[0]")  # <= number of '*'
    e = rejects(pf("foo.*", 1, 2), "partitioning_filters[0].partitioning_wildcards")  # too many
    assert "more indexes" in e.rule
    rejects(pf("foo.>", 1), "partitioning_filters[0].partitioning_wildcards")
    rejects(pf("foo.*", True), "partitioning_filters[0].partitioning_wildcards[0]")
    two = elastic(partitioning_filters=(PartitioningFilter("a.*"), PartitioningFilter("b.*", (2,))))
    rejects(two, "partitioning_filters[1].partitioning_wildcards[0]")


# --------------------------------------------------------------------------- validation: ours


@pytest.mark.parametrize(
    "subject",
    ["a..b", ".a", "a.", "a b", "a.>.b", "a\tb", "a.\x00", "", ">.a"],
)
def test_filter_subject_syntax(subject):
    rejects(
        elastic(partitioning_filters=(PartitioningFilter(subject + ".*" if subject else ""),)),
        "partitioning_filters[0].filter",
    )
    rejects(static(filters=("ok.>", subject)), "filters[1]")


def test_filters_must_not_overlap():
    rejects(
        elastic(partitioning_filters=(PartitioningFilter("a.*.x"), PartitioningFilter("a.>"))),
        "partitioning_filters[1].filter",
    )
    rejects(static(filters=("a.b", "a.*")), "filters[1]")
    static(filters=("a.b", "a.c.*")).validate()


def test_filter_tokens_that_would_be_placeholders():
    rejects(elastic(partitioning_filters=(PartitioningFilter("a.$1.*"),)), "partitioning_filters[0].filter")
    rejects(
        elastic(partitioning_filters=(PartitioningFilter("a.{{x}}.*"),)), "partitioning_filters[0].filter"
    )
    elastic(partitioning_filters=(PartitioningFilter("a.$x.*"),)).validate()


def test_buffered_limits():
    rejects(elastic(max_buffered_msgs=-1), "max_buffered_msg")
    rejects(elastic(max_buffered_bytes=-5), "max_buffered_bytes")
    rejects(elastic(max_buffered_bytes=2**63), "max_buffered_bytes")
    elastic(max_buffered_msgs=0, max_buffered_bytes=2**63 - 1).validate()


@pytest.mark.parametrize(
    "name", ["", "a b", "a.b", "a*", "a>", "a/b", "a\\b", "a\x01", "a\u00a0b", "x" * 256, "é" * 128, 5, None]
)
def test_bad_member_names(name):
    rejects(elastic(members=("ok", name)), "members[1]")
    rejects(
        elastic(member_mappings=(mm("ok", 0, 1), MemberMapping(name, (2, 3)))), "member_mappings[1].member"
    )
    with pytest.raises(ConfigError):
        validate_name("m", name, "member")


def test_name_kinds():
    assert validate_name("member", "ordërs-😀") == "ordërs-😀"  # consumers may be unicode
    assert validate_name("member", "x" * 255) == "x" * 255
    for kind in ("stream", "group"):
        assert validate_name(kind, "A-b_c=9") == "A-b_c=9"
        with pytest.raises(ConfigError) as e:
            validate_name(kind, "ordërs")  # would not be a valid KV key
        assert e.value.field == kind
        with pytest.raises(ConfigError):
            validate_name(kind, "a:b")
    with pytest.raises(ConfigError) as e:
        validate_name("stream", "a.b", kind="stream")
    assert e.value.field == "stream"
    with pytest.raises(ValueError):
        validate_name("x", "y", kind="queue")


def test_composed_name_lengths():
    validate_names("S" * 127, "g" * 127)
    with pytest.raises(ConfigError) as e:
        validate_names("S" * 200, "g" * 60)  # S-g would be 261 bytes
    assert e.value.field == "group"
    validate_names("S" * 200, "g" * 60, kind="static")  # no work-queue stream
    cfg = static(members=("m" * 200,))
    cfg.validate("S", "g" * 50)
    rejects(static(members=("m" * 210,)), "members[0]", stream="S", group="g" * 50)
    rejects(elastic(), "group", stream="S" * 200, group="g" * 60)
    rejects(elastic(), "stream", stream="a.b", group="g")
    rejects(elastic(), "group", stream="S", group="g/h")
    rejects(elastic(), "group", group="")


def test_validate_subject_literal_mode():
    assert validate_subject("s", "a.b*.c") == "a.b*.c"  # '*' inside a token is literal
    with pytest.raises(ConfigError):
        validate_subject("s", "a.*", wildcards=False)


# --------------------------------------------------------------------------- intersection


@pytest.mark.parametrize(
    "a, b, expected",
    [
        ("foo.bar", "foo.bar", True),
        ("foo.bar", "foo.baz", False),
        ("foo.*", "foo.bar", True),
        ("foo.*", "*.bar", True),
        ("foo.*", "foo", False),
        ("foo.*", "foo.bar.baz", False),
        ("foo.>", "foo", False),
        ("foo.>", "foo.bar.baz", True),
        ("foo.>", "*.*", True),
        ("foo.>", "bar.>", False),
        (">", "a", True),
        (">", "a.b.c", True),
        ("*", "a.b", False),
        ("*.>", "a", False),
        ("a.*.c", "a.b.*", True),
        ("a.*.c", "a.b.d", False),
        ("a.b.>", "a.*", False),
        ("a.b.>", "*.*.c", True),
        ("a.b*", "a.*", True),
        ("a.b*", "a.bc", False),
    ],
)
def test_subjects_intersect(a, b, expected):
    assert subjects_intersect(a, b) is expected
    assert subjects_intersect(b, a) is expected


# --------------------------------------------------------------------------- against the stream


def test_elastic_against_stream():
    cfg = elastic(partitioning_filters=(PartitioningFilter("orders.*.*", (1,)), PartitioningFilter("pay.>")))
    validate_against_stream(cfg, ["orders.>", "pay.*"])
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, ["orders.>", "refunds.>"])
    assert e.value.field == "partitioning_filters[1].filter"
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, ["orders.eu", "pay.x"])  # orders.*.* needs 3 tokens
    assert e.value.field == "partitioning_filters[0].filter"
    validate_against_stream(elastic(partitioning_filters=()), ["anything.>"])
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, [])
    assert e.value.field == "origin_subjects"
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, ["orders.>", "bad..subject"])
    assert e.value.field == "origin_subjects[1]"


def test_static_against_stream():
    cfg = static(filters=("orders.*",))
    # the stream's transform destination, as stored
    validate_against_stream(cfg, ["{{Partition(4,1)}}.orders.{{Wildcard(1)}}"])
    validate_against_stream(cfg, ["{{partition(4,1)}}.orders.$1"])
    validate_against_stream(cfg, ["*.orders.*", "3.orders.x"])
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, ["{{partition(8,1)}}.orders.{{wildcard(1)}}"])
    assert e.value.field == "origin_subjects[0]" and "8" in e.value.rule
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, ["*.orders.*", "4.orders.x"])  # partition 4 of 0..3
    assert e.value.field == "origin_subjects[1]"
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, ["orders.*"])  # no partition token
    assert e.value.field == "origin_subjects[0]"
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, [">"])
    assert e.value.field == "origin_subjects[0]"
    with pytest.raises(ConfigError) as e:
        validate_against_stream(cfg, ["*.payments.*"])
    assert e.value.field == "filters[0]"
    validate_against_stream(static(filters=()), ["*.a.b"])
    with pytest.raises(ConfigError) as e:
        validate_against_stream(static(filters=()), ["*"])  # '<p>.>' needs a token after p
    assert e.value.field == "filters"
    # split functions may produce several tokens: never a false alarm
    validate_against_stream(static(filters=("x.y.z",)), ["{{partition(4,1)}}.{{splitfromleft(1,2)}}"])


# --------------------------------------------------------------------------- changes and helpers


def test_check_change_allows_only_membership():
    old = elastic(max_buffered_msgs=10, members=("m1",))
    check_change(old, elastic(max_buffered_msgs=10, members=("m1", "m2")))
    check_change(old, elastic(max_buffered_msgs=10, member_mappings=(mm("x", 0, 1, 2, 3),)))
    cases = [
        (elastic(max_members=5, max_buffered_msgs=10), "max_members"),
        (elastic(max_buffered_msgs=11), "max_buffered_msg"),
        (elastic(max_buffered_msgs=10, max_buffered_bytes=1), "max_buffered_bytes"),
        (elastic(max_buffered_msgs=10, partitioning_filters=()), "partitioning_filters"),
        (
            elastic(max_buffered_msgs=10, partitioning_filters=(PartitioningFilter("bar.*", (1,)),)),
            "partitioning_filters[0].filter",
        ),
        (
            elastic(max_buffered_msgs=10, partitioning_filters=(PartitioningFilter("foo.*", ()),)),
            "partitioning_filters[0].partitioning_wildcards",
        ),
        (static(), "kind"),
    ]
    for new, field in cases:
        with pytest.raises(ConfigError) as e:
            check_change(old, new)
        assert (e.value.field, e.value.rule) == (field, "cannot change after the group is created")
    check_change(static(members=("a",)), static(members=("b",)))
    with pytest.raises(ConfigError) as e:
        check_change(static(filters=("a.>", "b.>")), static(filters=("a.>", "c.>")))
    assert e.value.field == "filters[1]"
    with pytest.raises(ConfigError) as e:
        check_change(static(), static(filters=()))
    assert e.value.field == "filters"
    # a first difference is reported first
    with pytest.raises(ConfigError) as e:
        check_change(old, elastic(max_members=8, max_buffered_msgs=99))
    assert e.value.field == "max_members"


def test_with_members_and_mappings():
    cfg = elastic(member_mappings=(mm("a", 0, 1, 2, 3),))
    new = with_members(cfg, ["m1", "m2"])
    assert new.members == ("m1", "m2") and new.member_mappings == ()
    back = with_mappings(new, {"a": [0, 1], "b": [2, 3]})
    assert back.members == () and back.member_mappings == (mm("a", 0, 1), mm("b", 2, 3))
    assert with_mappings(back, [mm("z", 3, 2, 1, 0)]).member_mappings == (mm("z", 3, 2, 1, 0),)
    cleared = with_mappings(back, [])
    assert cleared.members == () and cleared.member_mappings == ()
    assert (
        dump_config(cleared)
        == b'{"max_members":4,"partitioning_filters":[{"filter":"foo.*","partitioning_wildcards":[1]}]}'
    )
    with pytest.raises(ConfigError) as e:
        with_members(cfg, ["ok", "bad name"])
    assert e.value.field == "members[1]"
    with pytest.raises(ConfigError) as e:
        with_mappings(cfg, {"a": [0, 1]})
    assert e.value.field == "member_mappings"
    assert cfg.member_mappings == (mm("a", 0, 1, 2, 3),)  # the original is untouched
    st = with_members(static(), ["x"])
    assert isinstance(st, StaticGroupConfig) and st.members == ("x",)


def test_in_membership():
    assert in_membership(elastic(members=("m1", "m2")), "m2")
    assert not in_membership(elastic(members=("m1", "m2")), "m3")
    assert in_membership(elastic(member_mappings=(mm("a", 0, 1), mm("b", 2, 3))), "b")
    assert not in_membership(elastic(), "a")


def test_configs_are_immutable_and_hashable():
    cfg = elastic(members=["m1"])  # lists are stored as tuples
    assert cfg.members == ("m1",)
    assert hash(cfg) == hash(elastic(members=("m1",)))
    with pytest.raises(AttributeError):
        cfg.max_members = 3  # type: ignore[misc]


def test_go_escapes_and_small_helpers():
    cfg = elastic(members=("a&b", "c<d"))
    assert b'"members":["a\\u0026b","c\\u003cd"]' in dump_config(cfg)
    assert load_config("elastic", dump_config(cfg)) == cfg
    assert cfg.partition_count == 4
    with pytest.raises(ConfigError) as e:
        with_members(cfg, "m1")  # one string is not a list of members
    assert e.value.field == "members"


def test_subjects_regex_matches_as_nats_filters_do():
    import re

    from airflow_provider_cg.core.groups.names import subjects_regex

    pattern = re.compile(subjects_regex(["0.orders.*", "1.orders.>", "2.a.b"]))
    matching = ["0.orders.k1", "1.orders.eu.k2", "1.orders.x", "2.a.b"]
    not_matching = ["0.orders", "0.orders.k1.x", "1.orders", "x.orders.k1", "3.orders.k1", "2.a.bc", "2.a.b.c",
                    "0.ordersXk1", "10.orders.k1"]
    assert all(pattern.match(s) for s in matching), [s for s in matching if not pattern.match(s)]
    assert not any(pattern.match(s) for s in not_matching), [s for s in not_matching if pattern.match(s)]
