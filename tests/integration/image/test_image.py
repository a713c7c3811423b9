"""The image the charts run, built from the Dockerfile here and run from its filesystem.

Both entry points start from the built image (`--help`; `--check-config` refuses a bad setting
in one line, exit 2), as the image's own numeric non-root user; the image holds the product and
not its sources or pip; it is named as the charts default to; and the CA bundle pip was given
during the build (a build secret) is in none of its layers. A second build of the same tree is
the cached archive.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

from devenv.image import build_image, image_name, run_in

# A cold cache builds a base from Debian's packages first (minutes): past the default timeout.
pytestmark = pytest.mark.timeout(1800)

PEM = re.compile(rb"-----BEGIN CERTIFICATE-----\s+(.*?)\s+-----END CERTIFICATE-----", re.DOTALL)


def _read(tar: tarfile.TarFile, name: str) -> IO[bytes]:
    member = tar.extractfile(name)
    assert member is not None, name
    return member


def _manifest(tar: tarfile.TarFile) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    index = json.load(_read(tar, "index.json"))
    (entry,) = index["manifests"]
    manifest = json.load(_read(tar, f"blobs/sha256/{entry['digest'].partition(':')[2]}"))
    config = json.load(_read(tar, f"blobs/sha256/{manifest['config']['digest'].partition(':')[2]}"))
    return entry, manifest, config


def _layer_files(archive: Path) -> Iterator[tuple[str, bytes]]:
    """(path, content) of every regular file in every layer of the archive's image."""
    with tarfile.open(archive) as tar:
        _, manifest, _ = _manifest(tar)
        for layer in manifest["layers"]:
            blob = _read(tar, f"blobs/sha256/{layer['digest'].partition(':')[2]}")
            with tarfile.open(fileobj=blob, mode="r|*") as files:
                for member in files:
                    if member.isfile():
                        content = files.extractfile(member)
                        yield member.name, content.read() if content is not None else b""
                    else:
                        yield member.name, b""


def _certificates(pem: bytes) -> dict[bytes, list[bytes]]:
    """Each certificate's DER, with the base64 lines it is written in."""
    found = {}
    for body in PEM.findall(pem):
        lines = body.split()
        found[base64.b64decode(b"".join(lines))] = lines
    return found


def _public_certificates() -> set[bytes]:
    """The public roots every image may carry: certifi's bundle and Debian's ca-certificates."""
    import certifi  # noqa: PLC0415 (the test's own venv)

    public = set(_certificates(Path(certifi.where()).read_bytes()))
    for path in Path("/usr/share/ca-certificates").rglob("*.crt"):
        public |= set(_certificates(path.read_bytes()))
    return public


def test_the_image_is_named_as_the_charts_default_it(image_archive: Path) -> None:
    with tarfile.open(image_archive) as tar:
        entry, _, _ = _manifest(tar)
    annotations = entry["annotations"]
    assert annotations["io.containerd.image.name"] == image_name()
    assert annotations["org.opencontainers.image.ref.name"] == image_name()


def test_the_image_runs_as_a_numeric_non_root_user(
    image_archive: Path, image_container: str
) -> None:
    with tarfile.open(image_archive) as tar:
        _, _, config = _manifest(tar)
    assert config["config"]["User"] == "65532:65532"
    result = run_in(image_container, "python", "-c", "import os; print(os.getuid(), os.getgid())")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["65532", "65532"]


@pytest.mark.parametrize("command", ["compass-broker", "compass-agent"])
def test_both_entry_points_start_from_the_image(image_container: str, command: str) -> None:
    result = run_in(image_container, command, "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: {command}")
    assert "Traceback" not in result.stderr


def test_check_config_refuses_a_bad_setting_in_one_line(image_container: str) -> None:
    result = run_in(
        image_container, "compass-broker", "--check-config", env={"BROKER_PORT": "notaport"}
    )
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("compass-broker: BROKER_PORT:"), lines[0]


def test_the_image_holds_the_product_and_neither_its_sources_nor_pip(
    image_container: str,
) -> None:
    script = (
        "import importlib.util as u, shutil\n"
        "print([m for m in ('agent', 'control_plane_broker', 'kubeapi', 'observability')"
        " if u.find_spec(m) is None])\n"
        "print([m for m in ('devenv', 'tests', 'bench', 'pip') if u.find_spec(m) is not None])\n"
        "print(shutil.which('pip'))\n"
    )
    result = run_in(image_container, "python", "-c", script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "[]", "None"]
    sources = run_in(image_container, "ls", "/src")
    assert sources.returncode != 0, "the build stage's /src is in the image"


def test_the_ca_bundle_given_to_the_build_is_in_no_layer(image_archive: Path) -> None:
    """The bundle is a build secret, mounted for pip's RUN only: no layer holds the file, a file
    under /run/secrets, or any certificate of the bundle that is not a public root (this
    machine's TLS-inspecting proxy, a company's own CA)."""
    metadata = json.loads((image_archive.parent / "build.json").read_text())
    if metadata["ca_bundle"] is None:
        pytest.skip("this image was built without a CA bundle (IMAGE_CA_BUNDLE, PIP_CERT unset)")
    bundle = Path(metadata["ca_bundle"]["path"])
    if (
        not bundle.is_file()
        or hashlib.sha256(bundle.read_bytes()).hexdigest() != (metadata["ca_bundle"]["sha256"])
    ):
        pytest.skip(f"the CA bundle the image was built with changed since: {bundle}")
    public = _public_certificates()
    private = {
        der: lines for der, lines in _certificates(bundle.read_bytes()).items() if der not in public
    }
    # A certificate as DER, and as the PEM lines it is written in (the middle one of each).
    needles = [der[len(der) // 3 : len(der) // 3 + 48] for der in private]
    needles += [lines[len(lines) // 2] for lines in private.values() if len(lines) > 2]
    bundle_digest = metadata["ca_bundle"]["sha256"]
    files = 0
    for name, content in _layer_files(image_archive):
        files += 1
        assert "run/secrets" not in name, name
        assert hashlib.sha256(content).hexdigest() != bundle_digest, f"{name} is the CA bundle"
        for needle in needles:
            assert needle not in content, f"{name} holds a certificate of the CA bundle"
    assert files > 1000


def test_a_second_build_of_the_same_tree_is_the_cached_archive(image_archive: Path) -> None:
    started = time.monotonic()
    assert build_image(log=lambda _line: None) == image_archive
    assert time.monotonic() - started < 30
