"""kpgo package and kpgo verify without a kernel build (docs/PACKAGING.md): the manifest of a recorded build (its keys
golden), verify's three answers on recorded notes, the version string bindeb-pkg must rebuild the same, and bad input.
The real package of a real tiny kernel is tests/test_package_vm.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from kpgo import branches, package
from kpgo.errors import UserError
from kpgo.kernel import kbuild

# The manifest's keys (package.manifest): what an administrator's tools read from /boot/kpgo-RELEASE.json. A change
# here is a change of the manifest's format: bump package.MANIFEST_VERSION with it.
GOLDEN_KEYS = ["build_id", "build_key", "bzimage_sha256", "compiler", "config", "kcflags", "kernel_release", "kind", "kpgo_version",
               "manifest_version", "opt", "package", "profile", "proof", "reproducible", "source_version", "variant", "vmlinux_sha256"]
GOLDEN_PROFILE_KEYS = ["collections", "digest", "dir", "workloads"]
GOLDEN_PROOF_KEYS = ["functions_giving_up", "functions_read", "method", "objects_nonempty", "objects_used", "objects_with_profile", "ok",
                     "ratio", "threshold"]


def elf(d: Path, body: str = "") -> Path:
    """A small ELF with a GNU build id (the build id is a hash of the linked bytes: another body, another id)."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "p.c").write_text(f"int f1(int x) {{ return x + 1{body}; }}\nvoid _start(void) {{ for (;;) f1(3); }}\n")
    subprocess.run(["gcc", "-O1", "-nostdlib", "-static", "-Wl,--build-id", "-o", d / "p", d / "p.c"], check=True)
    return d / "p"


def notes_of(vmlinux: Path, out: Path) -> Path:
    """What /sys/kernel/notes holds when `vmlinux` runs: its note section's bytes (a kernel's .notes, a small ELF's
    .note.gnu.build-id)."""
    subprocess.run(["objcopy", "-O", "binary", "--only-section=.notes", "--only-section=.note.gnu.build-id", vmlinux, out], check=True)
    return out


def recorded_build(d: Path, *, with_profile: bool = True) -> Path:
    """A build directory as `kpgo build` leaves it, with a small ELF as vmlinux and the records of a real tiny optimized
    build (build.json's fields and proof, the profile's profile.json)."""
    out = d / "build"
    (out / "arch/x86/boot").mkdir(parents=True)
    shutil.copyfile(elf(d / "elf"), out / "vmlinux")
    (out / "arch/x86/boot/bzImage").write_bytes(b"bzImage bytes")
    prof = d / "profile"
    prof.mkdir()
    (prof / "kernel").mkdir()
    (prof / "kernel" / "fork.gcda").write_bytes(b"gcda")
    (prof / "profile.json").write_text(json.dumps({"kind": "kernel-gcov-profile", "kernel_release": "6.12.117", "config_name": "tiny",
                                                   "build_key": "55bfa7b1d52696550491", "collected_at": "2026-11-27T15:15:21Z",
                                                   "workload": {"name": "redis", "params": {}, "unit": "requests/s"}}))
    build = {"ok": True, "key": "8e6e17d51b524304af0e", "variant": "optimized", "kernel_release": "6.12.117", "source_version": "6.12.117",
             "config_name": "tiny", "config_hash": "74a7f1bd4f754901", "gcc": "12.2.0", "opt": "O2", "flags": [],
             "compiler": {"command": "gcc", "name": "gcc-12", "version": "12.2.0", "version_text": "gcc (Debian 12.2.0-14+deb12u1) 12.2.0"},
             "kcflags": [*kbuild.PROFILE_USE_FLAGS, "-fprofile-partial-training"], "build_dir": str(out),
             "make_command": f"KBUILD_BUILD_VERSION=1 make -C /src O={out} -j3 bzImage 'KCFLAGS=-O2' 'KAFLAGS='",
             "reproducible": {"KBUILD_BUILD_TIMESTAMP": "Fri Nov 14 12:56:00 UTC 2025", "KBUILD_BUILD_USER": "kpgo", "KBUILD_BUILD_HOST": "kpgo",
                              "KBUILD_BUILD_VERSION": "1", "prefix_maps": [f"-fdebug-prefix-map={out}=."]},
             "build_id": branches.build_id_of(out / "vmlinux")}
    if with_profile:
        build["profile"] = {"dir": str(prof), "files_installed": 1}  # as a build made before the digest was recorded
        build["proof"] = {"functions_giving_up": 0, "functions_read": 13665, "method": "gcc -fdump-ipa-profile", "objects_nonempty": 232,
                          "objects_used": 232, "objects_with_profile": 1183, "ok": True, "profiled_but_not_built": [], "ratio": 1.0,
                          "threshold": 0.95, "values": {"totals": {"stringop": 4}}}
    (out / "build.json").write_text(json.dumps(build))
    return out


