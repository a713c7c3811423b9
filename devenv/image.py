"""The product image, built here without a daemon or a registry (`make image`, docs/image.md).

    python -m devenv.image          build the image (or reuse the cached build), print its archive
    python -m devenv.image --name   print the image's name
    python -m devenv.image --check  exit 0 when a builder can run here, else 3 and the reason

The builder is buildah from Debian's packages (installed with debootstrap when missing, as root),
on storage of its own under the cache (driver vfs), with `--isolation chroot --network host`: no
daemon, no overlay, no user namespaces. The base is the Dockerfile's python:3.11-slim-bookworm,
pinned by digest, where a registry serves it; else one made from Debian's packages with
debootstrap (minbase + python3, python3-venv), cached under a name that says what it contains.

The built image is kept as an OCI archive, `<cache>/images/<key>/image.oci.tar`, keyed by the
hash of everything the build reads: the files the Dockerfile copies, the base and the name. A
second build of the same tree costs a hash. Tests and the real node import the archive
(`ctr -n k8s.io images import`; its index names the image for containerd too).

Environment:
  IMAGE            the image's name (default ghcr.io/kyma-project/kyma-compass-pull:<appVersion>)
  IMAGE_BASE       auto (default: the pinned base if a registry serves it, else Debian's)
                   | registry | debian
  IMAGE_CA_BUNDLE  CA bundle pip trusts inside the build, given as a build secret, never a layer
                   (default: $PIP_CERT, as pip on the host; empty: none)
  DEBIAN_MIRROR    debootstrap's mirror (default http://deb.debian.org/debian)
  XDG_CACHE_HOME   where the cache lives (default ~/.cache); here <cache> is its kyma-compass-pull/

Exit codes: 0 ok; 3 no builder can run here (one line says why; the tests skip with it); 1 the
build failed (the last lines of its log are printed).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO_ROOT / "Dockerfile"
CHARTS = REPO_ROOT / "charts"

# Where a release would publish it; IMAGE= names another (docs/image.md).
REPOSITORY = "ghcr.io/kyma-project/kyma-compass-pull"
# What the build reads: the files and the product packages the Dockerfile copies (a test
# compares this with the Dockerfile's COPY lines).
CONTEXT_FILES = ("Dockerfile", "pyproject.toml", "requirements.lock", "README.md")
CONTEXT_PACKAGES = ("agent", "control_plane_broker", "kubeapi", "observability")
# The build secret the Dockerfile mounts for pip (RUN --mount=type=secret,id=...).
CA_SECRET_ID = "pip-ca"  # noqa: S105 (the name of a file, not a password)

# The base from Debian's packages: what it contains is its name.
DEBIAN_SUITE = "bookworm"
DEBIAN_PACKAGES = ("python3", "python3-venv")
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"

# Changed when the way an image is made changes while its inputs do not: a new key.
RECIPE = 1
# Builds kept in the cache (the most recently built or used).
KEEP_BUILDS = 3
NO_BUILDER = 3
INSTALL = "apt-get install -y buildah debootstrap"

Log = Callable[[str], None]


class NoBuilder(RuntimeError):
    """No builder can run on this machine; the message says why and what to install."""


class BuildError(RuntimeError):
    pass


def _stderr(line: str) -> None:
    print(f"image: {line}", file=sys.stderr, flush=True)


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kyma-compass-pull"


def images_dir() -> Path:
    return cache_dir() / "images"


def app_version() -> str:
    """The charts' appVersion: the image tag they default to (both charts must agree)."""
    versions = {}
    for chart in ("compass-broker", "compass-agent"):
        text = (CHARTS / chart / "Chart.yaml").read_text()
        match = re.search(r"^appVersion:\s*[\"']?([^\"'\s]+)", text, re.MULTILINE)
        if match is None:
            raise BuildError(f"charts/{chart}/Chart.yaml has no appVersion")
        versions[chart] = match.group(1)
    if len(set(versions.values())) != 1:
        raise BuildError(f"the charts' appVersions differ: {versions}")
    return versions["compass-broker"]


