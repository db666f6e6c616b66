"""The plugin's build inputs from the system: the installed QEMU's version, and its qemu-plugin.h.

Debian ships QEMU without the plugin header, so it is taken from Debian's source package of
exactly the installed QEMU (downloaded once, cached under the kpgo cache directory)."""

from __future__ import annotations

import re
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kpgo import atomic, proc
from kpgo.errors import InfraError, UserError
from kpgo.paths import cache_dir
from kpgo.progress import say

QEMU_PACKAGE = "qemu-system-x86"
HEADER = "qemu-plugin.h"
APT_RETRIES = 3  # per download; the tests set 0 to fail fast
SETUP_HINT = "run `make setup` (or `.venv/bin/python -m kpgo.sim`)"


@dataclass(frozen=True)
class QemuVersion:
    source_package: str  # "qemu"
    source_version: str  # "1:7.2+dfsg-7+deb12u18" (the binary's version without the +b3 binNMU suffix)
    upstream: str  # "7.2.22", as qemu-system-x86_64 --version says

    @property
    def stamp(self) -> str:
        return f"{self.source_package} {self.source_version}"


def qemu_version() -> QemuVersion:
    res = proc.run(["dpkg-query", "-W", "-f=${db:Status-Abbrev}|${source:Package}|${source:Version}", QEMU_PACKAGE], check=False)
    fields = res.output.strip().split("|")
    if res.returncode != 0 or len(fields) != 3 or not fields[0].startswith("ii"):
        raise UserError(f"{QEMU_PACKAGE} is not installed, so there is no QEMU to build the simulator plugin for", SETUP_HINT)
    m = re.search(r"QEMU emulator version ([0-9][0-9.]*)", proc.capture(["qemu-system-x86_64", "--version"]))
    if not m:
        raise InfraError("cannot read the QEMU version from `qemu-system-x86_64 --version`", f"reinstall {QEMU_PACKAGE}")
    return QemuVersion(fields[1], fields[2], m[1])


def header_dir(version: QemuVersion | None = None) -> Path:
    return cache_dir() / "qemu-plugin" / (version or qemu_version()).upstream


def fetch_header() -> Path:
    """The directory holding qemu-plugin.h of the installed QEMU: from the cache when its VERSION
    names the installed source package version, else taken from Debian's source package (the
    upstream tarball plus the Debian patches that touch the header). Nothing in /etc/apt or
    /var/lib/apt changes: apt-get runs on a private deb-src list and list directory."""
    version = qemu_version()
    dest = header_dir(version)
    hdr, stamp = dest / HEADER, dest / "VERSION"
    if hdr.is_file() and hdr.stat().st_size > 0 and stamp.is_file() and stamp.read_text().strip() == version.stamp:
        return dest
    proc.need("apt-get")
    say(f"sim: fetching {HEADER} from Debian source package {version.source_package}={version.source_version} (once)")
    log = cache_dir() / "qemu-plugin" / "fetch.log"
    log.unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="kpgo-qemu-src.") as tmp:
        work = Path(tmp)
        sources = _deb_src_lines()
        if not sources:
            raise UserError(f"no Debian archive in /etc/apt to download the {version.source_package} source package from",
                            "add a Debian mirror (deb http://deb.debian.org/debian bookworm main) to /etc/apt/sources.list")
        (work / "sources.list").write_text("\n".join(sources) + "\n")
        (work / "lists" / "partial").mkdir(parents=True)
        (work / "src").mkdir()
        apt = ["apt-get", "-q",
               "-o", f"Dir::Etc::SourceList={work / 'sources.list'}", "-o", "Dir::Etc::SourceParts=/nonexistent",
               "-o", f"Dir::State::Lists={work / 'lists'}", "-o", "Dir::Cache::pkgcache=", "-o", "Dir::Cache::srcpkgcache=",
               "-o", "APT::Get::List-Cleanup=0", "-o", "Debug::NoLocking=1", "-o", "APT::Sandbox::User=root",
               "-o", f"Acquire::Retries={APT_RETRIES}"]
        env = {"DEBIAN_FRONTEND": "noninteractive"}
        hint = f"check the network and the Debian mirrors in /etc/apt, then {SETUP_HINT}; log: {log}"
        # apt-get update only warns about an unreachable mirror: no Sources index means failure.
        updated = proc.run([*apt, "update"], log=log, env=env, timeout=600, check=False).returncode == 0
        if not updated or not any((work / "lists").glob("*Sources*")):
            raise InfraError("could not read the Debian source package lists (apt-get update failed)", hint)
        want = f"{version.source_package}={version.source_version}"
        if proc.run([*apt, "source", "--download-only", want], cwd=work / "src", log=log, env=env, timeout=1800, check=False).returncode != 0:
            raise InfraError(f"could not download the Debian source package {want} for {HEADER}", hint)
        text, patches = _header_from_source(work / "src", work / "x", log)
    dest.mkdir(parents=True, exist_ok=True)
    atomic.write_text(hdr, text)
    atomic.write_text(dest / "PATCHES", f"debian patches applied to the header: {' '.join(patches) or 'none'}\n")
    atomic.write_text(stamp, version.stamp + "\n")  # last: the cache is valid only once all is there
    return dest


