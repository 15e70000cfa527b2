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
