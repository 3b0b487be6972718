"""Progress off a terminal is plain lines (one per tenth of the run, or every N steps); on one, tqdm's bar."""

from __future__ import annotations

import io

import pytest

from klguard.runtime.progress import Progress, format_duration


def _run(total: int, **kwargs) -> list[str]:
    stream = io.StringIO()  # not a terminal
    bar = Progress(total, desc="klguard train", stream=stream, **kwargs)
    for step in range(kwargs.get("initial", 0) + 1, total + 1):
        bar.update(step, {"gold": f"{step / total:.2f}", "kl": "0.0100"})
    bar.close()
    text = stream.getvalue()
    assert "\r" not in text
    return text.splitlines()


def test_a_log_gets_one_line_per_tenth_of_the_run_with_the_figures():
    lines = _run(200)
    assert len(lines) == 10
    assert lines[0].startswith("klguard train: 20/200 steps (10%), ")
    assert "left | gold=0.10 kl=0.0100" in lines[0]
    assert lines[-1].startswith("klguard train: 200/200 steps (100%), ") and "left" not in lines[-1]


def test_every_n_steps_and_the_last_stretch_is_shown_on_close():
    lines = _run(25, every=10)
    assert [line.split(":")[1].split()[0] for line in lines] == ["10/25", "20/25", "25/25"]


def test_a_resumed_run_counts_from_its_step():
    lines = _run(100, initial=55)
    assert [line.split()[2] for line in lines] == ["60/100", "70/100", "80/100", "90/100", "100/100"]


def test_disabled_prints_nothing_and_messages_still_reach_the_log():
    stream = io.StringIO()
    bar = Progress(10, desc="x", enabled=False, stream=stream)
    for step in range(1, 11):
        bar.update(step)
    bar.write("klguard guard [step 3] rollback: why")
    bar.close()
    assert stream.getvalue() == "klguard guard [step 3] rollback: why\n"


def test_a_terminal_gets_the_live_bar():
    stream = io.StringIO()
    bar = Progress(10, desc="klguard train", stream=stream, live=True)
    bar.update(5, {"gold": "0.50"})
    bar.close()
    assert "\r" in stream.getvalue() and "gold=0.50" in stream.getvalue()


@pytest.mark.parametrize(("seconds", "text"), [(0.4, "0s"), (42, "42s"), (185, "3m05s"), (3720, "1h02m")])
def test_format_duration(seconds, text):
    assert format_duration(seconds) == text
