"""The ``cg_member`` source's options: each bad one refused naming it and its rule, before
anything connects; credentials never accepted in an option (Spark shows options)."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.streaming.source_options import SourceOptions

BASE = {"stream": "ORDERS", "group": "lake", "member": "m1"}


def test_the_options_spark_gives_in_any_case_are_read():
    o = SourceOptions.parse({"STREAM": "ORDERS", "Group": "lake", "members": "m1, m2", "maxmessagespertrigger": "500",
                             "pinTimeout": "2.5", "minPartitions": "4", "startingPosition": "LATEST",
                             "servers": "nats://127.0.0.1:4222,127.0.0.1:4223", "FAILONDATALOSS": "False"})
    assert o.members == ("m1", "m2") and o.max_messages == 500 and o.pin_timeout == 2.5 and o.min_partitions == 4
    assert o.starting_position == "latest" and o.servers == ("nats://127.0.0.1:4222", "127.0.0.1:4223")
    assert SourceOptions.parse(BASE).pin_timeout == 30.0 and SourceOptions.parse(BASE).max_messages is None
    assert not o.fail_on_data_loss and SourceOptions.parse(BASE).fail_on_data_loss


@pytest.mark.parametrize("given,field,rule", [
    ({"group": "lake", "member": "m1"}, "stream", "required"),
    ({"stream": "ORDERS", "member": "m1"}, "group", "required"),
    ({"stream": "ORDERS", "group": "lake"}, "member", "required"),
    ({**BASE, "members": "m2"}, "members", "not both"),
    ({"stream": "ORDERS", "group": "lake", "members": "m1,m1"}, "members", "twice"),
    ({**BASE, "member": "m.1"}, "member", "member name"),
    ({**BASE, "stream": "OR DERS"}, "stream", "stream name"),
    ({**BASE, "maxMessagesPerTrigger": "0"}, "maxMessagesPerTrigger", "positive integer"),
    ({**BASE, "maxMessagesPerTrigger": "ten"}, "maxMessagesPerTrigger", "positive integer"),
    ({**BASE, "pinTimeout": "-1"}, "pinTimeout", "positive number"),
    ({**BASE, "minPartitions": "1.5"}, "minPartitions", "positive integer"),
    ({**BASE, "startingPosition": "earliest"}, "startingPosition", "group, latest"),
    ({**BASE, "servers": "nats://user:s3cret@127.0.0.1:4222"}, "servers", "must not carry credentials"),
    ({**BASE, "jsPrefix": "$JS.*"}, "jsPrefix", "wildcards"),
    ({**BASE, "failOnDataLoss": "no"}, "failOnDataLoss", "true or false"),
    ({**BASE, "startingOffsets": "earliest"}, "startingOffsets", "unknown option"),
    ({**BASE, "path": "/x"}, "path", "takes no path"),
])
def test_a_bad_option_is_refused_naming_it(given, field, rule):
    with pytest.raises(ConfigError) as e:
        SourceOptions.parse(given)
    assert e.value.field == field and rule in e.value.rule, str(e.value)
    assert "s3cret" not in str(e.value)
