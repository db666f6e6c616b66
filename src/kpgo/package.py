"""kpgo package and kpgo verify (docs/PACKAGING.md): a build as an installable .deb that carries kpgo's manifest, and
whether the running kernel is that build.

The .deb is the kernel's own: `make bindeb-pkg` in the build's O= directory with the make line and environment the
build used (build.json's make_command), so nothing is compiled or linked again and the package holds the build's
bzImage (checked: vmlinux keeps its build id, the package's vmlinuz has the bzImage's bytes). kpgo then adds one file
to the image package, its manifest (manifest()), at /boot/kpgo-RELEASE.json beside the package's config-RELEASE and
System.map-RELEASE: /boot is where the kernel's own per-release files are and is kept by every install, where
/usr/share/doc is dropped by minimal and container images (dpkg path-exclude) and /lib/modules/RELEASE is absent from
a kernel without modules (the tiny one). `kpgo verify` without arguments reads it there, by `uname -r`.

The answer of verify is the running kernel's GNU build id (/sys/kernel/notes) against the manifest's, which is
vmlinux's: the linker hashes the whole linked image into it, so equal ids mean this build's code."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo import __version__, atomic, branches, inputs, proc
from kpgo.errors import InfraError, UserError
from kpgo.kernel import kbuild
from kpgo.progress import fmt_secs, say

KIND = "kpgo-kernel-manifest"
MANIFEST_VERSION = 1
ROOT = Path("/")  # where the package installs: manifest_name() is relative to it
NOTES = Path("/sys/kernel/notes")
BUILD_HINT = "pass a directory written by `kpgo build` (its build.json, vmlinux and bzImage)"
DEB_HINT = "pass a .deb written by `kpgo package`"

# verify's answers and their exit status: 0 only for yes; "no" and "cannot tell" apart from each other and from
# kpgo's own 1 (bad input), 2 (command line) and 3 (a tool failed), so a script can tell all of them apart.
YES, NO, UNKNOWN = "yes", "no", "cannot tell"
EXIT = {YES: 0, NO: 4, UNKNOWN: 5}

# What kpgo reads of a manifest (manifest() writes it; the golden of its keys is in tests/test_package.py).
MANIFEST_SHAPE = {"kind": str, "manifest_version": int, "kernel_release": str, "build_id": str, "variant": str,
                  "profile": ({"digest": (str, None), "workloads": [str]}, None), "proof": (dict, None)}


def manifest_name(release: str) -> str:
    """The manifest's path in the package and on the installed system, relative to /."""
    return f"boot/kpgo-{release}.json"


# ---- the manifest ----

def manifest(out: Path) -> dict[str, Any]:
    """What the package carries about the build in `out`: the kernel (release, source version, config), the compiler
    and its flags, vmlinux's GNU build id and digest, the profile (digest and the workloads it was collected under)
    and the proof that GCC used it, and how the build was made reproducible."""
    build = kbuild.load_build(out, BUILD_HINT)
    vmlinux = out / "vmlinux"
    if not inputs.is_regular(vmlinux):
        what = f"is {inputs.kind(vmlinux)}" if os.path.lexists(vmlinux) else "is missing"
        raise UserError(f"{out}: its vmlinux {what}", "build it again into a new directory (`kpgo build ... -o NEW`)")
    build_id = branches.build_id_of(vmlinux)
    recorded = build.get("build_id")
    if recorded and recorded != build_id:  # linked again since (a make by hand): build.json no longer describes it
        raise UserError(f"{out}: vmlinux has build id {build_id}, build.json recorded {recorded}: the directory changed after kpgo built it",
                        "build it again into a new directory (`kpgo build ... -o NEW`)")
    compiler = build.get("compiler") if isinstance(build.get("compiler"), dict) else {"version": build.get("gcc")}
    return {
        "kind": KIND,
        "manifest_version": MANIFEST_VERSION,
        "kpgo_version": __version__,
        "kernel_release": build["kernel_release"],
        "source_version": build.get("source_version"),
        "config": {"name": build.get("config_name"), "hash": build.get("config_hash")},
        "variant": build["variant"],
        "compiler": compiler,
        "opt": build.get("opt"),
        "kcflags": build.get("kcflags"),
        "build_key": build["key"],
        "build_id": build_id,
        "vmlinux_sha256": kbuild.file_sha256(vmlinux),
        "bzimage_sha256": kbuild.file_sha256(kbuild.image(out)),
        "reproducible": build.get("reproducible"),  # None: built before kpgo's builds were reproducible
        "profile": _profile(build, out),
        "proof": _proof(build.get("proof")),
        "package": None,
    }


