"""Fixtures of the end-to-end suite: the SMS lane of the retry and dead-letter tests, one per module
(each test gets a tenant of its own and the fake's knobs reset)."""

from tests.fixtures.sms_lane import lane_client, sms_lane

__all__ = ["lane_client", "sms_lane"]
