"""The bearer token check: what passes and what does not."""

from __future__ import annotations

import pytest

from mainspring.frontend.access import Access, Scope


@pytest.mark.parametrize(
    ("header", "allowed"),
    [
        ("Bearer s3cret", True),
        ("bearer s3cret", True),  # the scheme is case-insensitive (RFC 9110): curl users write either
        ("BEARER s3cret", True),
        (None, False),
        ("", False),
        ("Bearer", False),
        ("Bearer ", False),
        ("s3cret", False),
        ("Bearer S3CRET", False),  # the token itself is not
        ("Bearer s3cret extra", False),
        ("Basic s3cret", False),
        ("Bearer s3cre", False),
    ],
)
def test_only_the_bearer_token_opens_the_repository(header: str | None, allowed: bool) -> None:
    access = Access("s3cret")
    assert access.allows(Scope.REPOSITORY, header) is allowed
    assert access.allows(Scope.INFERENCE, header)  # open unless protect_inference
    assert Access("s3cret", protect_inference=True).allows(Scope.INFERENCE, header) is allowed
    assert access.allows(Scope.HEALTH, None) and Access().allows(Scope.REPOSITORY, None)
