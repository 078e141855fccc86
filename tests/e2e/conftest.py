"""Fixtures of the end-to-end suite: the SMS lane the retry and dead-letter tests share, one for the
session (each test gets a tenant of its own and the fake's knobs reset)."""

from tests.fixtures.sms_lane import lane_client, sms_lane

__all__ = ["lane_client", "sms_lane"]
