import pytest

from vaswani.training.time_budget import Deadline, format_duration, parse_duration


@pytest.mark.parametrize(
    "text, seconds",
    [("15m", 900), ("90s", 90), ("2h", 7200), ("1h30m", 5400), ("1h0m5s", 3605), ("600", 600),
     ("1.5h", 5400), (" 2m ", 120), (45, 45), ("2H", 7200)],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "abc", "15x", "m", "30m1h", "0", "-5", "1h-30m", "inf", "nan"])
def test_parse_duration_errors(text):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(text)


def test_deadline_with_fake_clock():
    now = [100.0]
    deadline = Deadline("1m", clock=lambda: now[0])
    assert deadline.remaining() == 60 and not deadline.expired()
    now[0] = 160.0
    assert deadline.expired() and deadline.elapsed() == 60


def test_format_duration():
    assert [format_duration(s) for s in (0, 44.6, 60, 725, 3600, 4020, -3)] == \
        ["0s", "45s", "1m00s", "12m05s", "1h00m", "1h07m", "0s"]


def test_forecast_end_takes_the_first_of_the_fixed_ends_and_the_clock():
    from vaswani.training.time_budget import forecast_end

    # 100 updates in 50 s (0.5 s each): 600 s left reach 1,200 more updates, past max_steps 1,000
    assert forecast_end(100, 100, 50.0, [1000], seconds_left=600.0) == (1000, 450.0)
    # 100 s left: 200 more updates, before max_steps
    assert forecast_end(100, 100, 50.0, [1000], seconds_left=100.0) == (300, 100.0)
    # a resumed invocation: its own pace (20 updates in 20 s since step 500), the run's step
    assert forecast_end(520, 20, 20.0, [], seconds_left=30.0) == (550, 30.0)
    # out of time: the end is now, never before the current step
    assert forecast_end(100, 100, 50.0, [1000], seconds_left=-5.0) == (100, 0.0)
    assert forecast_end(1200, 10, 5.0, [1000]) == (1200, 0.0)  # resumed past a lowered max_steps
    # before the first update the pace is unknown: the fixed end only, no seconds
    assert forecast_end(0, 0, 3.0, [1000], seconds_left=600.0) == (1000, None)
    assert forecast_end(0, 0, 3.0, [], seconds_left=600.0) == (None, None)


def test_a_resumed_run_continues_its_clock():
    now = [500.0]
    deadline = Deadline("10m", clock=lambda: now[0])
    now[0] += 30.0
    deadline.credit(400.0)  # what the checkpoint says the earlier invocations used
    assert deadline.elapsed() == pytest.approx(430.0) and deadline.remaining() == pytest.approx(170.0)
    deadline.credit(-5.0)  # nothing negative
    assert deadline.elapsed() == pytest.approx(430.0)
