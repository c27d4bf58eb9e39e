"""The check every Google API answer passes before a client library reads it (tpuops/cloud/answers.py), on real
`requests.Response` objects: JSON objects pass; a web page, cut or damaged JSON and a JSON that is no object are
one line naming what came; error answers are left to api_core; TPUOPS_API_TIMEOUT is checked."""

from __future__ import annotations

import pytest
import requests

from tpuops.cloud import answers
from tpuops.errors import UsageError


def _response(
    status: int, body: bytes, content_type: str = "application/json; charset=UTF-8"
) -> requests.Response:
    resp = requests.Response()
    resp.status_code, resp._content, resp.url = (
        status,
        body,
        "https://tpu.googleapis.com/v2/projects/p/locations",
    )
    resp.headers["Content-Type"] = content_type
    return resp


@pytest.mark.parametrize(
    "body",
    [b'{"nodes": []}', b"{}", b"", b'{"name": "caf\xc3\xa9"}'],
    ids=["object", "empty", "no body", "utf8"],
)
def test_a_json_object_passes(body: bytes) -> None:
    answers.check(_response(200, body))


@pytest.mark.parametrize(
    "status, body, kind, says",
    [
        (200, b"<!DOCTYPE html><html><head><title>Sign in</title></head></html>", "text/html",
         "an HTML page ('Sign in') with HTTP 200"),
        (200, b"<html><body>portal</body></html>", "application/json", "an HTML page with HTTP 200"),
        (200, b'{"nodes": [{"name": "projects/p/locations/z/nodes/n", "sta', "application/json",
         "bytes): Unterminated string starting at byte 54"),
        (200, b"[1, 2]", "application/json", "answered JSON list, not an object"),
        (204, b"null", "application/json", "answered JSON NoneType, not an object"),
    ],
    ids=["portal", "html-as-json", "cut", "list", "null"],
)  # fmt: skip
def test_what_is_not_the_apis_json_is_one_line(status: int, body: bytes, kind: str, says: str) -> None:
    with pytest.raises(answers.BadAnswerError) as e:
        answers.check(_response(status, body, kind))
    assert says in e.value.detail and "\n" not in e.value.detail and e.value.host == "tpu.googleapis.com"
    assert e.value.page == ("HTML" in says)


def test_error_answers_are_left_to_api_core() -> None:
    answers.check(_response(502, b"<html><title>502 Proxy Error</title></html>", "text/html"))


def test_an_api_message_or_page_becomes_one_short_line() -> None:
    assert answers.one_line("<!DOCTYPE html>\n<html><head><title>502 Proxy Error</title>") == (
        "an HTML page ('502 Proxy Error')"
    )
    assert answers.one_line("a\n  b\tc") == "a b c"
    assert len(answers.one_line("x" * 1000)) == 160


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "soon"])
def test_a_bad_per_call_timeout_is_exit_2(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(answers.TIMEOUT_ENV, value)
    with pytest.raises(UsageError, match=answers.TIMEOUT_ENV):
        answers.call_limits()


def test_the_deadline_is_four_tries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(answers.TIMEOUT_ENV, raising=False)
    assert answers.call_limits() == (30.0, 120.0)
    monkeypatch.setenv(answers.TIMEOUT_ENV, "0.5")
    assert answers.call_limits() == (0.5, 2.0)


def test_a_change_whose_answer_was_lost_says_it_may_have_been_done() -> None:
    cut = answers.BadAnswerError("answered JSON that is cut off", page=False, host="tpu.googleapis.com")
    for lost in (requests.ReadTimeout("read timed out"), cut):
        change = answers.failure("TPU API", "create n in z", lost, "tpu.googleapis.com", (30.0, 120.0))
        read = answers.failure("TPU API", "get n in z", lost, "tpu.googleapis.com", (30.0, 120.0))
        assert (change.hint or "").startswith("it may still have been done: look with `tpuops vm describe`")
        assert "may still have been done" not in (read.hint or "")
        assert change.exit_code == read.exit_code == 6
    page = answers.BadAnswerError("answered an HTML page", page=True, host="tpu.googleapis.com")
    assert "may still" not in (answers.failure("TPU API", "create n", page, "h", (1.0, 4.0)).hint or "")
