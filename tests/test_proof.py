"""The proof reads GCC's own verdict. Checked both ways on real GCC output: the kernel-shaped
profile (no object summary) is ignored by GCC and the proof says so; the repaired one is used."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from gcov_fixtures import OBJECTS, Profiles, gcc_build, profiles  # noqa: F401
from kpgo.gcov.profile import fix_profile
from kpgo.kernel import kbuild, proof


def optimized_build(src_root: Path, profile: Path, out: Path) -> None:
    """Compile the fixture's objects like Kbuild does: from the build dir, -o dir/x.o, .gcda beside it."""
    shutil.copytree(src_root, out, ignore=shutil.ignore_patterns("*.o", "*.gcda", "*.gcno", "prog"))
    kbuild._install_profile(profile, out, None)
    for obj in OBJECTS:
        subprocess.run(["gcc", "-O1", *kbuild.PROFILE_USE_FLAGS, "-c", obj[:-2] + ".c", "-o", obj], cwd=out, check=True)


def test_proof_rejects_profile_without_summary(profiles: Profiles, tmp_path: Path) -> None:
    out = tmp_path / "opt"
    optimized_build(profiles.build.root, profiles.k0, out)
    result = proof.check(out, profiles.k0)
    assert result["objects_nonempty"] == 3
    assert result["objects_used"] == 0 and result["functions_giving_up"] > 0
    assert not result["ok"]
    assert not list(out.rglob("*i.profile"))  # dumps are removed after reading


def test_proof_accepts_repaired_profile(profiles: Profiles, tmp_path: Path) -> None:
    fixed = tmp_path / "fixed"
    fix_profile(profiles.k0, fixed)
    out = tmp_path / "opt"
    optimized_build(profiles.build.root, fixed, out)
    result = proof.check(out, fixed)
    assert result["objects_used"] == result["objects_nonempty"] == 3
    assert result["functions_giving_up"] == 0 and result["ok"]