def image_name() -> str:
    """`IMAGE`, else the name the charts default to: REPOSITORY:<appVersion>."""
    return os.environ.get("IMAGE") or f"{REPOSITORY}:{app_version()}"


def pinned_base() -> str:
    """The Dockerfile's default PYTHON_IMAGE (the registry base, pinned by digest)."""
    match = re.search(r"^ARG PYTHON_IMAGE=(\S+)", DOCKERFILE.read_text(), re.MULTILINE)
    if match is None:
        raise BuildError("the Dockerfile has no `ARG PYTHON_IMAGE=<default>`")
    return match.group(1)


def debian_base_name() -> str:
    """`localhost/kyma-compass-pull-base:<suite>-<packages>-<key of the recipe>`."""
    spec: dict[str, object] = {
        "suite": DEBIAN_SUITE,
        "variant": "minbase",
        "packages": sorted(DEBIAN_PACKAGES),
        "recipe": 1,  # changed when _debian_base makes it differently
    }
    key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]
    return f"localhost/kyma-compass-pull-base:{DEBIAN_SUITE}-{'-'.join(DEBIAN_PACKAGES)}-{key}"


# ---------------------------------------------------------------------------------------------
# buildah on its own storage


def _storage_options() -> list[str]:
    root = cache_dir() / "buildah-storage"
    tag = hashlib.sha256(str(root).encode()).hexdigest()[:8]
    runroot = Path(tempfile.gettempdir()) / f"kyma-compass-pull-buildah-{os.getuid()}-{tag}"
    return ["--root", str(root), "--runroot", str(runroot), "--storage-driver", "vfs"]


def buildah_command(*args: str) -> list[str]:
    """A buildah command line on the project's storage (where `make image` leaves the image)."""
    return ["buildah", *_storage_options(), *args]


def buildah(
    *args: str, timeout: float = 600, check: bool = True, log_file: Path | None = None
) -> subprocess.CompletedProcess[str]:
    command = buildah_command(*args)
    if log_file is not None:
        with log_file.open("a") as out:
            out.write(f"$ {' '.join(command)}\n")
            out.flush()
            result = subprocess.run(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                timeout=timeout,
                check=False,
            )
    else:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout, check=False
        )
    if check and result.returncode != 0:
        detail = _tail(log_file) if log_file is not None else result.stderr.strip()
        raise BuildError(f"buildah {args[0]} failed (exit {result.returncode}):\n{detail}")
    return result


def _tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def has_image(name: str) -> bool:
    return buildah("inspect", "--type", "image", name, check=False).returncode == 0


def image_id(name: str) -> str:
    return buildah(
        "inspect", "--type", "image", "--format", "{{.FromImageID}}", name
    ).stdout.strip()


# ---------------------------------------------------------------------------------------------
# whether a builder can run here


def builder_problem() -> str | None:
    """Why no builder can run here, or None."""
    if not sys.platform.startswith("linux"):
        return "building the image needs Linux (buildah)"
    if os.geteuid() != 0:
        return (
            "building the image needs root here (buildah with --isolation chroot and vfs "
            f"storage); as root, `make image` installs what it needs ({INSTALL})"
        )
    missing = [tool for tool in ("buildah", "debootstrap") if shutil.which(tool) is None]
    if missing:
        return f"{' and '.join(missing)} not installed: {INSTALL}"
    return None


def ensure_builder(log: Log = _stderr) -> None:
    """Installs buildah and debootstrap from Debian's packages when missing (as root, with
    apt-get); raises NoBuilder with the reason when no builder can run."""
    problem = builder_problem()
    if problem is None:
        return
    if os.geteuid() == 0 and shutil.which("apt-get") is not None and "not installed" in problem:
        log(f"{problem}; installing ...")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "buildah", "debootstrap"],
        ):
            result = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
            if result.returncode != 0:
                raise NoBuilder(f"{' '.join(command)} failed: {result.stderr.strip()[-500:]}")
        problem = builder_problem()
    if problem is not None:
        raise NoBuilder(problem)


# ---------------------------------------------------------------------------------------------
# the base


