"""Engine stage: SGLang in a pinned release directory, installed with uv while the old release
still serves; the service stage switches ``current`` right before the restart onto it.

    from sglang_fleet.stages.engine.deploy import install_engine, switch_release
    release = install_engine(profile)      # in a pyinfra deploy
    switch_release(release)                # when the server is about to restart onto it
"""

from __future__ import annotations

import hashlib
import json
import re
import shlex
from dataclasses import asdict, dataclass
from datetime import datetime

from pyinfra.api.deploy import deploy
from pyinfra.api.operation import operation
from pyinfra.context import host
from pyinfra.facts.files import Directory, File, FindDirectories, FindFiles, Link
from pyinfra.operations import apt, files, server

from sglang_fleet import hostconfig, paths
from sglang_fleet.config.profile import Profile
from sglang_fleet.ops import Ops
from sglang_fleet.ops.host_programs import SHARED, program, upload
from sglang_fleet.ops.packages import packages_baseline, packages_purged
from sglang_fleet.remote.prune_caches import VERSION

# uv and pip trust the host's certificate store, as apt does (sites may inspect TLS).
SYSTEM_CAS = "/etc/ssl/certs/ca-certificates.crt"
UV = f"UV_NATIVE_TLS=1 {paths.UV_VENV}/bin/uv"
UV_VERSION = "0.9.9"
KEEP = 3
_RELEASE_NAME = re.compile(r".+-(\d[0-9A-Za-z.]*)-[0-9a-f]{10}")  # Release.id
ENGINE_PACKAGES = ["python3-venv"]  # what uv's venvs need from the host
PRUNER = "sglang_fleet.remote.prune_caches"  # prunes the service-writable caches


@dataclass(frozen=True)
class Release:
    """What defines an engine installation; its id names its directory."""

    package: str
    version: str
    extras: tuple[str, ...]
    index_url: str | None
    find_links: str | None
    python: str

    @property
    def id(self) -> str:
        digest = hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()
        return f"{self.package}-{self.version}-{digest[:10]}"

    @property
    def dir(self) -> str:
        return f"{paths.RELEASES}/{self.id}"

    @property
    def python_bin(self) -> str:
        return f"{self.dir}/bin/python"

    @property
    def requirement(self) -> str:
        extras = f"[{','.join(self.extras)}]" if self.extras else ""
        return f"{self.package}{extras}=={self.version}"


def release_for(profile: Profile, find_links: str | None = None) -> Release:
    engine = profile.engine
    return Release(engine.package, engine.version, engine.extras, engine.index_url, find_links,
                   "/usr/bin/python3")


@operation(is_idempotent=True)
def uv_tool() -> Ops:
    """uv itself, from PyPI into its own venv (no installer script from outside).

        uv_tool(name="uv 0.9.9")
    """
    if not host.get_fact(Directory, path=paths.UV_VENV):
        yield f"python3 -m venv {paths.UV_VENV}"
        yield f"{paths.UV_VENV}/bin/pip install --quiet --cert {SYSTEM_CAS} uv=={UV_VERSION}"


def venv_install(dest: str, python: str, requirement: str, source: list[str]) -> Ops:
    """Commands that install ``requirement`` into a new venv at ``<dest>.partial`` and rename it
    to ``dest`` when complete; nothing if ``dest`` is complete already.

    (pyinfra's pip/uv.packages drop extras and uv.venv is not idempotent: plain uv commands.)
    """
    if host.get_fact(File, path=f"{dest}/.complete"):
        return
    tmp = shlex.quote(f"{dest}.partial")
    yield f"rm -rf {tmp}"
    yield f"{UV} venv --quiet --relocatable --python {shlex.quote(python)} {tmp}"
    yield (f"UV_CACHE_DIR={paths.UV_CACHE} {UV} pip install --quiet --python {tmp}/bin/python "
           f"{shlex.join(source)} {shlex.quote(requirement)}")
    yield f"touch {tmp}/.complete && mv -T {tmp} {shlex.quote(dest)}"


@operation(is_idempotent=True)
def release_dir(release: Release) -> Ops:
    """Install the release into its directory, renamed into place when complete.

        release_dir(name="Install sglang==0.5.23", release=release_for(profile))
    """
    source = [*(["--index-url", release.index_url] if release.index_url else []),
              *(["--find-links", release.find_links] if release.find_links else [])]
    yield from venv_install(release.dir, release.python, release.requirement, source)


def uv_ready() -> None:
    """uv and the venv support it builds on (the host's packages recorded first, for teardown)."""
    packages_baseline(name="Packages before sglang-fleet (for teardown)")
    apt.packages(name="Python venv support", packages=ENGINE_PACKAGES)
    uv_tool(name=f"uv {UV_VERSION}")


@operation(is_idempotent=True)
def current_link(release: Release) -> Ops:
    """Point ``current`` at the release (atomically) and ``previous`` at what it replaced.

        current_link(name="Switch current release", release=release)
    """
    link = host.get_fact(Link, path=paths.CURRENT)
    now = str(link["link_target"]) if link else ""
    if now == release.dir:
        return
    if now:
        yield _relink(now, paths.PREVIOUS)
    yield _relink(release.dir, paths.CURRENT)


def _relink(target: str, link: str) -> str:
    """Replace ``link`` atomically (a new link renamed over the old one)."""
    return f"ln -sfn {shlex.quote(target)} {link}.new && mv -T {link}.new {link}"


