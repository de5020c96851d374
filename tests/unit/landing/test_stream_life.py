"""stream_life: which life of an origin stream a table lands, what it refuses, and which key a
sequence lands under once a store went back."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.contract import MemberJobSpec
from airflow_provider_cg.core.landing.stream_life import (
    Life,
    LifeChoice,
    OriginKeys,
    OriginMark,
    StreamLifeChanged,
    decide,
    origin_keys,
    to_record,
    went_back,
)

T1, T2, T3 = "2026-11-01T00:00:00.1Z", "2026-11-02T00:00:00.2Z", "2026-11-03T00:00:00.3Z"


def test_the_first_life_lands_under_the_streams_name_and_is_recorded():
    assert decide("O", T1, [], None) == [Life(T1, "O")]
    assert decide("O", T1, [Life(T1, "O")], None) == []


def test_an_unknown_life_is_refused_naming_both_and_the_way_forward():
    with pytest.raises(StreamLifeChanged) as e:
        decide("O", T2, [Life(T1, "O")], None)
    assert e.value.field == "stream_life"
    assert T1 in str(e.value) and f"new:{T2}" in str(e.value) and f"continue:{T2}" in str(e.value)


def test_new_and_continue():
    lives = [Life(T1, "O")]
    assert decide("O", T2, lives, LifeChoice.parse(f"new:{T2}")) == [Life(T2, "O#2")]
    assert decide("O", T2, lives, LifeChoice.parse(f"continue:{T2}")) == [Life(T2, "O")]
    # a third life after a continued one counts keys, not creation times
    lives = [Life(T1, "O"), Life(T2, "O")]
    assert decide("O", T3, lives, LifeChoice.parse(f"new:{T3}")) == [Life(T3, "O#2")]
    # an older life met again (a restore of it) lands under its own key, no option needed
    assert decide("O", T1, [Life(T1, "O"), Life(T2, "O#2")], None) == []


def test_a_choice_naming_another_creation_time_is_refused():
    with pytest.raises(ConfigError, match="names a stream created at"):
        decide("O", T2, [Life(T1, "O")], LifeChoice.parse(f"new:{T3}"))


def test_a_store_that_went_back_starts_a_life_of_its_own_at_the_next_sequence():
    """Sequences up to the rollback stay the first life's (they are the same messages), those
    after land under the next key; recording it twice records it once."""
    anchor = OriginMark("O", 2000, 111)
    first = [Life(T1, "O")]
    assert went_back("O", T1, first, anchor) == [Life(T1, "O#2", 2001, anchor)]
    lives = [*first, Life(T1, "O#2", 2001, anchor)]
    assert went_back("O", T1, lives, anchor) == []
    keys = origin_keys("O", T1, lives)
    assert keys.current == "O#2" and keys.anchor == anchor
    assert [keys.key_of(s) for s in (1, 2000, 2001, 5000)] == ["O", "O", "O#2", "O#2"]
    split = keys.split(np.array([5, 2001, 1999, 3000]))
    assert {k: v.tolist() for k, v in split.items()} == {"O": [5, 1999], "O#2": [2001, 3000]}
    table = pa.table({"origin_stream": ["O"] * 3, "origin_seq": pa.array([2000, 2001, 7], pa.int64())})
    assert keys.apply(table).column("origin_stream").to_pylist() == ["O", "O#2", "O"]

    # went back again, below the first rollback: everything after it is the third life's
    again = OriginMark("O", 1500, 99)
    lives.append(went_back("O", T1, lives, again)[0])
    keys = origin_keys("O", T1, lives)
    assert keys.segments == ((1, "O"), (1501, "O#3"))
    # and above it: the second life keeps what lies between
    lives2 = [*first, Life(T1, "O#2", 2001, anchor), Life(T1, "O#3", 2501, OriginMark("O#2", 2500, 5))]
    assert origin_keys("O", T1, lives2).segments == ((1, "O"), (2001, "O#2"), (2501, "O#3"))


def test_continue_copies_the_whole_chain_and_went_back_alone_means_continue():
    anchor = OriginMark("O", 10, 1)
    lives = [Life(T1, "O"), Life(T1, "O#2", 11, anchor)]
    copy = [Life(T2, "O"), Life(T2, "O#2", 11, anchor)]
    assert decide("O", T2, lives, LifeChoice.parse(f"continue:{T2}")) == copy
    assert decide("O", T2, lives, LifeChoice.parse("went-back:5")) == copy
    # a checked went-back records its life after the continued chain (to_record: one step at a time)
    choice = LifeChoice("went-back", seq=5, anchor=OriginMark("O", 5, 7))
    assert to_record("O", T2, [*lives, *copy], choice) == [Life(T2, "O#3", 6, OriginMark("O", 5, 7))]
    # a routed landing's new table takes the other tables' lives
    assert decide("O", T1, [], None, like=lives) == lives


def test_plans_carry_the_keys_and_older_plans_one_key():
    keys = OriginKeys("O", T1, ((1, "O"), (11, "O#2")))
    back = OriginKeys.from_list(keys.to_list())
    assert back is not None and back.segments == keys.segments
    old = OriginKeys.from_list("O#3")
    assert old is not None and old.segments == ((1, "O#3"),)
    assert OriginKeys.from_list(None) is None


def test_went_back_parses_and_prints():
    choice = LifeChoice.parse("went-back:2000")
    assert choice is not None and (choice.mode, choice.seq, str(choice)) == ("went-back", 2000, "went-back:2000")


@pytest.mark.parametrize("bad", ["new", "new:", "later:" + T1, ":" + T1, "NEW:" + T1, "went-back:", "went-back:x",
                                 "went-back:-3"])
def test_bad_choices_name_the_field(bad):
    with pytest.raises(ConfigError) as e:
        MemberJobSpec.build({"stream": "O", "group": "g", "member": "m1", "sink_path": "/l", "stream_life": bad})
    assert e.value.field == "stream_life"


def test_the_option_round_trips_through_the_command_line():
    for value in (f"new:{T2}", "went-back:41"):
        spec = MemberJobSpec.build({"stream": "O", "group": "g", "member": "m1", "sink_path": "/l",
                                    "stream_life": value})
        assert "--stream-life" in spec.to_argv()
        assert MemberJobSpec.from_argv(spec.to_argv()).stream_life == value
