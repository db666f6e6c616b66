"""`--data disk` on a booted kernel: the tiny kernel with the virtio disk and ext4 built in (tests/data/
data-disk.config) runs a workload whose run directory is the ext4 file system the host made on the guest's disk,
says so (the agent reads /proc/mounts), and the bench keeps the place beside its figures; a kernel without the
drivers is refused in one line before a boot. An extra kernel (~3 min on 2 cores), so marked slow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from conftest import MICRO_OPS, assert_one_line_error, kpgo

pytestmark = [pytest.mark.vm, pytest.mark.slow]
DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def disk_kernel(test_dir: Path) -> Path:
    out = test_dir / "tiny-data-disk"
    res = kpgo("build", "--base", "tiny", "--fragment", DATA / "data-disk.config", "--variant", "vanilla", "-o", out, timeout=3600)
    assert res.returncode == 0, res.stderr[-3000:]
    return out


def test_a_workload_runs_on_the_data_disk(disk_kernel: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    short = [a for s in MICRO_OPS for a in ("--set", f"micro.{s}")]
    res = kpgo("bench", "--kernel", f"disk={disk_kernel}", "--workload", "micro", *short, "--boots", "1", "--data", "disk", "--sim", "-o", out)
    assert res.returncode == 0, res.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert results["measurement"]["data"] == "disk"
    (boot,) = out.glob("boots/*/guest/result.json")
    assert json.loads(boot.read_text())["rundir_fs"] == "ext4 /dev/vda"
    assert not list(out.glob("boots/*/data.img"))  # the image is gone after the boot


def test_a_kernel_without_the_disk_drivers_is_refused(disk_kernel: Path, tmp_path: Path) -> None:
    """The same build with its .config saying no virtio disk: refused in one line before a boot, nothing written."""
    copy = tmp_path / "no-disk"
    (copy / "arch" / "x86" / "boot").mkdir(parents=True)
    shutil.copy(disk_kernel / "build.json", copy / "build.json")
    shutil.copy(disk_kernel / "arch" / "x86" / "boot" / "bzImage", copy / "arch" / "x86" / "boot" / "bzImage")
    (copy / ".config").write_text((disk_kernel / ".config").read_text().replace("CONFIG_VIRTIO_BLK=y", "# CONFIG_VIRTIO_BLK is not set"))
    res = kpgo("bench", "--kernel", f"v={copy}", "--workload", "micro", "--boots", "1", "--data", "disk", "-o", tmp_path / "bench")
    assert_one_line_error(res, 1, "--data disk", "CONFIG_VIRTIO_BLK=y")
    assert not (tmp_path / "bench").exists()
