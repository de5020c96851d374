"""stream_life.decide: which life of an origin stream a table lands, and what it refuses."""

from __future__ import annotations

import pytest

from airflow_provider_cg.core.errors import ConfigError
from airflow_provider_cg.core.landing.contract import MemberJobSpec
from airflow_provider_cg.core.landing.stream_life import Life, LifeChoice, StreamLifeChanged, decide

T1, T2, T3 = "2026-11-01T00:00:00.1Z", "2026-11-02T00:00:00.2Z", "2026-11-03T00:00:00.3Z"


def test_the_first_life_lands_under_the_streams_name_and_is_recorded():
    assert decide("O", T1, [], None) == (Life(T1, "O"), True)
    assert decide("O", T1, [Life(T1, "O")], None) == (Life(T1, "O"), False)


def test_an_unknown_life_is_refused_naming_both_and_the_way_forward():
    with pytest.raises(StreamLifeChanged) as e:
        decide("O", T2, [Life(T1, "O")], None)
    assert e.value.field == "stream_life"
    assert T1 in str(e.value) and f"new:{T2}" in str(e.value) and f"continue:{T2}" in str(e.value)


def test_new_and_continue():
    lives = [Life(T1, "O")]
    assert decide("O", T2, lives, LifeChoice.parse(f"new:{T2}")) == (Life(T2, "O#2"), True)
    assert decide("O", T2, lives, LifeChoice.parse(f"continue:{T2}")) == (Life(T2, "O"), True)
    # a third life after a continued one counts keys, not creation times
    lives = [Life(T1, "O"), Life(T2, "O")]
    assert decide("O", T3, lives, LifeChoice.parse(f"new:{T3}")) == (Life(T3, "O#2"), True)
    # an older life met again (a restore of it) lands under its own key, no option needed
    assert decide("O", T1, [Life(T1, "O"), Life(T2, "O#2")], None) == (Life(T1, "O"), False)


def test_a_choice_naming_another_creation_time_is_refused():
    with pytest.raises(ConfigError, match="names a stream created at"):
        decide("O", T2, [Life(T1, "O")], LifeChoice.parse(f"new:{T3}"))


@pytest.mark.parametrize("bad", ["new", "new:", "later:" + T1, ":" + T1, "NEW:" + T1])
def test_bad_choices_name_the_field(bad):
    with pytest.raises(ConfigError) as e:
        MemberJobSpec.build({"stream": "O", "group": "g", "member": "m1", "sink_path": "/l", "stream_life": bad})
    assert e.value.field == "stream_life"


def test_the_option_round_trips_through_the_command_line():
    spec = MemberJobSpec.build({"stream": "O", "group": "g", "member": "m1", "sink_path": "/l",
                                "stream_life": f"new:{T2}"})
    assert "--stream-life" in spec.to_argv()
    assert MemberJobSpec.from_argv(spec.to_argv()).stream_life == f"new:{T2}"
