"""Images for a node that reaches no registry: the pod sandbox ("pause") image, built here from
the pinned Kubernetes release's own `build/pause/linux/pause.c`, a probe image for tests
(probe.c), and any OCI or Docker archive imported into the node's containerd with `ctr`.

The two small images are written as OCI image layout archives by this module (one uncompressed
layer holding the static binary), byte for byte the same for the same binary, and cached under
~/.cache/kyma-compass-pull/node/images/.
"""

from __future__ import annotations

import fcntl
import gzip
import hashlib
import io
import json
import os
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, cast

from devenv.node.host import HostError

TOOLCHAIN_DIR = Path(__file__).resolve().parent.parent / "toolchain"


def _kubernetes_version() -> str:
    for line in (TOOLCHAIN_DIR / "versions.env").read_text().splitlines():
        if line.startswith("KUBERNETES_VERSION="):
            return line.split("=", 1)[1].strip()
    raise HostError("versions.env names no KUBERNETES_VERSION")


def pause_image_name() -> str:
    return f"localhost/kyma-compass-pull/pause:v{_kubernetes_version()}"


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "kyma-compass-pull" / "node" / "images"


def _pause_source() -> Path:
    """pause.c of the pinned release, from the Go module cache (the toolchain module has it)."""
    result = subprocess.run(
        ["go", "mod", "download", "-json", f"k8s.io/kubernetes@v{_kubernetes_version()}"],
        cwd=TOOLCHAIN_DIR / "kube-apiserver",
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise HostError(f"go mod download k8s.io/kubernetes failed: {result.stderr.strip()}")
    source = Path(json.loads(result.stdout)["Dir"]) / "build" / "pause" / "linux" / "pause.c"
    if not source.is_file():
        raise HostError(f"{source} is missing")
    return source


def _sha256(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _tar_member(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    info.mtime = 0
    tar.addfile(info, io.BytesIO(data))


def oci_archive(binary: bytes, *, entrypoint: str, name: str) -> bytes:
    """An OCI image layout archive of one image: `binary` at /`entrypoint`, run as its entry point,
    named `name` (containerd's `io.containerd.image.name`, which `ctr images import` uses)."""
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        _tar_member(layer, entrypoint.lstrip("/"), binary, 0o755)
    layer_bytes = layer_buffer.getvalue()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": [entrypoint], "User": "65535:65535"},
            "rootfs": {"type": "layers", "diff_ids": [_sha256(layer_bytes)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": _sha256(config),
                "size": len(config),
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": _sha256(layer_bytes),
                    "size": len(layer_bytes),
                }
            ],
        },
        sort_keys=True,
    ).encode()
    index = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": _sha256(manifest),
                    "size": len(manifest),
                    "annotations": {
                        "io.containerd.image.name": name,
                        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
                    },
                }
            ],
        },
        sort_keys=True,
    ).encode()
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        _tar_member(archive, "oci-layout", b'{"imageLayoutVersion":"1.0.0"}')
        _tar_member(archive, "index.json", index)
        for blob in (layer_bytes, config, manifest):
            _tar_member(archive, "blobs/sha256/" + _sha256(blob).split(":", 1)[1], blob)
    return out.getvalue()


def probe_image_name() -> str:
    return "localhost/kyma-compass-pull/node-probe:1"


def pause_archive() -> Path:
    """The pause image's OCI archive: a static `pause` from the pinned release's pause.c."""
    return _static_image("pause", _pause_source, pause_image_name())


def probe_archive() -> Path:
    """The probe image's OCI archive: a static `/probe HOST PORT` (probe.c, beside this file),
    for pods that show what the pod network reaches."""
    return _static_image("probe", lambda: Path(__file__).with_name("probe.c"), probe_image_name())


def _static_image(program: str, source: Callable[[], Path], name: str) -> Path:
    """An image of one static C program (compiled with the host's C compiler), built once and
    cached under a name that says which release and which source it is."""
    source_path = source()
    key = hashlib.sha256(source_path.read_bytes() + name.encode()).hexdigest()[:12]
    cache = _cache_dir()
    archive = cache / f"{program}-{key}.oci.tar"
    if archive.is_file():
        return archive
    cache.mkdir(parents=True, exist_ok=True)
    with (cache / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if archive.is_file():
            return archive
        binary = cache / f"{program}-{key}"
        result = subprocess.run(
            [
                "gcc",
                "-Os",
                "-static",
                "-Wall",
                f'-DVERSION="v{_kubernetes_version()}"',
                "-o",
                str(binary),
                str(source_path),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise HostError(f"compiling {source_path.name} failed: {result.stderr.strip()}")
        subprocess.run(["strip", str(binary)], check=False, capture_output=True)
        data = oci_archive(binary.read_bytes(), entrypoint=f"/{program}", name=name)
        binary.unlink()
        partial = archive.with_suffix(".partial")
        partial.write_bytes(data)
        partial.replace(archive)
    return archive


def import_archive(ctr_address: Path, archive: Path) -> list[str]:
    """Imports an OCI or Docker image archive (plain or gzipped) into the node's containerd, in
    the namespace the kubelet's pods use; returns the image names it brought in."""
    with archive.open("rb") as head:
        gzipped = head.read(2) == b"\x1f\x8b"
    opened = cast(IO[bytes], gzip.open(archive, "rb") if gzipped else archive.open("rb"))  # noqa: SIM115
    with opened as stream:
        result = subprocess.run(
            [
                "ctr",
                "--address",
                str(ctr_address),
                "--namespace",
                "k8s.io",
                "images",
                "import",
                "-",
            ],
            stdin=stream,
            capture_output=True,
            text=True,
            check=False,
        )
    if result.returncode != 0:
        raise HostError(f"ctr images import {archive} failed: {result.stderr.strip()}")
    return [
        line.split()[1]
        for line in result.stdout.splitlines()
        if line.startswith("unpacking ") and len(line.split()) > 1
    ]