def _profile(build: dict, out: Path) -> dict[str, Any] | None:
    """The profile's digest (the build key's) and where it came from: the workloads of its collections (a merged
    profile has several), from build.json or, for a build made before it recorded them, the profile's profile.json."""
    rec = build.get("profile")
    if not isinstance(rec, dict):
        return None
    from kpgo.gcov.profile import read_profile_json

    src = Path(str(rec.get("dir") or ""))
    collections = rec.get("collections")
    digest = rec.get("digest")
    if collections is None or digest is None:
        if not src.is_dir():
            raise UserError(f"{out}: its profile {src} is gone, and the build recorded neither the profile's digest nor its workloads",
                            "build it again into a new directory with this kpgo (`kpgo build ... -o NEW`), which records them")
        collections = collections if collections is not None else kbuild.profile_collections(read_profile_json(src))
        digest = digest or kbuild.profile_digest(src)
    workloads = sorted({str(c["workload"]) for c in collections if c.get("workload")})
    return {"digest": digest, "dir": str(src), "workloads": workloads, "collections": collections}


def _proof(proof: object) -> dict[str, Any] | None:
    """build.json's proof without its lists (per-site detail stays in the build): the verdict and its counts."""
    if not isinstance(proof, dict):
        return None
    return {k: v for k, v in proof.items() if v is None or isinstance(v, (bool, int, float, str))}


def proof_text(proof: dict[str, Any] | None) -> str:
    if not proof:
        return "no proof recorded"
    used, of = proof.get("objects_used"), proof.get("objects_nonempty")
    verdict = "proven" if proof.get("ok") else "NOT proven"
    return f"{verdict}: {used:,} of {of:,} profiled objects used it" if isinstance(used, int) and isinstance(of, int) else verdict


# ---- kpgo package ----

_CC = re.compile(r"^\s+CC\s+(?!/)")  # an object compiled (not a host tool), as kbuild counts them
_UTS = re.compile(r'#define UTS_VERSION\s+"#(\S+) (.*)"')
_BY = re.compile(r'#define LINUX_COMPILE_(BY|HOST)\s+"(.*)"')
_FLAGS = ("SMP", "PREEMPT_DYNAMIC", "PREEMPT_RT", "PREEMPT")


def version_env(out: Path) -> dict[str, str]:
    """The version string's parts as the build made them (include/generated): packaging with them regenerates the same
    headers, so make links nothing again, for a build made before kpgo fixed them (reproducible()) too. bindeb-pkg
    passes KBUILD_BUILD_VERSION from the package's revision, so KDEB_PKGVERSION must end in the same number."""
    gen = out / "include" / "generated"
    uts = _UTS.search(inputs.read_text(gen / "utsversion.h", BUILD_HINT))
    who = dict(_BY.findall(inputs.read_text(gen / "compile.h", BUILD_HINT)))
    if uts is None or set(who) != {"BY", "HOST"}:
        raise UserError(f"{gen}: no version string kpgo can read (UTS_VERSION, LINUX_COMPILE_BY/HOST)", BUILD_HINT)
    words = uts.group(2).split(" ")
    while words and words[0] in _FLAGS:  # "SMP PREEMPT_DYNAMIC Thu Nov 14 ...": the config's, not the timestamp
        words.pop(0)
    return {"KBUILD_BUILD_VERSION": uts.group(1), "KBUILD_BUILD_TIMESTAMP": " ".join(words),
            "KBUILD_BUILD_USER": who["BY"], "KBUILD_BUILD_HOST": who["HOST"]}


