"""Revocation rules and the xfcc deny list: the annotation revokes whatever its value, the deny
list's format, re-reading the file as it changes (at most once per second), and the XFCC hash
the deny list is checked against."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from control_plane_broker.errors import IdentityNotProven
from control_plane_broker.identity.verifier import XfccVerifier
from control_plane_broker.identity.xfcc import identity_from_xfcc, normalise_hash
from control_plane_broker.registration.state import ANNOTATION_REVOKED, Mapping
from control_plane_broker.revocation.deny_list_file import DenyListFile
from control_plane_broker.revocation.revocation_rules import (
    DenyList,
    Revoked,
    parse_deny_list,
    revoked,
)
from control_plane_broker.settings import Settings

H1, H2, H3 = "1" * 64, "ab" * 32, "c" * 64


def mapping(**annotations: str) -> Mapping:
    return Mapping.from_object(
        {"metadata": {"name": "rt-1", "resourceVersion": "1", "annotations": annotations}}
    )


def test_the_annotation_revokes_whatever_its_value() -> None:
    assert revoked(
        mapping(**{ANNOTATION_REVOKED: "compromised"}), certificate_hash=None, deny=frozenset()
    ) == Revoked("annotation", "an operator revoked this runtime: compromised")
    empty = revoked(mapping(**{ANNOTATION_REVOKED: ""}), certificate_hash=None, deny=frozenset())
    assert empty == Revoked("annotation", "an operator revoked this runtime")
    assert revoked(mapping(), certificate_hash=None, deny=frozenset()) is None
    assert revoked(None, certificate_hash=None, deny=frozenset()) is None
    long = revoked(
        mapping(**{ANNOTATION_REVOKED: "x" * 5000}), certificate_hash=None, deny=frozenset()
    )
    assert long is not None
    assert len(long.detail) < 400


def test_the_deny_list_revokes_the_certificate_it_names() -> None:
    deny = frozenset({H1})
    assert revoked(mapping(), certificate_hash=H1, deny=deny) == Revoked(
        "deny-list", "this runtime's client certificate is on the deny list"
    )
    assert revoked(mapping(), certificate_hash=H2, deny=deny) is None
    assert revoked(None, certificate_hash=H1, deny=deny) is not None


def test_deny_list_format() -> None:
    text = (
        f"# revoked certificates\n{H1}\n\n  {H2.upper()}  # laptop of rt-2\nnot-a-hash\n{H1[:-1]}\n"
    )
    assert parse_deny_list(text) == DenyList(frozenset({H1, H2}), bad_lines=(5, 6))
    assert parse_deny_list("") == DenyList(frozenset())


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (H2.upper(), H2),
        (f" {H1} ", H1),
        ("", None),
        (None, None),
        ("ab" * 31, None),
        ("g" * 64, None),
    ],
)
def test_the_xfcc_hash_as_the_deny_list_holds_it(value: str | None, expected: str | None) -> None:
    assert normalise_hash(value) == expected


def test_the_identity_carries_the_hash_of_the_last_element() -> None:
    header = f'Hash={H3};Subject="CN=rt-1",Hash={H2.upper()};Subject="O=kyma,CN=rt-1";URI='
    identity = identity_from_xfcc(
        {"x-forwarded-client-cert": header}, runtime_id="rt-1", trusted=True
    )
    assert identity.certificate_hash == H2
    without = identity_from_xfcc(
        {"x-forwarded-client-cert": 'Subject="CN=rt-1"'}, runtime_id="rt-1", trusted=True
    )
    assert without.certificate_hash is None


async def test_with_a_deny_list_a_certificate_without_a_hash_proves_nothing() -> None:
    headers = {"x-forwarded-client-cert": 'Subject="CN=rt-1"'}
    with pytest.raises(IdentityNotProven) as refused:
        await XfccVerifier(trusted=True, deny_list_configured=True).verify(
            runtime_id="rt-1", headers=headers
        )
    assert refused.value.reason == "no-hash"
    identity = await XfccVerifier(trusted=True).verify(runtime_id="rt-1", headers=headers)
    assert identity.runtime_id == "rt-1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def write(path: Path, text: str, *, mtime_ns: int) -> None:
    path.write_text(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_the_file_is_read_again_when_it_changes_at_most_once_per_second(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "deny-list"
    write(path, f"{H1}\n", mtime_ns=1_000_000_000)
    clock = Clock()
    deny = DenyListFile(path, clock=clock)
    assert deny.hashes() == {H1}
    write(path, f"{H1}\n{H2}\n", mtime_ns=2_000_000_000)
    clock.now += 0.5
    assert deny.hashes() == {H1}  # not looked at within the second
    clock.now += 0.5
    assert deny.hashes() == {H1, H2}
    # Same size, new time: read again (an edit that keeps the length).
    write(path, f"{H3}\n{H2}\n", mtime_ns=3_000_000_000)
    clock.now += 1
    assert deny.hashes() == {H3, H2}
    # A bad line is logged by number and ignored; the rest counts.
    caplog.set_level(logging.WARNING)
    write(path, f"{H3}\nnonsense\n", mtime_ns=4_000_000_000)
    clock.now += 1
    assert deny.hashes() == {H3}
    [record] = [r for r in caplog.records if "not a SHA-256" in r.getMessage()]
    assert record.lines == [2]  # type: ignore[attr-defined]
    assert "nonsense" not in caplog.text


def test_a_file_that_disappears_keeps_the_last_list_in_force(tmp_path: Path) -> None:
    path = tmp_path / "deny-list"
    write(path, f"{H1}\n", mtime_ns=1_000_000_000)
    clock = Clock()
    deny = DenyListFile(path, clock=clock)
    path.unlink()
    clock.now += 5
    assert deny.hashes() == {H1}
    write(path, f"{H2}\n", mtime_ns=5_000_000_000)
    clock.now += 5
    assert deny.hashes() == {H2}


def test_a_missing_file_at_start_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        DenyListFile(tmp_path / "absent")


def test_a_deny_list_outside_xfcc_mode_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="xfcc only"):
        Settings(xfcc_deny_list_file=tmp_path / "deny-list")
    Settings(xfcc_deny_list_file=tmp_path / "deny-list", identity_mode="xfcc")


def test_report_settings_must_fit_together() -> None:
    with pytest.raises(ValueError, match="BROKER_REPORT_STALE_SECONDS"):
        Settings(report_stale_seconds=3900)  # not above 3600 + 300
    with pytest.raises(ValueError, match="BROKER_REPORT_INTERVAL_SECONDS"):
        Settings(report_interval_seconds=5)
    Settings(
        report_refresh_seconds=2,
        report_interval_seconds=1,
        report_min_interval_seconds=0.1,
        report_stale_seconds=4,
    )
