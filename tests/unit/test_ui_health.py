"""The consumer-groups page says what no backlog shows: a stalled source and an origin that
went back, each on a red line of its group (``ui/app.py``), in the words ``cg status`` uses."""

from __future__ import annotations

from airflow_provider_cg.core.groups.lag import GroupLag, MemberLag

WENT_BACK = {"stream": "O", "went_back_to": 2000, "table_position": 3000, "lost_messages": 1000,
             "way_forward": "--stream-life went-back:2000", "move_back": None}


def _page(**health) -> str:
    from airflow_provider_cg.ui.app import render

    lag = GroupLag("O", "g", "elastic", 2, 0, None, [MemberLag("m1", [0, 1], 0, 0, None, None, None, True)],
                   source_lag=500, **health)
    return render(["nats_default"], "nats_default", [lag.to_dict()], None)


def test_a_stalled_source_and_an_origin_that_went_back_are_said_in_red():
    page = _page(source_stalled="the origin holds 500 messages its source has not taken",
                 problems={"origin_went_back": WENT_BACK})
    assert 'id="group-O-g-source"' in page and "source stalled: the origin holds 500 messages" in page
    assert 'id="group-O-g-origin"' in page
    assert ("ORIGIN WENT BACK: O went back to sequence 2000: the table landed up to 3000, 1,000 landed messages "
            "no longer in the stream; its jobs refuse until --stream-life went-back:2000") in page
    assert "source lag 500 messages" in page


def test_a_healthy_group_has_neither_line():
    page = _page()
    assert "group-O-g-source" not in page and "group-O-g-origin" not in page and "ORIGIN WENT BACK" not in page
