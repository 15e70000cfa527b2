"""Wall-clock budgets for a run: "15m", "90s", "2h", "1h30m", "1.5h" or plain seconds ("600")."""

from __future__ import annotations

import re
import time

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?$")


def parse_duration(text: str | int | float) -> float:
    """Seconds in `text`: units h, m, s in that order (each at most once), or a bare number."""
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        value = str(text).strip().lower().replace(" ", "")
        try:
            seconds = float(value)
        except ValueError:
            match = _DURATION.match(value)
            if not value or match is None:
                raise ValueError(
                    f"cannot read the duration {text!r}; write e.g. '90s', '15m', '2h', '1h30m' or plain seconds"
                ) from None
            hours, minutes, secs = (float(g) if g else 0.0 for g in match.groups())
            seconds = hours * 3600 + minutes * 60 + secs
    if seconds <= 0 or seconds != seconds or seconds == float("inf"):
        raise ValueError(f"the duration {text!r} must be a positive, finite time")
    return seconds


class Deadline:
    """A budget that started when this object was made; `expired()` once it is used up.

    A resumed run's budget is the run's, not the invocation's: `credit(seconds)` counts the time its earlier
    invocations used (the loop saves `elapsed()` in each checkpoint), so a rerun continues where the clock stood."""

    def __init__(self, budget: str | float, clock=time.monotonic):
        self.seconds = parse_duration(budget)
        self._clock = clock
        self._start = clock()

    def credit(self, seconds: float) -> None:
        """Count `seconds` as already used (by the invocations before a resume)."""
        self._start -= max(0.0, float(seconds))

    def elapsed(self) -> float:
        return self._clock() - self._start

    def remaining(self) -> float:
        return self.seconds - self.elapsed()

    def expired(self) -> bool:
        return self.remaining() <= 0


def forecast_end(step: int, steps_done: int, elapsed: float, ends: list[int],
                 seconds_left: float | None = None) -> tuple[int | None, float | None]:
    """(the step a run should end at, seconds of training left), at this invocation's pace (`steps_done` updates in
    `elapsed` seconds, evaluations and saves included): the first of the fixed `ends` (max_steps, the last step of
    max_epochs) and of the step that `seconds_left` of the budget reach. (None, None) while nothing says it; the
    seconds are None until the pace is known."""
    per_step = elapsed / steps_done if steps_done > 0 else None
    ends = list(ends)
    if seconds_left is not None and per_step:
        ends.append(step + int(max(0.0, seconds_left) / per_step))
    end = max(step, min(ends)) if ends else None
    return end, (end - step) * per_step if end is not None and per_step else None


def format_duration(seconds: float) -> str:
    """"45s", "12m05s", "1h07m": a duration as progress lines print it."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