def package_command(build: dict, out: Path) -> tuple[list[str], dict[str, str]]:
    """bindeb-pkg's argv and environment: the build's make line (build.json's make_command) with bindeb-pkg as its
    target, and the build's version string (version_env)."""
    words = shlex.split(str(build.get("make_command") or ""))
    at = words.index("make") if "make" in words else -1
    if at < 0 or "bzImage" not in words:
        raise UserError(f"{out}/build.json: its make_command is not a kpgo kernel build's make line", BUILD_HINT)
    env = dict(w.split("=", 1) for w in words[:at])
    argv = [w if w != "bzImage" else "bindeb-pkg" for w in words[at:]]
    ver = version_env(out)
    env |= ver | {"KDEB_PKGVERSION": f"{build['kernel_release']}-{ver['KBUILD_BUILD_VERSION']}"}
    return argv, env


@dataclass(frozen=True)
class Packaged:
    deb: Path  # the image package, with the manifest
    others: tuple[Path, ...]  # what else bindeb-pkg made (headers, debug symbols, libc headers, when the config has them)
    manifest: dict[str, Any]
    seconds: float
    compiled: int  # objects make compiled again: 0 when the build is complete


def package(out: Path, dest: Path) -> Packaged:
    """Make the .deb of the build in `out` in `dest` and put the manifest into it."""
    out = out.resolve()
    for tool in ("dpkg-buildpackage", "dpkg-deb", "dh_testdir", "make"):
        proc.need(tool)
    man = manifest(out)  # refuses what is not a complete build before make touches it
    build = kbuild.load_build(out, BUILD_HINT)
    argv, env = package_command(build, out)
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest} is {inputs.kind(dest) or 'a file'}, not a directory", "choose another -o")
    dest.mkdir(parents=True, exist_ok=True)
    log = out / "package.log"
    log.unlink(missing_ok=True)
    release = man["kernel_release"]
    say(f"package: make bindeb-pkg in {out} (log: {log})")
    compiled = 0

    def line(text: str) -> None:
        nonlocal compiled
        compiled += bool(_CC.match(text))

    t0 = time.monotonic()
    # dpkg-buildpackage writes into the build directory's parent, under names made of the release and revision only:
    # two packagings of builds side by side (builds/a, builds/b of one kernel) wait for each other
    with atomic.turn(out.parent / ".kpgo-package.lock"):
        res = proc.run(argv, log=log, env=env, on_line=line, check=False, keep_output=False)
        if res.returncode != 0:
            raise InfraError(f"make bindeb-pkg failed in {out} (exit {res.returncode})", f"see {log}")
        # the package must hold this build: the same vmlinux (nothing linked again), and its vmlinuz the bzImage
        after = branches.build_id_of(out / "vmlinux")
        if after != man["build_id"]:
            raise InfraError(f"bindeb-pkg linked vmlinux again (build id {man['build_id']} became {after}), so its package is not the kpgo build",
                             f"see {log}; build again into a new directory and package that")
        debs = _collect(out, dest)
    image = next((d for d in debs if d.name.startswith(f"linux-image-{release}_")), None)
    if image is None:
        raise InfraError(f"bindeb-pkg made no linux-image-{release} package ({', '.join(d.name for d in debs) or 'none'})", f"see {log}")
    fields = dict(zip(("name", "version", "architecture"),
                      proc.capture(["dpkg-deb", "--showformat=${Package}\\t${Version}\\t${Architecture}", "--show", image]).split("\t")))
    man["package"] = fields
    _add_manifest(image, man, out)
    atomic.write_json(dest / "kpgo.json", man)
    return Packaged(image, tuple(d for d in debs if d != image), man, time.monotonic() - t0, compiled)


