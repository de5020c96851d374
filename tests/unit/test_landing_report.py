"""The example DAGs' landing report (pure logic): a list of summaries, or the one summary of
a group with a single member (what ``xcom_pull`` gives for a task mapped once)."""

from __future__ import annotations

from airflow_provider_cg.examples import landing_report

S1 = {"member": "m2", "result": "committed", "messages_read": 7, "rows_written": 6, "partitions": {"1": {"messages": 7}}}
S2 = {"member": "m1", "result": "empty", "messages_read": 0, "rows_written": 0, "partitions": {}}


def test_a_list_of_summaries_is_reported_per_member_and_in_total(capsys):
    report = landing_report([S1, None, S2])
    assert [m["member"] for m in report["members"]] == ["m1", "m2"]
    assert report["members"][1]["partitions"] == {1: 7}
    assert report["totals"]["messages_read"] == 7 and report["totals"]["rows_written"] == 6
    assert "total" in capsys.readouterr().out


def test_the_one_summary_of_a_single_member_is_a_report_too():
    report = landing_report(S1)
    assert [m["member"] for m in report["members"]] == ["m2"] and report["totals"]["messages_read"] == 7


def test_the_operator_names_a_backfill_by_its_window_not_as_member_none():
    from airflow_provider_cg.core.landing.contract import MemberJobSpec
    from airflow_provider_cg.operators.spark import _writer_name

    spec = MemberJobSpec.build({"stream": "O", "group": "g", "sink_path": "/tmp/x", "backfill_start": "2026-01-01T00:00:00Z",
                                "backfill_end": "2026-01-01T01:00:00Z"})
    assert _writer_name(spec) == "backfill [2026-01-01T00:00:00Z, 2026-01-01T01:00:00Z)"
    assert _writer_name(MemberJobSpec.build({"stream": "O", "group": "g", "member": "m1", "sink_path": "/x"})) == "member m1"
