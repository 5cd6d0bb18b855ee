"""What a visitor's errors leave in the server's log: one line each; a traceback only for the app's own bugs, a few
a minute."""
from __future__ import annotations

import logging

import gradio as gr
import pytest

from explorer.panels import errors


def _lines(caplog) -> list[str]:
    return [line for r in caplog.records if r.name == "explorer.user" for line in r.getMessage().splitlines()
            + ([""] * 50 if r.exc_info else [])]  # a traceback counts as many lines


def test_a_user_error_logs_exactly_one_line_and_gradio_prints_no_traceback(caplog):
    @errors.user_errors
    def view(layer):
        raise ValueError(f"layer must be between 0 and 3,\ngot {layer!r}.")

    with caplog.at_level(logging.INFO, logger="explorer.user"), pytest.raises(gr.Error) as caught:
        view(7)
    assert caught.value.print_exception is False  # Gradio's queue prints a traceback unless this is False
    assert _lines(caplog) == ["user error in test_a_user_error_logs_exactly_one_line_and_gradio_prints_no_traceback"
                              ".<locals>.view: layer must be between 0 and 3, got 7."]


def test_a_user_error_from_a_stream_and_a_raised_gr_error_log_one_line_each(caplog):
    @errors.user_errors
    def stream():
        yield 1
        raise gr.Error("Choose a head.")

    with caplog.at_level(logging.INFO, logger="explorer.user"), pytest.raises(gr.Error) as caught:
        list(stream())
    assert caught.value.print_exception is False and len(_lines(caplog)) == 1


def test_unexpected_errors_show_a_sentence_and_log_a_few_tracebacks_a_minute(caplog, monkeypatch):
    monkeypatch.setattr(errors, "_tracebacks", type(errors._tracebacks)())

    @errors.user_errors
    def broken():
        return {}["missing"]

    with caplog.at_level(logging.INFO, logger="explorer.user"):
        for _ in range(errors.TRACEBACKS_PER_MINUTE + 3):
            with pytest.raises(gr.Error) as caught:
                broken()
            assert caught.value.message == errors.UNEXPECTED and caught.value.print_exception is False
    records = [r for r in caplog.records if r.name == "explorer.user"]
    assert [bool(r.exc_info) for r in records] == [True] * errors.TRACEBACKS_PER_MINUTE + [False] * 3
    assert "KeyError: 'missing' (traceback left out" in records[-1].getMessage()


def test_a_400_digit_number_is_quoted_by_its_first_digits_and_length():
    @errors.user_errors
    def view():
        raise ValueError(f"layer must be between 0 and 3, got {10 ** 399}.")

    with pytest.raises(gr.Error) as caught:
        view()
    assert caught.value.message == "layer must be between 0 and 3, got 10000000… (400 digits)."
    assert errors.short_numbers("port 12345678901234567890 stays") == "port 12345678901234567890 stays"  # 20 digits
