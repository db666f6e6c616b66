"""`--base debian` and `--base debian-cloud` (docs/PACKAGING.md): the config Debian ships for its kernel (package
linux-config-6.12), configured by the real Kbuild of the real source with kpgo's changes on top; every option that
ends up other than Debian's is one kpgo says it changes, or one that follows from those."""

from __future__ import annotations

import lzma
import re
from pathlib import Path

import pytest

from conftest import kpgo
from kpgo.errors import UserError
from kpgo.kernel import kconfig, source
from kpgo.kernel.source import KernelSource

# What may differ from Debian's file after configuring, beside the options the shipped fragment sets, and why.
FOLLOWS = {
    # debug info off takes its sub-options, BTF and pahole's probes with it
    r"CONFIG_DEBUG_INFO\w*", r"CONFIG_\w*BTF\w*", r"CONFIG_PAHOLE_\w+",
    # virtio_net built in selects its failover helpers
    r"CONFIG_(NET_)?FAILOVER",
    # 9p built in selects the network filesystem library, and its fd transport defaults to 9p's own setting
    r"CONFIG_NETFS_SUPPORT", r"CONFIG_NET_9P_FD",
    # Kconfig writes the defaults Debian's packaging sets itself (salt, keys), and what it finds on this machine
    r"CONFIG_BUILD_SALT", r"CONFIG_SYSTEM_TRUSTED_KEYS", r"CONFIG_CC_VERSION_TEXT", r"CONFIG_RUSTC_\w+",
}


@pytest.fixture(scope="module")
def kernel_source() -> KernelSource:
    return source.resolve(None)


@pytest.mark.parametrize("base", ["debian", "debian-cloud"])
def test_debian_config_with_kpgos_changes_and_nothing_else(kernel_source: KernelSource, tmp_path: Path, base: str) -> None:
    spec = kconfig.resolve(base, None, [])
    debian_file, ours = spec.files[0], spec.files[1]
    assert spec.base_target is None and ours.name == f"{base}.config"
    flavour = re.search(r"^# kpgo-base: debian:(\S+)", ours.read_text(), re.M)
    assert flavour and debian_file.read_bytes() == lzma.decompress((kconfig.DEBIAN_CONFIGS / f"config.{flavour.group(1)}.xz").read_bytes())
    final = kconfig.configure(kernel_source.path, tmp_path, spec, (), tmp_path / "log")
    debian, changes = kconfig.parse(debian_file.read_text()), kconfig.parse(ours.read_text())
    differ = {k for k in set(debian) | set(final) if debian.get(k, "n") != final.get(k, "n")}
    unexplained = sorted(k for k in differ - set(changes) if not any(re.fullmatch(rx, k) for rx in FOLLOWS))
    assert not unexplained, unexplained
    # the changes took, and the kernel is still Debian's: modules and all, its mitigations, its lockdown
    assert all(final.get(k, "n") == v for k, v in changes.items())
    assert final["CONFIG_MODULES"] == "y" and sum(v == "m" for v in final.values()) > 1000
    assert final["CONFIG_MODULE_SIG"] == "y" and final["CONFIG_SECURITY_LOCKDOWN_LSM"] == "y" and final["CONFIG_MITIGATION_RETPOLINE"] == "y"
    assert "CONFIG_DEBUG_INFO_BTF" not in final
    assert kconfig.sets_modules(spec, ())


def test_dry_run_builds_the_modules(tmp_path: Path) -> None:
    res = kpgo("build", "--base", "debian-cloud", "--dry-run", "-o", str(tmp_path / "out"))
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert any(ln.startswith("cp ") and "config.amd64_none_cloud-amd64" in ln for ln in lines)
    make = [ln for ln in lines if " bzImage" in ln]
    assert len(make) == 1 and " bzImage modules " in make[0]
    tiny = kpgo("build", "--base", "tiny", "--dry-run", "-o", str(tmp_path / "tiny"))
    assert " modules" not in [ln for ln in tiny.stdout.splitlines() if " bzImage" in ln][0]


def test_missing_or_broken_debian_config_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kconfig, "DEBIAN_CONFIGS", tmp_path)
    with pytest.raises(UserError, match=r"Debian's kernel config .*config.amd64_none_amd64.xz not found") as e:
        kconfig.resolve("debian", None, [])
    assert "linux-config-6.12" in e.value.hint
    (tmp_path / "config.amd64_none_amd64.xz").write_bytes(b"not xz")
    with pytest.raises(UserError, match="cannot be read"):
        kconfig.resolve("debian", None, [])


def test_a_fragment_may_override_its_base_and_an_unmet_option_is_refused(kernel_source: KernelSource, tmp_path: Path) -> None:
    """The check after configuring compares .config with what the files ask for, the later file winning as in
    merge_config.sh: tiny's CONFIG_MODULES=n overridden by a fragment is asked for, not an error; an option whose
    dependencies are not met is (the test module without modules)."""
    data = Path(__file__).parent / "data"
    spec = kconfig.resolve("tiny", None, [data / "modules.config"])
    final = kconfig.configure(kernel_source.path, tmp_path / "ok", spec, (), tmp_path / "ok.log")
    assert final["CONFIG_MODULES"] == "y" and final["CONFIG_TEST_STATIC_KEYS"] == "m"
    frag = tmp_path / "no-modules.config"
    frag.write_text("CONFIG_TEST_STATIC_KEYS=m\n")
    with pytest.raises(UserError, match=r"CONFIG_TEST_STATIC_KEYS=m \(from no-modules.config\) became CONFIG_TEST_STATIC_KEYS=n: its dependencies are not met"):
        kconfig.configure(kernel_source.path, tmp_path / "bad", kconfig.resolve("tiny", None, [frag]), (), tmp_path / "bad.log")


def test_progress_names_a_modules_object() -> None:
    """Kbuild prints a module's objects as `CC [M]  path`: the progress line names the path, not "[M]"."""
    from kpgo.kernel.kbuild import _STEP

    for line, path in (("  CC [M]  fs/smb/client/cifsfs.o", "fs/smb/client/cifsfs.o"), ("  CC      kernel/fork.o", "kernel/fork.o")):
        m = _STEP.match(line)
        assert m and m.group(1) == "CC" and m.group(2) == path