def _collect(out: Path, dest: Path) -> list[Path]:
    """Move the packages dpkg-buildpackage wrote beside the build directory (its parent: dpkg's rule) into dest.
    The .buildinfo and .changes go: they hold the checksums of the package before kpgo added its manifest, and are
    for uploading to an archive, which kpgo does not do."""
    listed = inputs.read_text(out / "debian" / "files", BUILD_HINT).split()
    names = [n for n in listed if n.endswith((".deb", ".buildinfo"))]
    debs = []
    for name in names:
        src = out.parent / name
        if not src.is_file():
            continue
        if name.endswith(".deb"):
            shutil.move(src, dest / name)
            debs.append(dest / name)
        else:
            src.unlink()
    for changes in out.parent.glob(f"*_{debs[0].name.split('_')[1]}_*.changes") if debs else []:
        changes.unlink()
    return debs


def _add_manifest(deb: Path, man: dict[str, Any], out: Path) -> None:
    """Put the manifest into the image package at /boot/kpgo-RELEASE.json, with its md5sum and installed size, and
    check that the package's vmlinuz is the build's bzImage."""
    import json

    release = man["kernel_release"]
    work = Path(tempfile.mkdtemp(dir=deb.parent, prefix=".kpgo-deb."))
    try:
        proc.run(["dpkg-deb", "--raw-extract", deb, work / "root"], log=out / "package.log", what="dpkg-deb --raw-extract")
        root = work / "root"
        vmlinuz = root / "boot" / f"vmlinuz-{release}"
        if not vmlinuz.is_file() or kbuild.file_sha256(vmlinuz) != man["bzimage_sha256"]:
            raise InfraError(f"{deb.name}: its /boot/vmlinuz-{release} is not the build's bzImage", f"see {out / 'package.log'}")
        text = json.dumps(man, indent=1, sort_keys=True) + "\n"
        (root / manifest_name(release)).write_text(text)
        md5 = hashlib.md5(text.encode()).hexdigest()
        with open(root / "DEBIAN" / "md5sums", "a") as f:
            f.write(f"{md5}  {manifest_name(release)}\n")
        control = root / "DEBIAN" / "control"
        size = (len(text.encode()) + 1023) // 1024
        control.write_text(re.sub(r"^Installed-Size: (\d+)$", lambda m: f"Installed-Size: {int(m.group(1)) + size}",
                                  control.read_text(), flags=re.M))
        members = proc.capture(["ar", "t", deb]).split()
        data = next((m for m in members if m.startswith("data.tar")), "data.tar.xz")
        comp = {"data.tar.xz": "xz", "data.tar.gz": "gzip", "data.tar.zst": "zstd", "data.tar": "none"}.get(data, "xz")
        new = work / deb.name
        proc.run(["dpkg-deb", "--root-owner-group", f"-Z{comp}", "--build", root, new], log=out / "package.log", what="dpkg-deb --build")
        new.replace(deb)
    finally:
        shutil.rmtree(work, ignore_errors=True)


# ---- reading a package's manifest ----

def package_manifest(deb: Path) -> dict[str, Any]:
    """The manifest in a .deb made by `kpgo package`; a one-line UserError for anything else."""
    head = inputs.read_prefix(deb, DEB_HINT, 8)
    if head != b"!<arch>\n":
        raise UserError(f"{deb}: not a Debian package (no ar archive)", DEB_HINT)
    try:
        listing = proc.capture(["dpkg-deb", "--contents", deb], timeout=300)
    except InfraError as e:
        raise UserError(f"{deb}: not a Debian package dpkg-deb can read ({e.message})", DEB_HINT) from None
    members = [w for ln in listing.splitlines() for w in ln.split()[-1:] if re.fullmatch(r"\./boot/kpgo-[^/]+\.json", w)]
    if len(members) != 1:
        many = "no" if not members else "more than one"
        raise UserError(f"{deb}: holds {many} kpgo manifest (/boot/kpgo-RELEASE.json), so it was not made by `kpgo package`", DEB_HINT)
    with tempfile.TemporaryDirectory(prefix="kpgo-deb.") as tmp:
        proc.capture(["sh", "-c", 'dpkg-deb --fsys-tarfile "$1" | tar -xf - -C "$2" "$3"', "sh", deb, tmp, members[0]], timeout=300)
        return read_manifest(Path(tmp) / members[0], what=f"{deb}'s {members[0][1:]}")


