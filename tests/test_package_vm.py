"""Reproducible builds and the package, on real tiny kernels (docs/PACKAGING.md): the tiny vanilla kernel built three
times from the same inputs into three directories — the second taking its objects from ccache across O= directories
(the path maps must not stop that), the third with ccache off, every object compiled — gives one vmlinux and one
bzImage, byte for byte; `kpgo package` makes the kernel's own .deb of it with nothing compiled again and kpgo's
manifest inside; `kpgo verify` says yes for the build and its package on the build's notes and inside a guest booted
from it, no on this host. Three tiny builds (~3-8 min each on 2 cores, the one without ccache the longest), bindeb-pkg
(~1 min) and one boot: marked slow, run with `make test PYTEST_ARGS='-m slow'`."""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import kpgo
from kpgo import package, vm
from test_package import notes_of

pytestmark = [pytest.mark.vm, pytest.mark.slow]

GUEST = vm.Guest(cpus=1, memory="1G", timeout=600)


@pytest.fixture(scope="module")
def builds(test_dir: Path) -> dict[str, dict]:
    """Three builds of the same inputs, each afresh (what is tested is the build, so none is reused from a last run)."""
    d = test_dir / "reproducible"
    shutil.rmtree(d, ignore_errors=True)
    out: dict[str, dict] = {}
    for name, env in (("a", {}), ("b", {}), ("c", {"CCACHE_DISABLE": "1"})):
        res = kpgo("build", "--base", "tiny", "-o", d / name, timeout=3600, env=env)
        assert res.returncode == 0, res.stderr[-3000:]
        out[name] = json.loads((d / name / "build.json").read_text()) | {"dir": d / name, "seconds_cli": res.seconds}
        print(f"build {name}: {res.seconds:.0f} s, vmlinux sha256 {out[name]['vmlinux_sha256']}, reuse {out[name]['reuse']}")
    return out


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_two_builds_of_the_same_inputs_give_the_same_vmlinux(builds: dict[str, dict]) -> None:
    a, b, c = builds["a"], builds["b"], builds["c"]
    assert a["key"] == b["key"] == c["key"]  # the reproducibility settings are no key input
    assert a["vmlinux_sha256"] == b["vmlinux_sha256"] == c["vmlinux_sha256"] == sha256(c["dir"] / "vmlinux")
    assert a["build_id"] == b["build_id"] == c["build_id"]
    assert len({sha256(x["dir"] / "arch/x86/boot/bzImage") for x in (a, b, c)}) == 1
    # the path maps name each build's own directory, and ccache still answers the second build from the first's objects
    assert a["reproducible"]["prefix_maps"] != b["reproducible"]["prefix_maps"]
    assert b["reuse"]["mode"] == "all" and b["reuse"]["reused"] >= 0.9 * b["objects_compiled"] and b["reuse"]["cache_misses"] < 50
    assert c["reuse"]["reused"] == 0  # the third compiled everything
    assert a["reproducible"]["KBUILD_BUILD_USER"] == "kpgo"
    banner = subprocess.run(["strings", a["dir"] / "vmlinux"], capture_output=True, text=True, check=True).stdout
    line = next(ln for ln in banner.splitlines() if ln.startswith("Linux version "))
    assert "(kpgo@kpgo) (" in line and re.search(rf"\) #1 (SMP )?{a['reproducible']['KBUILD_BUILD_TIMESTAMP']}$", line), line


def test_the_package_carries_the_build_and_its_manifest(builds: dict[str, dict], tmp_path: Path) -> None:
    a = builds["a"]
    out, release = a["dir"], a["kernel_release"]
    res = kpgo("package", out, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert "0 objects compiled again" in res.stdout, res.stdout
    debs = sorted((out / "packages").glob("*.deb"))
    image = next(p for p in debs if p.name.startswith(f"linux-image-{release}_"))
    print(f"packages: {[(p.name, p.stat().st_size) for p in debs]}")
    assert not list(out.parent.glob("*.deb")) and not list(out.parent.glob("*.changes"))  # nothing left beside the build
    listing = subprocess.run(["dpkg-deb", "--contents", image], capture_output=True, text=True, check=True).stdout
    for f in (f"./boot/vmlinuz-{release}", f"./boot/config-{release}", f"./boot/System.map-{release}", f"./boot/kpgo-{release}.json"):
        assert f in listing, listing
    fields = subprocess.run(["dpkg-deb", "--field", image, "Package", "Version"], capture_output=True, text=True, check=True).stdout
    assert f"Package: linux-image-{release}" in fields and f"Version: {release}-1" in fields
    # the manifest in the package is kpgo.json beside it, and describes the build as it still is
    x = tmp_path / "x"
    subprocess.run(["dpkg-deb", "--extract", image, x], check=True)
    inside = json.loads((x / "boot" / f"kpgo-{release}.json").read_text())
    assert inside == json.loads((out / "packages" / "kpgo.json").read_text())
    assert inside["build_id"] == a["build_id"] and inside["vmlinux_sha256"] == a["vmlinux_sha256"] == sha256(out / "vmlinux")
    assert inside["package"]["name"] == f"linux-image-{release}" and inside["profile"] is None and inside["reproducible"]["KBUILD_BUILD_VERSION"] == "1"
    assert sha256(x / "boot" / f"vmlinuz-{release}") == sha256(out / "arch/x86/boot/bzImage")
    # its md5sums list the manifest, so `dpkg --verify` covers it once installed
    ctrl = tmp_path / "ctrl"
    subprocess.run(["dpkg-deb", "--control", image, ctrl], check=True)
    assert f"boot/kpgo-{release}.json" in (ctrl / "md5sums").read_text()
    # verify: the build's notes are the package's (yes), and also the other builds' (reproducible); this host's are not
    notes = notes_of(builds["b"]["dir"] / "vmlinux", tmp_path / "b.notes")
    for args in (("--package", image), ("--build", out), ("--build", builds["c"]["dir"])):
        res = kpgo("verify", *args, "--notes", notes)
        assert res.returncode == 0 and res.stdout.startswith("yes: ") and "no profile" in res.stdout, res.stdout
    res = kpgo("verify", "--package", image)
    assert res.returncode == 4 and res.stdout.startswith("no: "), res.stdout


def test_verify_inside_the_booted_kernel(builds: dict[str, dict], tmp_path: Path) -> None:
    """The guest runs the build's kernel: verify there, on the package and on the build, answers yes from the real
    /sys/kernel/notes; with nothing named it cannot tell (the host's /boot has no manifest for 6.12)."""
    a = builds["a"]
    image = next((a["dir"] / "packages").glob(f"linux-image-{a['kernel_release']}_*.deb"))
    src = Path(package.__file__).parents[1]
    run = f"PYTHONPATH={src} {sys.executable} -m kpgo verify"
    cmd = f"{run} --package {image}; echo verify-package=$?; {run} --build {a['dir']}; echo verify-build=$?; {run}; echo verify-none=$?"
    kernel = a["dir"] / "arch/x86/boot/bzImage"
    res = vm.run_command(kernel, cmd, guest=GUEST, log=tmp_path / "console.log", accel=vm.accelerator(kernel))
    out = res.output
    print(out[-3000:])
    assert "verify-package=0" in out and "verify-build=0" in out and "verify-none=5" in out, out[-3000:]
    assert "yes: the running kernel is the kpgo package" in out and "cannot tell: no kpgo manifest for the running kernel" in out
