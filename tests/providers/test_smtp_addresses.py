"""An internationalized address through an SMTP server that does not offer SMTPUTF8 (real aiosmtpd).

The API accepts ``ü@example.com`` (email-validator allows SMTPUTF8 addresses). Such a server cannot
carry it: that is this message's failure, permanent, not the server's. Before, it was a transient
``connection_error``: an end-to-end probe (2026-11-28) had one tenant send ten such emails through
the SMTP route, which opened the worker's SMTP breaker; another tenant's 20 emails (0.66 s alone)
were all still ``retrying`` 100 s later."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from harness.fakes import make_message
from providers.errors import PermanentProviderError, TransientProviderError
from schema.enums import Channel
from tests.fixtures.mailbox import Mailbox, smtp_provider, smtp_server


@pytest.fixture
def ascii_only() -> Iterator[tuple[Mailbox, int]]:
    """A working SMTP server that does not advertise SMTPUTF8."""
    with smtp_server(smtputf8=False) as server:
        yield server


async def test_a_non_ascii_address_the_server_cannot_carry_is_a_permanent_failure_of_that_email(
    ascii_only: tuple[Mailbox, int],
) -> None:
    mailbox, port = ascii_only
    smtp = smtp_provider(port)

    with pytest.raises(PermanentProviderError) as caught:
        await smtp.send(make_message(Channel.email, to="ü@example.com"))

    assert caught.value.code == "smtputf8_unsupported"
    assert not isinstance(caught.value, TransientProviderError)
    result = await smtp.send(make_message(Channel.email, to="ada@example.com"))  # the server works
    assert result.provider == "smtp" and [e.rcpt_tos for e in mailbox.messages] == [["ada@example.com"]]
