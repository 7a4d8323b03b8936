"""Which webhooks a service is given (``keeper.runtime.webhooks.webhook_urls``): those of
``EXO_DEPLOY_WEBHOOKS`` (commas or whitespace between) then of ``--webhook``, each once; a bad
one is a usage error naming it; and how a webhook is shown without the secret in its path."""

from __future__ import annotations

import pytest

from keeper.cli import build_parser
from keeper.runtime.outbox import endpoint_label
from keeper.runtime.webhooks import WebhookUrlError, webhook_urls


def test_the_environment_and_the_flags_list_webhooks_in_order_each_once() -> None:
    env = "https://hooks.slack.com/services/T/B/x, http://ntfy.lan:8080/alerts\nhttp://a/b"
    given = ["http://a/b", "https://discord.com/api/webhooks/1/t"]
    assert webhook_urls(given, env) == (
        "https://hooks.slack.com/services/T/B/x",
        "http://ntfy.lan:8080/alerts",
        "http://a/b",
        "https://discord.com/api/webhooks/1/t",
    )
    assert webhook_urls([], "") == ()


@pytest.mark.parametrize("bad", ["ftp://host/x", "hooks.slack.com/x", "http://", "http://[::1/x"])
def test_a_bad_webhook_is_named(bad: str) -> None:
    with pytest.raises(WebhookUrlError, match=repr(bad).replace("[", r"\[")):
        webhook_urls([], bad)
    with pytest.raises(WebhookUrlError, match=repr(bad).replace("[", r"\[")):
        webhook_urls([bad], "")


def test_every_service_takes_repeated_webhook_flags_and_refuses_a_bad_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = build_parser()
    for argv in (["master"], ["bridge", "--exo", "http://e:52415"], ["cluster"]):
        args = parser.parse_args([*argv, "--webhook", "http://a/1", "--webhook", "http://b/2"])
        assert args.webhook == ["http://a/1", "http://b/2"]
    with pytest.raises(SystemExit) as exited:
        parser.parse_args(["master", "--webhook", "nope"])
    assert exited.value.code == 2
    assert "'nope'" in capsys.readouterr().err


def test_a_webhook_is_shown_without_its_path() -> None:
    assert endpoint_label("https://hooks.slack.com/services/T/B/secret") == (
        "https://hooks.slack.com/…"
    )
    assert endpoint_label("http://127.0.0.1:8080") == "http://127.0.0.1:8080"