def _deb_src_lines() -> list[str]:
    """deb-src twins of the system's Debian `deb` entries (one-line .list and deb822 .sources)."""
    etc = Path("/etc/apt")
    lines: list[str] = []
    for f in [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*.list"))]:
        if f.is_file():
            for ln in f.read_text(errors="replace").splitlines():
                m = re.match(r"\s*deb\s+(.*)", ln)
                if m:
                    lines.append(f"deb-src {m[1]}")
    for f in sorted((etc / "sources.list.d").glob("*.sources")):
        for para in re.split(r"\n\s*\n", f.read_text(errors="replace")):
            fields: dict[str, str] = {}
            for ln in para.splitlines():
                m = re.match(r"([A-Za-z-]+):\s*(.*)", ln)
                if m:
                    fields[m[1].lower()] = m[2].strip()
            if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes").lower() == "no":
                continue
            key = fields.get("signed-by", "")
            opt = f"[signed-by={key}] " if key.startswith("/") else ""  # an inline key block: apt's default keyring
            for uri in fields.get("uris", "").split():
                for suite in fields.get("suites", "").split():
                    lines.append(f"deb-src {opt}{uri} {suite} {fields.get('components', '')}".rstrip())
    # Only Debian's archives carry the qemu source package.
    return [ln for ln in lines if re.search(r"debian(-security)?[ /]", ln)]


def _header_from_source(src: Path, work: Path, log: Path) -> tuple[str, list[str]]:
    """qemu-plugin.h from the .orig tarball with the header hunks of the Debian patches applied."""
    orig = sorted(src.glob("*.orig.tar.*"))
    debian = sorted(src.glob("*.debian.tar.*"))
    if not orig:
        raise InfraError(f"the downloaded source package has no .orig tarball in {src}", f"log: {log}")
    tree = work / "tree"
    (tree / "include" / "qemu").mkdir(parents=True)
    hdr = tree / "include" / "qemu" / HEADER
    with tarfile.open(orig[0], "r|*") as tf:  # streamed: stop at the one member wanted
        for member in tf:
            if member.isfile() and member.name.endswith("/include/qemu/" + HEADER):
                f = tf.extractfile(member)
                assert f is not None
                hdr.write_bytes(f.read())
                break
    if not hdr.is_file():
        raise InfraError(f"{orig[0].name} holds no include/qemu/{HEADER}", "this QEMU may predate TCG plugins (QEMU ≥ 4.2 has them)")
    patches: dict[str, bytes] = {}
    if debian:
        with tarfile.open(debian[0], "r|*") as tf:
            for member in tf:
                name = member.name.removeprefix("./")
                if member.isfile() and name.startswith("debian/patches/"):
                    f = tf.extractfile(member)
                    assert f is not None
                    patches[name.removeprefix("debian/patches/")] = f.read()
    applied = []
    for line in patches.get("series", b"").decode(errors="replace").splitlines():
        words = line.split("#", 1)[0].split()  # "name [-pN]"; comments and blank lines skipped
        body = patches.get(words[0], b"").decode(errors="replace") if words else ""
        if f"include/qemu/{HEADER}" not in body:
            continue
        name = words[0]
        hunk = work / "hdr.patch"
        hunk.write_text(_header_hunks(body))
        proc.run(["patch", "-s", "-p1", "-i", hunk], cwd=tree, log=log, what=f"applying Debian patch {name} to {HEADER}")
        applied.append(name)
    return hdr.read_text(), applied


def _header_hunks(patch: str) -> str:
    """Only the parts of a patch that change qemu-plugin.h (the patch may touch other files)."""
    keep, out = False, []
    for ln in patch.splitlines(keepends=True):
        if ln.startswith(("diff ", "--- ")):
            keep = f"include/qemu/{HEADER}" in ln
        if keep:
            out.append(ln)
    return "".join(out)