def read_manifest(path: Path, what: str | None = None) -> dict[str, Any]:
    m: dict[str, Any] = inputs.read_json(path, DEB_HINT, MANIFEST_SHAPE)
    if m["kind"] != KIND:
        raise UserError(f"{what or path}: not a kpgo manifest (kind {m['kind']!r})", DEB_HINT)
    return m


# ---- kpgo verify ----

@dataclass(frozen=True)
class Running:
    release: str
    build_id: str | None  # None: the kernel exposes no build id (no /sys/kernel/notes, or no GNU note in it)
    notes: Path


def running_kernel(notes: Path = NOTES, release: str | None = None) -> Running:
    """The running kernel's release (`uname -r`) and GNU build id, from its notes (the guest agent reads them so)."""
    rel = release or os.uname().release
    data = inputs.read_bytes_if_present(notes, "pass the notes of a running kernel (/sys/kernel/notes)", inputs.MiB)
    return Running(rel, branches.notes_build_id(data) if data is not None else None, notes)


@dataclass(frozen=True)
class Verdict:
    answer: str  # YES, NO or UNKNOWN
    line: str

    @property
    def exit_code(self) -> int:
        return EXIT[self.answer]


def decide(man: dict[str, Any] | None, running: Running, what: str, why_none: str = "") -> Verdict:
    """Is the running kernel the build `man` describes (`what` names where it came from)? One line."""
    if man is None:
        return Verdict(UNKNOWN, f"{UNKNOWN}: {why_none}")
    if running.build_id is None:
        return Verdict(UNKNOWN, f"{UNKNOWN}: the running kernel {running.release} exposes no GNU build id ({running.notes}), "
                       f"so kpgo cannot tell whether it is {what}")
    build = f"{man['kernel_release']} {man['variant']}, build id {man['build_id'][:16]}"
    if running.build_id != man["build_id"]:
        return Verdict(NO, f"{NO}: the running kernel {running.release} (build id {running.build_id[:16]}) is not {what} ({build})")
    prof = man.get("profile")
    used = (f"profile {prof['digest']} from {', '.join(prof['workloads']) or 'unnamed workloads'} ({proof_text(man.get('proof'))})"
            if prof else "no profile")
    return Verdict(YES, f"{YES}: the running kernel is {what} ({build}), {used}")


def verify(build: Path | None = None, deb: Path | None = None, notes: Path = NOTES, release: str | None = None) -> Verdict:
    running = running_kernel(notes, release)
    if build is not None:
        return decide(manifest(build.resolve()), running, f"the kpgo build in {build}")
    if deb is not None:
        return decide(package_manifest(deb), running, f"the kpgo package {deb.name}")
    path = ROOT / manifest_name(running.release)
    if not os.path.lexists(path):
        return decide(None, running, "", f"no kpgo manifest for the running kernel {running.release} ({path}): it was not installed from "
                      "a `kpgo package` .deb (name the build or package: --build DIR, --package FILE.deb)")
    return decide(read_manifest(path), running, f"the kpgo build its package installed ({path})")


def summary(p: Packaged) -> str:
    prof = p.manifest["profile"]
    size = p.deb.stat().st_size
    return (f"package: {p.deb} ({size / 2**20:.1f} MiB, {fmt_secs(p.seconds)}, {p.compiled} objects compiled again) with /"
            f"{manifest_name(p.manifest['kernel_release'])}: build id {p.manifest['build_id']}, "
            + (f"profile {prof['digest']} from {', '.join(prof['workloads'])}" if prof else "no profile"))