def releases_newest_first() -> list[str]:
    """The complete release directories' names, the newest first."""
    found = host.get_fact(FindDirectories, path=paths.RELEASES, maxdepth=1) or []
    names = [p.rsplit("/", 1)[-1] for p in found if p.rstrip("/") != paths.RELEASES]
    mtimes: dict[str, datetime] = {}
    for name in names:
        stat = host.get_fact(Directory, path=f"{paths.RELEASES}/{name}")
        if stat and not name.endswith(".partial"):
            mtimes[name] = stat["mtime"] or datetime.min
    return sorted(mtimes, key=lambda n: mtimes[n], reverse=True)


def _linked_release(link: str) -> str | None:
    found = host.get_fact(Link, path=link)
    return str(found["link_target"]).rsplit("/", 1)[-1] if found else None


def release_version(name: str) -> str | None:
    """The SGLang version in a release directory's name (``Release.id``), if it has one.

        release_version("sglang-0.5.13.post1-0123456789")   # '0.5.13.post1'
    """
    found = _RELEASE_NAME.fullmatch(name)
    return found.group(1) if found else None


@operation(is_idempotent=True)
def prune(keep: int = KEEP) -> Ops:
    """Remove releases beyond the newest ``keep``, never current or previous; then the
    per-version caches (``caches.PER_RELEASE``) of versions no release left has, and the
    warm-up marks and compiled-kernel records of releases no longer there.

        prune(name="Keep the last 3 releases", keep=3)
    """
    names = releases_newest_first()
    keepers = {*names[:keep], _linked_release(paths.CURRENT), _linked_release(paths.PREVIOUS)}
    gone = [name for name in names if name not in keepers]
    if not gone:
        host.noop(f"{len(names)} releases, none to remove")
    for name in gone:
        yield f"rm -rf {shlex.quote(f'{paths.RELEASES}/{name}')}"
    kept = [name for name in names if name not in gone]
    if kept:
        yield from _caches_pruned(kept)


def _caches_pruned(kept: list[str]) -> Ops:
    versions = {release_version(name) for name in kept}
    if None in versions:  # a release whose version its name does not say: keep every cache
        return
    # The listing only says whether there is anything to prune: the host program reads the
    # service-writable directory itself, through descriptors (never a name from this listing).
    found = host.get_fact(FindDirectories, path=paths.RELEASE_CACHES, maxdepth=1) or []
    names = {path.rstrip("/").rsplit("/", 1)[-1] for path in found}
    if any(VERSION.fullmatch(name) and name not in versions for name in names):
        keep = [f"--keep={version}" for version in sorted(v for v in versions if v)]
        yield shlex.join(program("/usr/bin/python3", PRUNER, "--root", paths.RELEASE_CACHES,
                                 *keep))
    for marks in (paths.WARM_MARKS, paths.COMPILED):
        for path in host.get_fact(FindFiles, path=marks, maxdepth=1) or []:
            if not any(path.rsplit("/", 1)[-1].startswith(f"{name}-") for name in kept):
                yield f"rm -f {shlex.quote(path)}"


def switch_release(release: Release) -> None:
    """``current`` on the release, old releases pruned: right before the server restarts onto it."""
    current_link(name="Switch current release", release=release)
    upload(SHARED)
    prune(name=f"Keep the last {KEEP} releases")


@deploy("Engine release")
def install_engine(profile: Profile) -> Release:
    """The release installed beside the one serving (``current`` is left as it is)."""
    # engine_find_links and engine.index_url were checked (https) with the host's data.
    release = release_for(profile, hostconfig.of(host).engine_find_links)
    server.user(name="Service user", user=paths.USER, system=True, home=paths.STATE,
                shell="/usr/sbin/nologin", create_home=False)
    uv_ready()
    for path in (paths.ROOT, paths.RELEASES, paths.HOME):
        files.directory(name=f"Directory {path} (root's)", path=path, user="root",
                        group="root", mode="755")
    for path in (paths.ROOT_CACHE, paths.UV_CACHE):
        files.directory(name=f"Directory {path} (root only)", path=path, user="root",
                        group="root", mode="700")
    for path in (paths.STATE, paths.CACHE):
        files.directory(name=f"Writable {path}", path=path, user=paths.USER,
                        group=paths.USER, mode="750")
    # Earlier releases of this product kept root's uv cache there, where the service can write.
    files.directory(name="No root cache among the service's", path=f"{paths.CACHE}/uv",
                    present=False)
    release_dir(name=f"Install {release.requirement} into {release.id}", release=release)
    return release


@deploy("Remove the engine")
def remove_engine(with_home: bool) -> None:
    """Every release, uv, the caches, the service user, and python3-venv if the product
    installed it; the service's home too when ``with_home`` (the staged weights live there)."""
    for path in (paths.ROOT, paths.CACHE, paths.STATE, paths.ROOT_CACHE, paths.SIZING):
        files.directory(name=f"Engine {path}", path=path, present=False)
    packages_purged(name="Engine packages", owned=[], shared=ENGINE_PACKAGES)
    server.user(name="Service user", user=paths.USER, present=False)
    server.group(name="Service group", group=paths.USER, present=False)
    if with_home:
        files.directory(name=f"Service home {paths.HOME}", path=paths.HOME, present=False)