def _base(log: Log, work: Path) -> tuple[str, str]:
    """(the PYTHON_IMAGE to build on, its identity for the key)."""
    mode = os.environ.get("IMAGE_BASE", "auto")
    if mode not in ("auto", "registry", "debian"):
        raise BuildError(f"IMAGE_BASE={mode}: auto, registry or debian")
    pinned = pinned_base()
    if mode != "debian":
        if has_image(pinned):
            return pinned, pinned
        log(f"pulling {pinned.rpartition('@')[0]}@... (IMAGE_BASE=debian skips this)")
        pulled = buildah("pull", "--quiet", "--retry", "0", pinned, check=False, timeout=300)
        if pulled.returncode == 0:
            return pinned, pinned
        reason = (pulled.stderr.strip().splitlines() or ["no answer"])[-1].rpartition(": ")[2]
        if mode == "registry":
            raise BuildError(f"IMAGE_BASE=registry, and {pinned} cannot be pulled: {reason}")
        log(f"no registry serves it here ({reason}): the base from Debian's packages instead")
    name = debian_base_name()
    if not has_image(name):
        _debian_base(name, log, work)
    return name, f"{name}@{image_id(name)}"


def _debian_base(name: str, log: Log, work: Path) -> None:
    archive = images_dir() / f"base-{name.rpartition(':')[2]}.oci.tar"
    if archive.exists():
        log(f"loading the Debian base from {archive} ...")
        loaded = buildah("pull", "--quiet", f"oci-archive:{archive}").stdout.split()
        buildah("tag", loaded[-1], name)
        return
    if shutil.which("debootstrap") is None:
        raise NoBuilder(f"debootstrap not installed: {INSTALL}")
    mirror = os.environ.get("DEBIAN_MIRROR") or DEFAULT_DEBIAN_MIRROR
    started = time.monotonic()
    log(f"making {name} with debootstrap from {mirror} (about 2 minutes, once) ...")
    rootfs = work / "rootfs"
    debootstrap_log = work / "debootstrap.log"
    with debootstrap_log.open("w") as out:
        result = subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(DEBIAN_PACKAGES)}",
                DEBIAN_SUITE,
                str(rootfs),
                mirror,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            timeout=1800,
            check=False,
        )
    # debootstrap mounts /proc and /sys in the tree while it runs; a killed one leaves them.
    _unmount_under(rootfs)
    if result.returncode != 0:
        raise BuildError(f"debootstrap failed:\n{_tail(debootstrap_log)}")
    # What the official image has and the Dockerfile uses (`python -m venv`); nothing of the
    # package manager's caches or the build host's devices.
    (rootfs / "usr/bin/python").symlink_to("python3")
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists", "dev", "var/log"):
        for entry in (rootfs / leftover).glob("*"):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    container = buildah("from", "scratch").stdout.strip()
    try:
        mountpoint = buildah("mount", container).stdout.strip()
        subprocess.run(["cp", "-a", f"{rootfs}/.", f"{mountpoint}/"], check=True)
        buildah("umount", container)
        buildah(
            "config",
            "--env", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            "--env", "LANG=C.UTF-8",
            "--cmd", "python3",
            "--label", f"org.opencontainers.image.description=Debian {DEBIAN_SUITE} minbase "
            f"with {', '.join(DEBIAN_PACKAGES)} (debootstrap, kyma-compass-pull's devenv/image.py)",
            container,
        )  # fmt: skip
        buildah("commit", "--quiet", container, name)
    finally:
        buildah("rm", container, check=False)
    partial = archive.with_suffix(".partial")
    partial.unlink(missing_ok=True)
    buildah("push", "--quiet", name, f"oci-archive:{partial}:{name}")
    partial.rename(archive)
    log(f"made {name} in {time.monotonic() - started:.0f} s (kept in {archive})")


def _unmount_under(root: Path) -> None:
    """Unmounts whatever is mounted under `root` (deepest first): nothing may be deleted through
    a mount into the host's /proc, /sys or /dev."""
    prefix = f"{root.resolve()}/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts]
    for point in sorted((p for p in points if p.startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], check=False)
    with open("/proc/self/mounts") as mounts:
        if any(line.split()[1].startswith(prefix) for line in mounts):
            raise BuildError(f"{root} still has mounts under it; not touching it")