def test_the_manifest_of_a_build(tmp_path: Path) -> None:
    out = recorded_build(tmp_path)
    m = package.manifest(out)
    assert sorted(m) == GOLDEN_KEYS and sorted(m["profile"]) == GOLDEN_PROFILE_KEYS and sorted(m["proof"]) == GOLDEN_PROOF_KEYS
    assert m["kind"] == package.KIND and m["manifest_version"] == package.MANIFEST_VERSION
    assert m["build_id"] == branches.build_id_of(out / "vmlinux") and m["vmlinux_sha256"] == kbuild.file_sha256(out / "vmlinux")
    assert (m["kernel_release"], m["variant"], m["compiler"]["name"], m["config"]["name"]) == ("6.12.117", "optimized", "gcc-12", "tiny")
    # the profile: the build key's digest, the workloads of its collections (from profile.json: an older build.json has neither)
    assert m["profile"]["digest"] == kbuild.profile_digest(tmp_path / "profile") and m["profile"]["workloads"] == ["redis"]
    assert m["profile"]["collections"][0]["kernel_release"] == "6.12.117"
    assert m["proof"]["ok"] and m["proof"]["objects_used"] == 232 and "values" not in m["proof"]  # the lists stay in the build
    # what this kpgo's builds record is taken as recorded: the profile may be gone by packaging time
    rec = json.loads((out / "build.json").read_text())
    rec["profile"] |= {"digest": "0123456789abcdef", "collections": [{"workload": "nginx"}, {"workload": "redis"}]}
    (out / "build.json").write_text(json.dumps(rec))
    shutil.rmtree(tmp_path / "profile")
    p = package.manifest(out)["profile"]
    assert (p["digest"], p["workloads"]) == ("0123456789abcdef", ["nginx", "redis"])


def test_a_vanilla_manifest_has_no_profile(tmp_path: Path) -> None:
    m = package.manifest(recorded_build(tmp_path, with_profile=False))
    assert m["profile"] is None and m["proof"] is None and sorted(m) == GOLDEN_KEYS


def test_verify_answers_three_ways(tmp_path: Path) -> None:
    """On recorded notes: the build's own (yes, exit 0), another kernel's (no, 4), notes without a build id or no
    manifest at all (cannot tell, 5). One line each, on stdout."""
    out = recorded_build(tmp_path)
    mine, other = notes_of(out / "vmlinux", tmp_path / "mine.notes"), notes_of(elf(tmp_path / "other", " + 2"), tmp_path / "other.notes")
    empty = tmp_path / "empty.notes"
    empty.write_bytes(b"")
    for notes, code, words in ((mine, 0, ["yes: the running kernel is the kpgo build in", "optimized", "from redis", "232 of 232"]),
                               (other, 4, ["no: the running kernel", "is not the kpgo build in"]),
                               (empty, 5, ["cannot tell: the running kernel", "exposes no GNU build id"])):
        res = kpgo("verify", "--build", out, "--notes", notes)
        assert res.returncode == code and len(res.stdout.splitlines()) == 1 and not res.stderr.strip(), (res.stdout, res.stderr)
        assert all(w in res.stdout for w in words), res.stdout
    # the decision itself, on a manifest as read from a package
    m = package.manifest(out)
    run = package.running_kernel(mine, "6.12.117")
    assert package.decide(m, run, "it").answer == package.YES
    assert package.decide(None, run, "it", "no manifest").answer == package.UNKNOWN
    assert package.decide(m | {"build_id": "00" * 20}, run, "it").answer == package.NO


def test_verify_without_a_manifest_cannot_tell() -> None:
    """This machine's kernel came from no kpgo package: no manifest in /boot for it."""
    release = os.uname().release
    if os.path.exists(f"/boot/kpgo-{release}.json"):
        pytest.skip("this machine runs a kernel installed by kpgo package")
    res = kpgo("verify")
    assert res.returncode == 5 and res.stdout.startswith(f"cannot tell: no kpgo manifest for the running kernel {release}"), res.stdout


