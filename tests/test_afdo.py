"""Clang AutoFDO from branch records (kpgo.afdo) without a kernel: a vmlinux-like ELF built by clang-19 as the
clang-train kernel is (line tables, discriminators), its branch records from a run under user-mode QEMU, through
`kpgo profile afdo` (llvm-profgen --kernel, llvm-profdata merge) to a sample profile naming its hot function; the
proof read from the optimization records of a real clang-19 compile with that profile; bad input in one line."""

from __future__ import annotations

import dataclasses
import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import assert_one_line_error, kpgo
from tests.test_branches import FREESTANDING, KERNEL_BASE, USER_BASE

from kpgo import afdo, branches, sim, variants
from kpgo.errors import UserError

CLANG = "clang-19"
# As the clang-train kernel compiles (afdo.TRAIN_FLAGS), freestanding and linked at a fixed address.
FLAGS = [CLANG, "-O2", *afdo.TRAIN_FLAGS, "-static", "-nostdlib", "-ffreestanding", "-fno-pie", "-mcmodel=large",
         "-fno-stack-protector", "-fcf-protection=none", "-Wno-unknown-attributes", "-Wl,--build-id"]


def branch_profile(tmp: Path, name: str = "bp", n: int = 1) -> tuple[Path, Path]:
    """A branch profile directory as `kpgo collect --branches` writes one, for a vmlinux-like ELF built here: the
    records of the same code linked at a user address and run, shifted to the kernel address."""
    user, kernel = tmp / "probe-user", tmp / "vmlinux"
    if not kernel.exists():
        subprocess.run([*FLAGS, f"-Wl,-Ttext-segment={USER_BASE:#x}", "-o", user, FREESTANDING], check=True)
        subprocess.run([*FLAGS, f"-Wl,-Ttext-segment={KERNEL_BASE:#x}", "-o", kernel, FREESTANDING], check=True)
    # The plugin records the user run under the kernel ELF's build id: the records file is the one a kernel-side
    # recording of this code would hold but for the addresses, which the outputs below get shifted.
    records = tmp / f"{name}.rec"
    config = sim.BranchConfig(side="user", build_id=branches.build_id_of(kernel), period=64)
    subprocess.run(["qemu-x86_64", "-plugin", f"{sim.build_plugin()},out={records.with_suffix('.json')},{config.plugin_arg(records)}", user],
                   check=True, capture_output=True, timeout=300)
    rec = branches.read_records(records, config.build_id)
    shift = np.uint64(KERNEL_BASE - USER_BASE)
    edges, ranges = rec.edges.copy(), rec.ranges.copy()
    edges[:, :2] += shift
    ranges[:, :2] += shift
    krec = dataclasses.replace(rec, side="kernel", edges=edges, ranges=ranges,
                               stacks=tuple(branches.Stack(s.count * n, s.branches + shift) for s in rec.stacks))
    out = tmp / name
    out.mkdir()
    outputs = branches.make_outputs(krec, kernel, out)
    records.rename(out / branches.RECORDS_FILE)
    manifest = {"kind": branches.PROFILE_KIND, "build_id": krec.build_id, "vmlinux": str(kernel), "kernel_release": "test",
                "workload": name, **outputs}
    (out / "profile.json").write_text(json.dumps(manifest))
    return out, kernel


def test_sample_profile_names_the_hot_function_and_clang_applies_it(tmp_path: Path) -> None:
    bp, kernel = branch_profile(tmp_path)
    out = tmp_path / "afdo"
    m = afdo.make([bp], out)
    assert m["kind"] == afdo.SAMPLE_KIND and m["build_id"] == branches.build_id_of(kernel)
    assert m["hot_functions"][0]["function"] == "hot_fn" and m["samples"] > 0
    funcs = {f.name: f for f in afdo.read_functions(out / afdo.PROFILE_FILE)}
    assert funcs["hot_fn"].total > 100 * funcs.get("cold_fn", afdo.SampleFunction("", 0, 0)).total
    # the optimized compile: Clang's records say where it applied the profile
    build = tmp_path / "build"
    build.mkdir()
    subprocess.run([CLANG, "-O2", *afdo.TRAIN_FLAGS, f"-fprofile-sample-use={out / afdo.PROFILE_FILE}", *afdo.USE_FLAGS,
                    "-Wno-unknown-attributes", "-c", FREESTANDING, "-o", build / "probe.o"], check=True)
    assert (build / "probe.opt.yaml").exists()
    proof = afdo.check(build, out)
    assert proof["ok"] and proof["functions_applied"] >= 1 and proof["share_samples"] >= afdo.PROOF_MIN, proof
    sections = subprocess.run(["readelf", "-SW", build / "probe.o"], capture_output=True, text=True, check=True).stdout
    assert ".text.hot.hot_fn" in sections  # the profile changed the code's placement, as the kernel's script groups it
    # without the profile, Clang records nothing applied: the proof fails
    (build / "probe.opt.yaml").unlink()
    subprocess.run([CLANG, "-O2", *afdo.USE_FLAGS, "-Wno-unknown-attributes", "-c", FREESTANDING, "-o", build / "probe.o"], check=True)
    bad = afdo.check(build, out)
    assert not bad["ok"] and bad["functions_applied"] == 0 and bad["missing_hottest"][0]["function"] == "hot_fn"


