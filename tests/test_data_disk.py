"""`--data disk`: a workload's run directory on an ext4 file system of a virtio disk instead of a tmpfs (what the
host makes and passes, what the job says, the kernel check before a boot, the bench key). The boot itself:
tests/test_data_disk_vm.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from kpgo import bench, study, vm, workloads
from kpgo.errors import UserError
from kpgo.guest import contract

GUEST = "".join(f"CONFIG_{o}=y\n" for o in workloads.GUEST_BUILTIN)


def test_a_kernel_without_the_disk_drivers_is_refused_before_a_boot(tmp_path: Path) -> None:
    (tmp_path / ".config").write_text(GUEST + "# CONFIG_VIRTIO_BLK is not set\nCONFIG_EXT4_FS=m\n")
    redis = workloads.load("redis")
    workloads.check_kernel([redis], tmp_path)  # on tmpfs it needs none of them
    with pytest.raises(UserError) as e:
        workloads.check_kernel([redis], tmp_path, disk=True)
    assert "--data disk" in e.value.message and "needs CONFIG_VIRTIO_BLK=y CONFIG_EXT4_FS=y" in e.value.message
    assert "--fragment" in (e.value.hint or "") and "\n" not in str(e.value)
    (tmp_path / ".config").write_text(GUEST + "".join(f"CONFIG_{o}=y\n" for o in workloads.DISK_BUILTIN))
    workloads.check_kernel([redis], tmp_path, disk=True)


def test_an_unknown_place_is_one_line() -> None:
    with pytest.raises(UserError, match="--data ssd: the run directory is on tmpfs or disk"):
        vm.Guest(data="ssd")


def test_the_job_says_disk_only_when_it_is() -> None:
    job = contract.Job(mode="bench", workload=workloads.load("redis"))
    assert "data" not in job.to_json()  # a job on tmpfs reads as it always has
    disk = contract.Job(mode="bench", workload=workloads.load("redis"), data="disk")
    assert disk.to_json()["data"] == "disk" and contract.Job.from_json(disk.to_json()).data == "disk"


def test_the_disk_is_attached_and_keys_the_cell(tmp_path: Path) -> None:
    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"\0")
    argv = [str(a) for a in vm.vng_argv(kernel, "true", guest=vm.Guest(data="disk"), accel="tcg", disk=tmp_path / "data.img")]
    assert argv[argv.index("--disk") + 1] == str(tmp_path / "data.img")
    assert "--disk" not in [str(a) for a in vm.vng_argv(kernel, "true", guest=vm.Guest(), accel="tcg")]
    build, wl = {"key": "k1"}, workloads.load("redis")
    assert bench._cell_key(build, wl, 1, None) == bench._cell_key(build, wl, 1, None, "tmpfs") != bench._cell_key(build, wl, 1, None, "disk")
    assert study.share_dir(tmp_path, [], None, None, "disk").name == "share-disk"
    assert study.share_dir(tmp_path, [], None, None).name == "share"


def test_the_image_is_a_sparse_ext4_file_system_made_whole(tmp_path: Path) -> None:
    img = tmp_path / "data.img"
    vm.make_data_disk(img)
    st = img.stat()
    assert st.st_size == vm.DATA_DISK_BYTES and st.st_blocks * 512 < st.st_size // 8  # sparse
    info = subprocess.run(["/usr/sbin/dumpe2fs", "-h", str(img)], capture_output=True, text=True, check=True).stdout
    assert "Filesystem volume name:   kpgo-data" in info and "has_journal" in info
    # inode tables written on the host, so the guest's ext4lazyinit has nothing to do in a measured window
    groups = subprocess.run(["/usr/sbin/dumpe2fs", str(img)], capture_output=True, text=True, check=True).stdout
    assert "ITABLE_ZEROED" in groups and "ITABLE_ZEROED" in groups.split("Group 1:")[1]


def test_a_host_without_mkfs_is_told_before_any_boot(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vm.shutil, "which", lambda name: None)
    monkeypatch.setattr(vm.os, "access", lambda path, mode: False)
    with pytest.raises(UserError, match="--data disk needs mkfs.ext4 on the host") as e:
        vm.Guest(data="disk")
    assert "e2fsprogs" in (e.value.hint or "")
    vm.Guest()  # tmpfs needs none