def test_the_version_string_bindeb_pkg_must_keep(tmp_path: Path) -> None:
    """bindeb-pkg regenerates the version string: from the build's own headers it is the same (no relink), for a build
    made before kpgo fixed it too."""
    gen = tmp_path / "include" / "generated"
    gen.mkdir(parents=True)
    (gen / "utsversion.h").write_text('#define UTS_VERSION "#3 SMP PREEMPT_DYNAMIC Thu Nov 27 15:01:02 UTC 2026"\n')
    # with mkcompile_h's tabs
    (gen / "compile.h").write_text('#define UTS_MACHINE\t\t"x86_64"\n#define LINUX_COMPILE_BY\t"root"\n#define LINUX_COMPILE_HOST\t"debian"\n')
    env = package.version_env(tmp_path)
    assert env == {"KBUILD_BUILD_VERSION": "3", "KBUILD_BUILD_TIMESTAMP": "Thu Nov 27 15:01:02 UTC 2026", "KBUILD_BUILD_USER": "root",
                   "KBUILD_BUILD_HOST": "debian"}
    build = {"kernel_release": "6.12.117", "make_command": f"KPGO_REUSE=all CCACHE_DIR=/c make -C /src O={tmp_path} -j3 'CC=sh /r.sh' bzImage 'KCFLAGS=-O2 -g'"}
    argv, env = package.package_command(build, tmp_path)
    assert argv == ["make", "-C", "/src", f"O={tmp_path}", "-j3", "CC=sh /r.sh", "bindeb-pkg", "KCFLAGS=-O2 -g"]
    assert env["KPGO_REUSE"] == "all" and env["KDEB_PKGVERSION"] == "6.12.117-3" and env["KBUILD_BUILD_VERSION"] == "3"
    with pytest.raises(UserError, match="not a kpgo kernel build's make line"):
        package.package_command({"kernel_release": "6", "make_command": "rm -rf /"}, tmp_path)


def test_reproducible_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The path maps cover the O= directory and the source, the longer (more specific) last, since GCC uses the last
    that matches; the timestamp is the source's (its top Makefile's time, or SOURCE_DATE_EPOCH) and parses back with
    date -d, as the initramfs's generator reads it."""
    assert kbuild.prefix_maps(Path("/src/linux"), Path("/src/linux/out")) == ["-fdebug-prefix-map=/src/linux=.", "-fdebug-prefix-map=/src/linux/out=."]
    (tmp_path / "Makefile").write_text("")
    os.utime(tmp_path / "Makefile", (1731588960, 1731588960))
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    env = kbuild.reproducible_env(tmp_path)
    assert env == {"KBUILD_BUILD_TIMESTAMP": "Thu Nov 14 12:56:00 UTC 2024", "KBUILD_BUILD_USER": "kpgo", "KBUILD_BUILD_HOST": "kpgo",
                   "KBUILD_BUILD_VERSION": "1"}
    back = subprocess.run(["date", "-u", "-d", env["KBUILD_BUILD_TIMESTAMP"], "+%s"], capture_output=True, text=True, check=True).stdout
    assert int(back) == 1731588960
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "0")
    assert kbuild.build_timestamp(tmp_path) == "Thu Jan 01 00:00:00 UTC 1970"


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo.deb"
    os.mkfifo(fifo)
    garbage = tmp_path / "garbage.deb"
    garbage.write_bytes(os.urandom(4000))
    # a real .deb without a manifest
    root = tmp_path / "pkg"
    (root / "DEBIAN").mkdir(parents=True)
    (root / "DEBIAN" / "control").write_text("Package: hello-kpgo\nVersion: 1\nArchitecture: all\nMaintainer: k <k@k>\nDescription: x\n")
    (root / "boot").mkdir()
    (root / "boot" / "config-6.12.117").write_text("CONFIG_X=y\n")
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", root, tmp_path / "plain.deb"], check=True, capture_output=True)
    # one whose manifest is garbage
    (root / "boot" / "kpgo-6.12.117.json").write_text("{not json")
    subprocess.run(["dpkg-deb", "--root-owner-group", "--build", root, tmp_path / "bad-manifest.deb"], check=True, capture_output=True)
    cut = tmp_path / "cut.deb"
    cut.write_bytes((tmp_path / "plain.deb").read_bytes()[:300])
    for args, needles in (
        (("verify", "--package", fifo), ["is a FIFO", "kpgo package"]),
        (("verify", "--package", garbage), ["not a Debian package"]),
        (("verify", "--package", cut), ["not a Debian package dpkg-deb can read"]),
        (("verify", "--package", tmp_path / "plain.deb"), ["holds no kpgo manifest", "not made by `kpgo package`"]),
        (("verify", "--package", tmp_path / "bad-manifest.deb"), ["kpgo-6.12.117.json", "not valid JSON"]),
        (("verify", "--package", tmp_path / "none.deb"), ["does not exist"]),
        (("verify", "--build", tmp_path), ["no complete kpgo build"]),
        (("verify", "--build", garbage), ["garbage.deb is a file, so it holds no complete kpgo build"]),
        (("package", tmp_path), ["no complete kpgo build"]),
        (("package", fifo), ["no complete kpgo build"]),
    ):
        assert_one_line_error(kpgo(*args), 1, *needles)
    # a build directory whose vmlinux was linked again after kpgo built it
    out = recorded_build(tmp_path / "relinked")
    shutil.copyfile(elf(tmp_path / "again", " + 5"), out / "vmlinux")
    assert_one_line_error(kpgo("verify", "--build", out), 1, "the directory changed after kpgo built it")
    assert_one_line_error(kpgo("verify", "--build", out, "--package", garbage), 2, "not allowed with argument")