def test_merge_weighs_and_normalizes(tmp_path: Path) -> None:
    a, _ = branch_profile(tmp_path, "a", n=1)
    b, _ = branch_profile(tmp_path, "b", n=4)
    m = afdo.make([a, b], tmp_path / "raw")
    assert [i["llvm_weight"] for i in m["inputs"]] == [1, 1]
    n = afdo.make([a, b], tmp_path / "norm", normalize=True)
    sa, sb = (i["samples"] for i in n["inputs"])
    assert sb > 3 * sa and n["inputs"][0]["llvm_weight"] == round(100 * sb / sa) and n["inputs"][1]["llvm_weight"] == 100
    wa, wb = (i["llvm_weight"] for i in n["inputs"])
    assert n["samples"] == pytest.approx(wa * sa + wb * sb, rel=1e-3) and wa * sa == pytest.approx(wb * sb, rel=0.01)  # equal shares
    assert m["samples"] == pytest.approx(sa + sb, rel=1e-3)


def test_cli_and_stats(tmp_path: Path) -> None:
    """`kpgo profile afdo` and `kpgo profile stats` from the command line; the same input twice, an existing output
    and cut records in one line, the output left absent."""
    bp, _ = branch_profile(tmp_path)
    res = kpgo("profile", "afdo", bp, "-o", tmp_path / "o")
    assert res.returncode == 0 and "1 branch profile(s)" in res.stdout and "hottest: hot_fn" in res.stdout, res.stdout + res.stderr
    res = kpgo("profile", "stats", tmp_path / "o")
    assert res.returncode == 0 and "Clang sample profile" in res.stdout and "hot: hot_fn" in res.stdout, res.stdout + res.stderr
    assert json.loads(kpgo("profile", "stats", tmp_path / "o", "--json").stdout)["kind"] == afdo.SAMPLE_KIND
    assert_one_line_error(kpgo("profile", "afdo", bp, "-o", tmp_path / "o"), 1, "already exists")
    assert_one_line_error(kpgo("profile", "afdo", bp, bp, "-o", tmp_path / "o2"), 1, "given twice")
    rec = bp / branches.RECORDS_FILE
    rec.write_bytes(rec.read_bytes()[:-5])
    assert_one_line_error(kpgo("profile", "afdo", bp, "-o", tmp_path / "o2"), 1, "truncated")
    assert not (tmp_path / "o2").exists()


def test_bad_input_is_one_line(tmp_path: Path) -> None:
    bp, kernel = branch_profile(tmp_path)
    with pytest.raises(UserError, match="at least|no branch profile"):
        afdo.make([], tmp_path / "o")
    # the training kernel rebuilt since (another build id): refused before llvm-profgen runs
    subprocess.run([*FLAGS, f"-Wl,-Ttext-segment={KERNEL_BASE:#x}", "-DEXTRA", "-Wl,--build-id=0x1234", "-o", kernel, FREESTANDING], check=True)
    with pytest.raises(UserError, match="is not the kernel the branch profile .* was recorded on") as e:
        afdo.make([bp], tmp_path / "o")
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()
    # a kernel without line tables
    subprocess.run([c for c in FLAGS if c not in afdo.TRAIN_FLAGS] + [f"-Wl,-Ttext-segment={KERNEL_BASE:#x}", "-o", kernel, FREESTANDING], check=True)
    with pytest.raises(UserError, match="no line tables"):
        afdo.check_training(kernel)
    with pytest.raises(UserError, match="positive"):
        afdo.make([bp], tmp_path / "o", weights=[0.0])


