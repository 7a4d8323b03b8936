"""exo's error body, as the master's API answers every refusal: checked one way by the
in-process API tests (tests/virtual/test_api.py) and the real-server ones
(tests/processes/test_api_process.py)."""

from __future__ import annotations

import httpx


def assert_exo_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == status
    assert error["type"] == httpx.codes.get_reason_phrase(status)
    for fragment in fragments:
        assert fragment in error["message"], error["message"]
    return error["message"]