# ---------------------------------------------------------------------------------------------
# the product image


def _stage_context(context: Path) -> str:
    """Copies what the build reads into `context` and returns its hash: each file is read once,
    so the image is built from exactly what was hashed, and nothing else (caches, .venv) goes
    to the builder."""
    digest = hashlib.sha256()
    paths = [REPO_ROOT / name for name in CONTEXT_FILES]
    for package in CONTEXT_PACKAGES:
        paths.extend(
            path
            for path in sorted((REPO_ROOT / package).rglob("*"))
            if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
        )
    for path in paths:
        relative = path.relative_to(REPO_ROOT)
        data = path.read_bytes()
        executable = os.access(path, os.X_OK)
        digest.update(f"{relative}\0{int(executable)}\0{len(data)}\0".encode())
        digest.update(data)
        target = context / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if executable:
            target.chmod(0o755)
    return digest.hexdigest()


def ca_bundle() -> Path | None:
    """The CA bundle pip trusts inside the build: IMAGE_CA_BUNDLE, else PIP_CERT; None if empty."""
    value = os.environ.get("IMAGE_CA_BUNDLE")
    source = "IMAGE_CA_BUNDLE"
    if value is None:
        value, source = os.environ.get("PIP_CERT", ""), "PIP_CERT"
    if not value:
        return None
    path = Path(value)
    if not path.is_file():
        raise BuildError(f"{source}={value} is not a file (a CA bundle for pip in the build)")
    return path


@contextlib.contextmanager
def _locked(path: Path, log: Log) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another build is running; waiting for it ...")
            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_image(log: Log = _stderr) -> Path:
    """Builds the image (or finds the cached build of the same inputs) and returns its OCI
    archive. Raises NoBuilder when no builder can run here, BuildError when the build fails."""
    ensure_builder(log)
    name = image_name()
    images = images_dir()
    with (
        _locked(images / ".lock", log),
        tempfile.TemporaryDirectory(dir=images, prefix="work-") as tmp,
    ):
        work = Path(tmp)
        base, base_identity = _base(log, work)
        context = work / "context"
        inputs = _stage_context(context)
        spec: dict[str, object] = {
            "recipe": RECIPE,
            "name": name,
            "base": base_identity,
            "inputs": inputs,
        }
        key = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
        folder = images / key
        archive = folder / "image.oci.tar"
        if archive.exists():
            os.utime(folder)  # recently used: kept by _prune
            return archive
        _build(name=name, base=base, context=context, folder=folder, spec=spec, log=log)
        _prune(images, log)
        return archive