def test_parse_text_and_bad_profiles(tmp_path: Path) -> None:
    text = "hot_fn:5000:100\n 0: 100\n 1: 50 hot_fn:10\n 2: inl_fn:200\n  0: 200\ncold_fn:7:1\n 0: 1\n"
    assert afdo.parse_text(text) == [afdo.SampleFunction("hot_fn", 5000, 100), afdo.SampleFunction("cold_fn", 7, 1)]
    with pytest.raises(UserError, match="line 1"):
        afdo.parse_text("\x7fELF garbage\n")
    d = tmp_path / "p"
    d.mkdir()
    (d / "profile.json").write_text(json.dumps({"kind": "kernel-branch-profile"}))
    with pytest.raises(UserError, match="not a Clang sample profile"):
        afdo.read_profile(d)
    (d / "profile.json").write_text(json.dumps({"kind": afdo.SAMPLE_KIND}))
    with pytest.raises(UserError, match="lacks profile.afdo"):
        afdo.read_profile(d)
    (d / afdo.PROFILE_FILE).write_bytes(b"\x00\xff\xfe")
    with pytest.raises(UserError, match="not text"):
        afdo.check_for_build(d)
    (d / afdo.PROFILE_FILE).write_text("f:0:0\n")
    with pytest.raises(UserError, match="holds no samples"):
        afdo.check_for_build(d)


def test_variants_and_build_requests(tmp_path: Path) -> None:
    """The four Clang variants as data; a gcov profile given to clang-afdo and a sample profile to optimized are
    refused in one line before anything is built."""
    known = variants.load_all()
    for name in ("clang-train", "clang-afdo", "clang-thinlto", "clang-afdo-thinlto"):
        assert name in known
    assert known["clang-afdo-thinlto"].fragments == ("thinlto",) and known["clang-afdo"].kind == "optimized"
    assert variants.validate({"name": "x", "description": "", "compiler": "gcc-12", "opt": "O2", "autofdo": True}) == [
        "autofdo = true is for clang-N compilers (GCC's profile is gcov's: profile = true)"]
    assert any("needs autofdo = true" in p for p in variants.validate({"name": "x", "description": "", "compiler": "clang-19", "opt": "O2",
                                                                        "profile": True}))
    assert any("lto 'full'" in p for p in variants.validate({"name": "x", "description": "", "compiler": "clang-19", "opt": "O2", "lto": "full"}))
    d = tmp_path / "sample"
    d.mkdir()
    (d / "profile.json").write_text(json.dumps({"kind": afdo.SAMPLE_KIND}))
    (d / afdo.PROFILE_FILE).write_text("hot_fn:10:1\n 0: 1\n")
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "optimized", "--profile", d, "-o", tmp_path / "b", "--dry-run"), 1,
                          "is a Clang sample profile")
    g = tmp_path / "gcov"
    g.mkdir()
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "clang-afdo", "--profile", g, "-o", tmp_path / "b", "--dry-run"), 1,
                          "holds no profile.json")
    res = kpgo("build", "--base", "tiny", "--variant", "clang-afdo-thinlto", "--profile", d, "-o", tmp_path / "b", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert f"-fprofile-sample-use={tmp_path / 'b' / afdo.INSTALLED}" in res.stdout and "--lto-sample-profile=" in res.stdout
    assert "text-sections.patch" in res.stdout and "thinlto.config" in res.stdout


def test_promotions_are_read_from_clangs_records(tmp_path: Path) -> None:
    """An indirect call whose samples name a dominant target: Clang promotes it, and the proof lists the site."""
    src = tmp_path / "ic.c"
    src.write_text("typedef int (*fn_t)(int);\n"
                   "__attribute__((noinline)) int tgt_a(int x) { return x + 1; }\n"
                   "__attribute__((noinline)) int tgt_b(int x) { return x * 2; }\n"
                   "fn_t table[2] = { tgt_a, tgt_b };\n"
                   "__attribute__((noinline)) int call_it(int i, int x) { return table[i & 1](x); }\n")
    prof = tmp_path / "p"
    prof.mkdir()
    (prof / afdo.PROFILE_FILE).write_text("call_it:10000:1000\n 0: 1000 tgt_a:990 tgt_b:10\n")
    build = tmp_path / "b"
    build.mkdir()
    subprocess.run([CLANG, "-O2", *afdo.TRAIN_FLAGS, f"-fprofile-sample-use={prof / afdo.PROFILE_FILE}", *afdo.USE_FLAGS, "-c", src,
                    "-o", build / "ic.o"], check=True)
    res = afdo.check(build, prof)
    assert res["ok"] and res["functions_applied"] == 1
    assert res["promoted_calls"] == 1 and res["promoted_across_objects"] == 0
    assert res["promoted_hottest"] == [{"caller": "call_it", "callee": "tgt_a", "count": 990, "of": 1000, "across_objects": False}]
