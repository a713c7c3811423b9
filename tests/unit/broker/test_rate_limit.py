"""The per-runtime token bucket (`overload/rate_limit`)."""

from __future__ import annotations

import pytest

from control_plane_broker.overload.rate_limit import BucketPolicy, take


def test_bucket_allows_burst_then_waits_for_refill() -> None:
    policy = BucketPolicy(burst=2, per_second=0.5)
    bucket, wait = take(None, policy, now=0.0)
    assert wait is None
    bucket, wait = take(bucket, policy, now=0.0)
    assert wait is None
    bucket, wait = take(bucket, policy, now=0.0)
    assert wait == pytest.approx(2.0)
    bucket, wait = take(bucket, policy, now=2.0)
    assert wait is None
