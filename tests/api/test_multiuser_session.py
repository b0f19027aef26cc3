"""The dashboard's session cookie: a uid and an expiry, signed; anything else is no session."""

from __future__ import annotations

import os

from gpupool.api.dashboard import Sessions


def test_a_session_names_its_uid_until_it_expires() -> None:
    sessions = Sessions(os.urandom(32))
    cookie = sessions.issue(1234)
    assert sessions.check(cookie) == 1234
    assert Sessions(os.urandom(32)).check(cookie) is None  # another daemon's key
    assert (
        Sessions(sessions.key, lifetime_s=-1).check(Sessions(sessions.key, lifetime_s=-1).issue(0))
        is None
    )


def test_a_forged_or_malformed_cookie_is_no_session() -> None:
    sessions = Sessions(os.urandom(32))
    uid, expiry, mac = sessions.issue(1000).split(".")
    for cookie in (
        f"0.{expiry}.{mac}",  # another uid under the same signature
        f"{uid}.{int(expiry) + 1}.{mac}",
        f"{uid}.{expiry}.{mac.upper()}",
        f"{uid}.{expiry}",
        "",
        "²." + expiry + "." + mac,  # a digit outside ASCII
        f"{uid}.{expiry}.{mac}é",
        "\udcff",
    ):
        assert sessions.check(cookie) is None, cookie