def _build(
    *, name: str, base: str, context: Path, folder: Path, spec: dict[str, object], log: Log
) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    build_log = folder / "build.log"
    build_log.write_text("")
    ca = ca_bundle()
    started = time.monotonic()
    log(f"building {name} on {base} (log: {build_log}) ...")
    command = [
        "bud",
        "--isolation", "chroot",
        "--network", "host",
        "--pull=never",
        "--build-arg", f"PYTHON_IMAGE={base}",
        "--tag", name,
        "--file", str(context / "Dockerfile"),
    ]  # fmt: skip
    if ca is not None:
        command += ["--secret", f"id={CA_SECRET_ID},src={ca}"]
    buildah(*command, str(context), timeout=1800, log_file=build_log)
    built = time.monotonic() - started
    # An OCI layout written by buildah, named for containerd too, packed into one archive.
    layout = context.parent / "layout"
    buildah("push", "--quiet", name, f"oci:{layout}:{name}", log_file=build_log)
    index_path = layout / "index.json"
    index = json.loads(index_path.read_text())
    for manifest in index["manifests"]:
        manifest.setdefault("annotations", {})["io.containerd.image.name"] = name
    index_path.write_text(json.dumps(index))
    partial = folder / "image.oci.tar.partial"
    with tarfile.open(partial, "w") as tar:
        for path in sorted(layout.rglob("*")):
            if path.is_file():
                tar.add(path, arcname=str(path.relative_to(layout)), filter=_plain)
    info = json.loads(buildah("inspect", "--type", "image", name).stdout)
    metadata = {
        **spec,
        "image_id": info.get("FromImageID"),
        "user": info.get("OCIv1", {}).get("config", {}).get("User"),
        "seconds": round(built, 1),
        "archive_bytes": partial.stat().st_size,
        "unpacked_bytes": _unpacked_size(layout),
        "ca_bundle": None if ca is None else {"path": str(ca), "sha256": _sha256(ca)},
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    (folder / "build.json").write_text(json.dumps(metadata, indent=2) + "\n")
    partial.rename(folder / "image.oci.tar")
    log(
        f"built {name} in {built:.0f} s: {metadata['archive_bytes'] / 1e6:.0f} MB archive, "
        f"{metadata['unpacked_bytes'] / 1e6:.0f} MB unpacked"
    )


def _plain(info: tarfile.TarInfo) -> tarfile.TarInfo:
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mtime = 0
    return info


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _unpacked_size(layout: Path) -> int:
    """The image's layers as uncompressed tars: each gzip member ends with its size (mod 4 GiB)."""
    total = 0
    for layer in layers(layout):
        with layer.open("rb") as blob:
            if blob.read(2) != b"\x1f\x8b":
                total += layer.stat().st_size
                continue
            blob.seek(-4, os.SEEK_END)
            total += int.from_bytes(blob.read(4), "little")
    return total


def layers(layout: Path) -> list[Path]:
    """The layer blobs of the (one) image in an OCI layout folder, base first."""
    index = json.loads((layout / "index.json").read_text())
    manifest_digest = index["manifests"][0]["digest"].partition(":")[2]
    manifest = json.loads((layout / "blobs/sha256" / manifest_digest).read_text())
    return [
        layout / "blobs/sha256" / item["digest"].partition(":")[2] for item in manifest["layers"]
    ]


def _prune(images: Path, log: Log) -> None:
    builds = sorted(
        (path for path in images.iterdir() if re.fullmatch(r"[0-9a-f]{16}", path.name)),
        key=lambda path: path.stat().st_mtime,
        reverse=True,
    )
    for old in builds[KEEP_BUILDS:]:
        shutil.rmtree(old, ignore_errors=True)
    # Earlier builds of the same name, untagged now, and the build stages.
    buildah("rmi", "--prune", check=False)
    if len(builds) > KEEP_BUILDS:
        log(f"removed {len(builds) - KEEP_BUILDS} older build(s) from the cache")


# ---------------------------------------------------------------------------------------------
# using the built image


@contextlib.contextmanager
def working_container(archive: Path) -> Iterator[str]:
    """A buildah working container of the image in `archive`, removed afterwards: run commands
    in it with `run_in`."""
    container = buildah("from", "--quiet", f"oci-archive:{archive}", timeout=600).stdout.split()[-1]
    try:
        yield container
    finally:
        buildah("rm", container, check=False)


# What `buildah run` itself adds to stderr after a command that exits non-zero.
_BUILDAH_EXIT_LINE = re.compile(r"(subprocess exited with status \d+|Error: exit status \d+)")


def run_in(
    container: str, *command: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Runs `command` in the container's filesystem as the image's user (chroot isolation). Its
    stderr is the command's: buildah's own closing lines about the exit status are taken off."""
    options = ["--isolation", "chroot"]
    for key, value in (env or {}).items():
        options += ["--env", f"{key}={value}"]
    result = buildah("run", *options, container, "--", *command, timeout=timeout, check=False)
    lines = result.stderr.splitlines(keepends=True)
    while lines and _BUILDAH_EXIT_LINE.fullmatch(lines[-1].strip()):
        lines.pop()
    result.stderr = "".join(lines)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devenv.image", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--name", action="store_true", help="print the image's name and exit")
    parser.add_argument(
        "--check", action="store_true", help="exit 0 if a builder can run here, else 3"
    )
    args = parser.parse_args(argv)
    try:
        if args.name:
            print(image_name())
            return 0
        if args.check:
            ensure_builder()
            return 0
        print(build_image())
    except NoBuilder as problem:
        _stderr(str(problem))
        return NO_BUILDER
    except (BuildError, subprocess.SubprocessError, OSError) as failure:
        _stderr(f"failed: {failure}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
