"""Every outcome a scheduler can give has one HTTP status and one gRPC code (no wording is parsed)."""

from mainspring.frontend.dataplane import HTTP_STATUS
from mainspring.frontend.grpc import _CODES
from mainspring.protocol import Outcome, ResponseStatus


def test_every_outcome_maps_to_a_client_status() -> None:
    assert set(HTTP_STATUS) == set(Outcome)
    assert all(HTTP_STATUS[o] in _CODES for o in Outcome if o is not Outcome.SERVED)
    assert {o for o in Outcome if o.status is ResponseStatus.REJECTED} == {
        Outcome.DEADLINE_AT_ARRIVAL, Outcome.OVERLOADED, Outcome.EXPIRED_IN_QUEUE
    }  # fmt: skip
    assert HTTP_STATUS[Outcome.OVERLOADED] == 429 and HTTP_STATUS[Outcome.EXPIRED_IN_QUEUE] == 504
    assert HTTP_STATUS[Outcome.SERVED] == 200 and Outcome.SERVED.status is ResponseStatus.SUCCESS
