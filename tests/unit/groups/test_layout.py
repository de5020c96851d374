"""The layouts' names and configs (``core/groups/layouts/``), and the member consumer filters
each layout gives."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.groups import layouts
from airflow_provider_cg.core.groups.config import ElasticGroupConfig, PartitioningFilter
from airflow_provider_cg.core.groups.layouts import partition_streams as gl

WQ = {"name": "ORDERS-g", "retention": "workqueue", "num_replicas": 3, "storage": "file", "allow_direct": True,
      "sources": [{"name": "ORDERS"}], "metadata": {"_nats.ver": "2.15.1", "cg.sourcing.stopped": "x"}}


def test_the_layout_is_read_from_the_work_queue_and_defaults_to_orbits():
    assert layouts.of({}).name == gl.WORK_QUEUE
    assert layouts.of({"metadata": {"cg.layout": "draining"}}).name == gl.DRAINING
    assert layouts.named(gl.PARTITION_STREAMS).reads_partition_streams
    assert layouts.named(gl.DRAINING).reads_partition_streams
    assert not layouts.named(gl.WORK_QUEUE).reads_partition_streams
    # filling: members land the work queue (as in work-queue) while the log and its streams fill
    filling = layouts.of({"metadata": {"cg.layout": "filling"}})
    assert filling.name == gl.FILLING and not filling.reads_partition_streams and filling.has_partition_streams
    assert not layouts.named(gl.WORK_QUEUE).has_partition_streams
    assert gl.FILLING not in layouts.NAMES and gl.DRAINING not in layouts.NAMES  # states of a move, not choices
    with pytest.raises(ConfigError) as e:
        layouts.check("layout", "sideways")
    assert e.value.field == "layout" and "work-queue" in e.value.rule


def test_recording_a_layout_keeps_other_metadata_and_drops_the_servers():
    split = layouts.named(gl.PARTITION_STREAMS).work_queue_config(WQ)
    assert split["metadata"] == {"cg.sourcing.stopped": "x", "cg.layout": "partition-streams"}
    assert split["subjects"] == ["_cg.pin.ORDERS-g.*"] and split["sources"] == WQ["sources"]
    back = layouts.named(gl.WORK_QUEUE).work_queue_config(split)
    assert back["metadata"] == {"cg.sourcing.stopped": "x"} and "subjects" not in back


def test_the_partition_log_is_the_copy_of_record_with_the_work_queues_replicas_and_limits():
    wq = {**WQ, "max_msgs": 500, "max_bytes": -1, "discard": "new"}
    source = {"name": "ORDERS", "subject_transforms": [{"src": "orders.*", "dest": "x"}], "opt_start_seq": 11}
    cfg = gl.partition_log_config(wq, source)
    assert cfg["name"] == "ORDERS-g-log" and cfg["retention"] == "limits" and cfg["discard"] == "new"
    assert cfg["num_replicas"] == 3 and cfg["max_msgs"] == 500 and cfg["sources"] == [source]
    # no direct gets: the server would let its filtered mirrors answer them, each with its partition only
    assert cfg["metadata"] == {"cg.log_of": "ORDERS-g"} and cfg["allow_direct"] is False
    # a group created in the layout: its work queue holds the pin subjects and no source
    wq_cfg, given = layouts.named(gl.PARTITION_STREAMS).creation_source({**WQ, "metadata": {}})
    assert given == WQ["sources"][0] and wq_cfg["sources"] == [] and wq_cfg["subjects"] == ["_cg.pin.ORDERS-g.*"]
    assert layouts.named(gl.WORK_QUEUE).creation_source(WQ) == (WQ, None)


def test_a_partition_stream_is_a_limitless_mirror_of_the_log_through_its_flow_control_consumer():
    cfg = gl.partition_stream_config(WQ, 4)  # one replica, whatever the work queue's (check_replicas says why)
    assert cfg["name"] == "ORDERS-g-p4" and cfg["retention"] == "workqueue" and cfg["num_replicas"] == 1
    recorded = layouts.named(gl.PARTITION_STREAMS).work_queue_config(WQ, replicas=2)
    assert gl.partition_stream_config(recorded, 4)["num_replicas"] == 2
    assert gl.REPLICAS_KEY not in (layouts.named(gl.WORK_QUEUE).work_queue_config(recorded).get("metadata") or {})
    assert "max_msgs" not in cfg and "discard" not in cfg  # a full mirror stalls for good
    assert cfg["mirror"] == {"name": "ORDERS-g-log", "consumer": {"name": "cg-partition-4",
                                                                  "deliver_subject": "_cg.mirror.ORDERS-g.4"}}
    cc = gl.mirror_consumer_config(4, "ORDERS-g")
    assert cc["filter_subject"] == "4.>" and cc["ack_policy"] == "flow_control" and cc["max_deliver"] == -1
    assert cc["deliver_subject"] == cfg["mirror"]["consumer"]["deliver_subject"]
    assert gl.is_mirror_consumer("cg-partition-12") and not gl.is_mirror_consumer("cg-partition-x")
    assert not gl.is_mirror_consumer("m1")


def test_member_filters_by_layout():
    cfg = ElasticGroupConfig(4, (PartitioningFilter("orders.*", (1,)),), members=("m1", "m2"))
    assert layouts.named(gl.WORK_QUEUE).member_filters(cfg, "m1") == ["0.orders.*", "1.orders.*"]
    split = layouts.named(gl.PARTITION_STREAMS)
    assert split.member_filters(cfg, "m1", "ORDERS-g") == ["_cg.pin.ORDERS-g.m1"]
    assert split.member_filters(cfg, "m9", "ORDERS-g") == []  # not a member: no consumer


def test_member_names_that_are_mirror_consumers_are_refused():
    with pytest.raises(ConfigError) as e:
        ElasticGroupConfig(2, members=("m1", "cg-partition-0")).validate()
    assert e.value.field == "members[1]"


def test_replicated_partition_streams_are_refused_on_the_servers_that_lose_them():
    assert gl.check_replicas("partition_replicas", 1, (2, 15, 1)) == 1
    with pytest.raises(ConfigError, match="partition_replicas: must be 1 on nats-server 2.15.1"):
        gl.check_replicas("partition_replicas", 3, (2, 15, 1))
    assert gl.check_replicas("partition_replicas", 3, (2, 16, 0)) == 3  # not checked there: allowed
    for bad in (0, 6, True, "3", 1.5):
        with pytest.raises(ConfigError, match="partition_replicas: must be 1 to 5"):
            gl.check_replicas("partition_replicas", bad)
