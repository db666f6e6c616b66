"""BOLT on the kernel (issue 35 part 2, kpgo.kernel.bolt, docs/LAYOUT.md "BOLT"): BOLT's report read from its real
output on the tiny kernel (tests/data/bolt-tiny.log); bad input (branch records for another vmlinux, a profile
whose kernel is gone, the wrong variant) -> one-line errors before anything is built; the variants' rules; the patch
on the real 6.12 source. The kernel test (the tiny kernel BOLTed, booted with a workload) is in test_bolt_vm.py."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from kpgo import branches, variants
from kpgo.errors import UserError
from kpgo.kernel import bolt, codesize, source

DATA = Path(__file__).parent / "data"
needs_gcc = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("readelf")), reason="needs gcc and binutils")


# ---- BOLT's report ----

def test_the_report_of_a_real_bolt_run() -> None:
    """llvm-bolt-19's output on the tiny kernel with the micro workload's records (the run docs/LAYOUT.md shows)."""
    rep = bolt.report((DATA / "bolt-tiny.log").read_text())
    assert rep["linux_kernel"] and not rep["relocation_mode"]
    assert rep["functions"] > 20000 and 0 < rep["functions_profiled"] < rep["functions"]
    assert 0 <= rep["stale_share"] < 1 and rep["functions_stale"] <= rep["functions_profiled"]
    assert rep["cold_bytes_moved"] > 0 and rep["hot_bytes"] > 0 and rep["functions_rewritten"] > 0
    assert rep["functions_reordered"] > 0
    assert rep["dyno_before"]["taken branches"] > 0 and rep["dyno_after"]["taken branches"] > 0


def test_the_report_of_output_without_figures() -> None:
    rep = bolt.report("BOLT-INFO: Target architecture: x86_64\nBOLT-ERROR: split functions require reserved space in the Linux kernel binary\n")
    assert rep["functions_profiled"] == 0 and rep["functions"] is None and rep["cold_bytes_moved"] == 0 and "dyno_after" not in rep


def test_stale_lines_are_read() -> None:
    text = ("BOLT-INFO: 120 out of 22265 functions in the binary (0.5%) have non-empty execution profile\n"
            "BOLT-WARNING: 12 (10.0% of all profiled) functions have invalid (possibly stale) profile. Use -report-stale to see the list.\n"
            "BOLT-WARNING: 500 out of 10000 samples in the binary (5.0%) belong to functions with invalid (possibly stale) profile.\n")
    rep = bolt.report(text)
    assert (rep["functions_profiled"], rep["functions_stale"], rep["stale_share"]) == (120, 12, 0.1)
    assert (rep["samples_stale"], rep["samples"], rep["samples_stale_share"]) == (500, 10000, 0.05)


# ---- bad input, before anything is built ----

def records_file(path: Path, build_id: str, edges: list[tuple[int, int, int, int]]) -> Path:
    """A kernel-side records file as kpgo's plugin writes it (kpgo.branches.read_records), for `build_id`."""
    bid = bytes.fromhex(build_id)
    head = struct.pack("<8s18Q64s", branches.MAGIC, branches.RECORDS_FORMAT, 1, 1000, branches.DEPTH, 1, 1, 0,
                       sum(e[2] for e in edges), 0, 0, 0, 0, 1 << 16, 1 << 12, len(edges), 0, 0, len(bid), bid)
    body = b"".join(struct.pack("<4Q", *e) for e in sorted(edges))
    size = len(head) + len(body) + 16
    path.write_bytes(head + body + struct.pack("<8sQ", branches.END, size))
    return path


@pytest.fixture(scope="module")
def small_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    (d / "p.c").write_text("int f1(int x) { return x + 1; }\nint f2(int x) { return f1(x) * 2; }\nvoid _start(void) { for (;;) f2(3); }\n")
    import subprocess

    subprocess.run(["gcc", "-O1", "-nostdlib", "-static", "-Wl,--build-id", "-o", d / "p", d / "p.c"], check=True)
    return d / "p"


def branch_profile(tmp: Path, elf: Path, records_id: str | None = None, edges: list[tuple[int, int, int, int]] | None = None,
                   **manifest: object) -> Path:
    """A branch profile directory as `kpgo collect --branches` writes it, recorded on `elf` (or so it says)."""
    d = tmp / "prof"
    d.mkdir(parents=True, exist_ok=True)
    bid = branches.build_id_of(elf)
    records_file(d / branches.RECORDS_FILE, records_id or bid, edges or [(0x401000, 0x401010, 5, 1)])
    for name in (branches.BOLT_FILE, branches.PERF_SCRIPT_FILE, branches.CALL_GRAPH_FILE):
        (d / name).write_text("")
    fields = {"kind": branches.PROFILE_KIND, "vmlinux": str(elf), "build_id": bid, **manifest}
    (d / "profile.json").write_text(json.dumps(fields))
    return d


BAD = [
    ("records of another vmlinux", {"records_id": "ab" * 20}, "belong to the binary with build id abab"),
    ("profile of another vmlinux", {"records_id": "cd" * 20, "build_id": "cd" * 20}, "the profile's cdcd"),
    ("kernel gone", {"vmlinux": "/nonexistent/vmlinux", "build_dir": "/nonexistent"}, "is gone"),
    ("not a branch profile", {"kind": "gcov"}, "is not a branch profile"),
]


@needs_gcc
@pytest.mark.parametrize(("what", "spec", "needle"), BAD, ids=[b[0] for b in BAD])
def test_bad_branch_profiles_are_one_line_errors_before_any_build(tmp_path: Path, small_elf: Path, what: str, spec: dict, needle: str) -> None:
    rid = spec.pop("records_id", None)
    d = branch_profile(tmp_path, small_elf, rid, **spec)
    for extra in (["--dry-run"], []):  # a real build fails the same way, before it extracts or configures anything
        res = kpgo("build", "--base", "tiny", "--variant", "bolt", "--branches", d, "-o", tmp_path / "b", *extra)
        assert_one_line_error(res, 1, needle)
        assert not (tmp_path / "b").exists()


@needs_gcc
def test_a_truncated_records_file_is_one_line(tmp_path: Path, small_elf: Path) -> None:
    d = branch_profile(tmp_path, small_elf)
    rec = d / branches.RECORDS_FILE
    rec.write_bytes(rec.read_bytes()[:-5])
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "bolt", "--branches", d, "--dry-run"), 1, "truncated")


@needs_gcc
def test_the_wrong_variant_or_no_branches(tmp_path: Path, small_elf: Path) -> None:
    d = branch_profile(tmp_path, small_elf)
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "bolt", "--dry-run"), 1, "none was given")
    assert_one_line_error(kpgo("build", "--base", "tiny", "--branches", d, "--dry-run"), 1, "--branches is only for")
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "bolt", "--branches", tmp_path / "nope", "--dry-run"), 1, "not found")
    with pytest.raises(UserError, match="has a blank, quote"):
        bolt.check_out(tmp_path / "my builds" / "bolt")


@needs_gcc
def test_the_dry_run_names_the_patch_and_the_step(tmp_path: Path, small_elf: Path) -> None:
    d = branch_profile(tmp_path, small_elf)
    res = kpgo("build", "--base", "tiny", "--variant", "bolt", "--branches", d, "-o", tmp_path / "b", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "bolt.patch" in res.stdout and f"{bolt.MAKE_VAR}={tmp_path / 'b' / bolt.STEP}" in res.stdout and "-reorder-blocks=ext-tsp" in res.stdout


@pytest.fixture(scope="module")
def split_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A program GCC splits as it splits a PGO kernel's functions: work's unlikely path (it calls a cold function)
    goes into work.cold (-freorder-blocks-and-partition, on by default at -O2)."""
    d = tmp_path_factory.mktemp("split")
    (d / "s.c").write_text("__attribute__((cold, noinline)) void oops(int x) { __asm__ volatile(\"\" :: \"r\"(x)); }\n"
                           "__attribute__((noinline)) int work(int x) { if (x > 1000) { oops(x); oops(x + 1); return -1; } return x * 3; }\n"
                           "void _start(void) { for (int i = 0;; i++) work(i); }\n")
    subprocess.run(["gcc", "-O2", "-nostdlib", "-static", "-Wl,--build-id", "-o", d / "s", d / "s.c"], check=True)
    return d / "s"


@needs_gcc
def test_records_of_a_kernel_gcc_split_are_refused_before_the_build(tmp_path: Path, split_elf: Path) -> None:
    """BOLT leaves a function with a NAME.cold part alone on the kernel: records that ran mostly in one are refused,
    naming the kernel to record on instead; records outside such functions pass."""
    fns = {f.name: f for f in codesize.symbols(split_elf).functions}
    assert "work.cold" in fns, "GCC did not split work: the test's program needs another shape for this GCC"
    work, start = fns["work"], fns["_start"]
    d = branch_profile(tmp_path / "a", split_elf, edges=[(start.address + 4, work.address, 10, 1), (work.address + 2, start.address + 9, 90, 1)])
    assert bolt.split_functions(bolt.per_function(bolt.recording(d))) == {"functions": 1, "ran": 1, "share": 0.9, "hottest": ["work"]}
    res = kpgo("build", "--base", "tiny", "--variant", "bolt", "--branches", d, "-o", tmp_path / "b", "--dry-run")
    assert_one_line_error(res, 1, "split into hot and cold parts")
    assert "pgo-nosplit" in res.stderr and "90.0%" in res.stderr
    assert not (tmp_path / "b").exists()
    d = branch_profile(tmp_path / "c", split_elf, edges=[(start.address + 4, work.address, 10, 1)])
    assert bolt.split_functions(bolt.per_function(bolt.recording(d)))["share"] == 0
    assert kpgo("build", "--base", "tiny", "--variant", "bolt", "--branches", d, "-o", tmp_path / "b", "--dry-run").returncode == 0


# ---- the variants and the patch ----

def test_the_bolt_variants() -> None:
    b, pb = variants.get("bolt"), variants.get("pgo-bolt")
    assert b.bolt and pb.bolt and pb.profile and not b.profile and not b.order
    # the PGO one builds without GCC's hot/cold split, as does the kernel its records come from
    ns = variants.get("pgo-nosplit")
    assert variants.NO_SPLIT in pb.flags and variants.NO_SPLIT in ns.flags and ns.profile and not ns.bolt
    assert ns.bolt_base and not pb.bolt_base  # from pgo-bolt's patched source: the same path, the same code
    assert "BOLTed" in b.summary()


@pytest.mark.parametrize(("spec", "needle"), [
    ({"bolt": True, "gcov": True}, "bolt = true with gcov = true"),
    ({"bolt": True, "order": True, "flags": ["-ffunction-sections"]}, "bolt = true with order = true"),
    ({"bolt": True, "compiler": "clang-19"}, "bolt = true with clang"),
    ({"bolt": "yes"}, "bolt should be of type bool"),
    ({"bolt": True, "profile": True}, "flags need -fno-reorder-blocks-and-partition"),
    ({"bolt": True, "bolt_base": True}, "bolt_base = true is for the GCC kernel"),
    ({"bolt_base": True, "compiler": "clang-19"}, "bolt_base = true is for the GCC kernel"),
])
def test_bolt_variant_files_are_validated(spec: dict, needle: str) -> None:
    base = {"name": "mine", "description": "x", "compiler": "gcc-12", "opt": "O2"}
    assert any(needle in p for p in variants.validate(base | spec)), variants.validate(base | spec)


def test_the_kernel_bolt_rewrites_is_built_from_the_same_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pgo-nosplit (bolt_base) builds from BOLT's patched copy as pgo-bolt does (GCC's code with a profile changes with
    the source's path); optimized from the source itself."""
    from dataclasses import replace

    from kpgo.kernel import kbuild, kconfig

    monkeypatch.setattr(bolt, "patched", lambda s: replace(s, ident=f"{s.ident}+bolt.patch"))
    src = source.KernelSource(tmp_path / "linux", "6.12.0", "stand-in")
    spec = kconfig.resolve("tiny", None, [])
    built = {n: kbuild._patched(kbuild.BuildRequest(src, spec, variants.get(n), tmp_path / n)).source.ident
             for n in ("pgo-nosplit", "pgo-bolt", "optimized", "bolt")}
    assert built == {"pgo-nosplit": "stand-in+bolt.patch", "pgo-bolt": "stand-in+bolt.patch", "optimized": "stand-in", "bolt": "stand-in+bolt.patch"}


def test_the_patch_names_the_files_it_changes() -> None:
    assert set(source.patch_files(bolt.PATCH)) == {"arch/x86/Makefile", "arch/x86/kernel/Makefile", "arch/x86/kernel/vmlinux.lds.S",
                                                  "scripts/link-vmlinux.sh"}


@pytest.mark.skipif(not source.DEFAULT_TARBALL.exists(), reason="needs linux-source-6.12 (make setup)")
def test_the_patch_applies_to_a_copy_and_leaves_the_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    real = source.resolve(None)
    files = source.patch_files(bolt.PATCH)
    before = {rel: (real.path / rel).read_bytes() for rel in files}
    patched = bolt.patched(real)
    assert "__bolt_reserved_start" in (patched.path / "arch/x86/kernel/vmlinux.lds.S").read_text()
    assert bolt.MAKE_VAR in (patched.path / "scripts/link-vmlinux.sh").read_text()
    for rel, data in before.items():
        assert (real.path / rel).read_bytes() == data != (patched.path / rel).read_bytes()


# ---- which kernel booted: the guest agent reads its build id ----

def notes(*entries: tuple[bytes, int, bytes]) -> bytes:
    """ELF notes as /sys/kernel/notes shows them: name, type, descriptor, each padded to 4 bytes."""
    out = b""
    for name, kind, desc in entries:
        out += struct.pack("<3I", len(name), len(desc), kind) + name.ljust((len(name) + 3) // 4 * 4, b"\0") + desc.ljust((len(desc) + 3) // 4 * 4, b"\0")
    return out


@pytest.mark.parametrize(("data", "want"), [
    (notes((b"Linux\0", 0x101, b"\1\0\0\0\0\0"), (b"GNU\0", 3, bytes(range(20)))), bytes(range(20)).hex()),
    (notes((b"Xen\0", 3, b"abcd")), None),
    (b"", None),
])
def test_the_agent_reads_the_running_kernels_build_id(data: bytes, want: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins
    import io

    from kpgo.guest import agent

    real = builtins.open
    monkeypatch.setattr(builtins, "open", lambda p, *a, **k: io.BytesIO(data) if p == "/sys/kernel/notes" else real(p, *a, **k))
    assert agent.kernel_build_id() == want



@pytest.mark.parametrize("ran", ["the build's", "another", None])
def test_a_boot_must_run_the_builds_own_kernel(ran: str | None, small_elf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every boot checks the build id the guest reports against the vmlinux of the image's build directory: a bzImage
    holding another kernel (ccache once gave one the kernel of an earlier build) fails the boot in one line, naming
    both ids; a guest that reports none (no /sys/kernel/notes) passes."""
    import json
    import shutil

    from conftest import workload
    from kpgo import proc, vm
    from kpgo.errors import InfraError
    from kpgo.guest import contract

    build = tmp_path / "build"
    image = build / "arch" / "x86" / "boot" / "bzImage"
    image.parent.mkdir(parents=True)
    image.write_bytes(b"a kernel image")
    shutil.copy(small_elf, build / "vmlinux")
    own = branches.build_id_of(build / "vmlinux")
    said = {"the build's": own, "another": "ab" * 20, None: None}[ran]

    def boot(kernel: Path, rundir: Path, *args: object, **kw: object) -> proc.Result:
        (rundir / "result.json").write_text(json.dumps(contract.Result(ok=True, mode="bench", kernel="6.12", build_id=said).to_json()))
        return proc.Result(argv=[], returncode=0, output="", seconds=1.0, timed_out=False)

    monkeypatch.setattr(vm, "_run_agent", boot)
    job = contract.Job(mode="bench", workload=workload("w", client="guest"))
    (tmp_path / "guest").mkdir()
    run = lambda: vm.run_agent(image, tmp_path / "guest", job, guest=vm.Guest(), log=tmp_path / "console.log", accel="tcg")  # noqa: E731
    assert vm.vmlinux_beside(image) == (build / "vmlinux").resolve() and vm.vmlinux_beside(small_elf) is None
    if ran == "another":
        with pytest.raises(InfraError, match=f"build id {said}, not .*vmlinux's {own}") as e:
            run()
        assert "its bzImage does not hold its vmlinux" in (e.value.hint or "")
    else:
        assert run().build_id == said

# ---- x86 runtime constants: boot-time patch sites BOLT 19 does not rewrite ----

RUNTIME_CONST_ASM = """
	.text
	.globl f, g
	.type f, @function
f:	nop
	movabs $0x0123456789abcdef, %rax
1:	shrl $12, %eax
2:	ret
	.size f, . - f
	.type g, @function
g:	ret
	.size g, . - g
	.pushsection runtime_ptr_x, "a"
	.long 1b - 8 - .
	.popsection
	.pushsection runtime_shift_y, "a"
	.long 2b - 1 - .
	.popsection
"""


@pytest.fixture
def const_elf(tmp_path: Path) -> Path:
    """A linked x86-64 ELF whose function f holds a runtime_ptr and a runtime_shift site, as the kernel's do."""
    src, obj, elf = tmp_path / "c.S", tmp_path / "c.o", tmp_path / "c.elf"
    src.write_text(RUNTIME_CONST_ASM)
    subprocess.run(["gcc", "-c", "-o", obj, src], check=True)
    subprocess.run(["ld", "-e", "f", "-o", elf, obj], check=True)
    return elf


@needs_gcc
def test_runtime_const_sites_are_read(const_elf: Path) -> None:
    elf = bolt._Elf(const_elf)
    sites = sorted(bolt.runtime_const_sites(elf), key=lambda s: s.address)
    assert [(s.section, s.width) for s in sites] == [("runtime_ptr_x", 8), ("runtime_shift_y", 1)]
    assert elf.at(sites[0].address, 8) == (0x0123456789ABCDEF).to_bytes(8, "little") and elf.at(sites[1].address, 1) == b"\x0c"


@needs_gcc
def test_a_function_whose_code_before_a_site_changed_is_skipped_again(const_elf: Path, tmp_path: Path) -> None:
    """What BOLT did to ___d_drop: the code before the site changed, so the kernel would write into other bytes."""
    skip = tmp_path / "skip"
    assert bolt.moved_sites(const_elf, const_elf) == [] and bolt._main(["sites", str(const_elf), str(const_elf), str(skip)]) == 0
    elf = bolt._Elf(const_elf)
    _, off, _ = elf.sections[".text"]
    data = bytearray(elf.data)  # the nop at f's first byte (f starts the text) becomes an int3
    assert data[off] == 0x90
    data[off] = 0xCC
    post = tmp_path / "post.elf"
    post.write_bytes(bytes(data))
    moved = bolt.moved_sites(const_elf, post)
    assert sorted(n for _, n in moved) == ["f", "f"]
    assert bolt._main(["sites", str(const_elf), str(post), str(skip)]) == bolt.EXIT_SKIP_MORE
    assert skip.read_text() == "f(/.*)?\n"
    assert bolt._main(["sites", str(const_elf), str(post), str(skip)]) == 1  # f is skipped already: BOLT did not obey


def test_skip_patterns_escape_the_name() -> None:
    assert bolt.skip_pattern("foo.constprop.0") == r"foo\.constprop\.0(/.*)?"


# ---- boot-time patch lists of whole instructions, written again for BOLT's code ----

# A kernel in small: f returns through the return thunk, calls through a retpoline thunk and directly, starts with an
# ENDBR; g likewise, and BOLT leaves it alone (jumps with 32-bit displacements, as the kernel's are). objtool's four
# lists name those instructions. BOLT's f (POST_F) keeps its hot path in place and moves the cold one (the thunk call
# and its return) into .bolt.text as f.cold.0.
LISTS_HEAD = """
	.globl f, g, h, __x86_return_thunk, __x86_indirect_thunk_rax
	.text
	.type f, @function
f:
"""
PRE_F = """	endbr64
r1:	call h
	test %eax, %eax
	jne 1f
r2:	.byte 0x2e  # GCC's -mindirect-branch-cs-prefix
	call __x86_indirect_thunk_rax
r3:	{disp32} jmp __x86_return_thunk
1:
r4:	call h
r5:	{disp32} jmp __x86_return_thunk
"""
POST_F = """	endbr64
	call h
	test %eax, %eax
	je f.cold.0
	call h
	{disp32} jmp __x86_return_thunk
"""
LISTS_TAIL = """	.skip 64 - (. - f), 0xcc
	.size f, . - f
	.type g, @function
g:	endbr64
g1:	call h
g2:	{disp32} jmp __x86_return_thunk
	.size g, . - g
	.type h, @function
h:	ret
	.size h, . - h
	.type __x86_return_thunk, @function
__x86_return_thunk: ret
	int3
	.size __x86_return_thunk, . - __x86_return_thunk
	.type __x86_indirect_thunk_rax, @function
__x86_indirect_thunk_rax: jmp *%rax
	.size __x86_indirect_thunk_rax, . - __x86_indirect_thunk_rax
	.section .bolt.text, "ax"
"""
PRE_COLD = "	.skip 32, 0xcc\n"
POST_COLD = """	.type f.cold.0, @function
f.cold.0:
	call __x86_indirect_thunk_rax  # BOLT 19 drops the CS prefix
	{disp32} jmp __x86_return_thunk
	.size f.cold.0, . - f.cold.0
	.skip 32 - (. - f.cold.0), 0xcc
"""
PRE_LISTS = """	.section .return_sites, "a"
	.long r3 - ., r5 - ., g2 - .
	.section .retpoline_sites, "a"
	.long r2 - .
	.section .call_sites, "a"
	.long r1 - ., r4 - ., g1 - .
	.section .ibt_endbr_seal, "a"
	.long f - ., g - .
"""
POST_LISTS = PRE_LISTS.replace("r1", "f").replace("r2", "f").replace("r3", "f").replace("r4", "f").replace("r5", "f")


def link(tmp: Path, name: str, text: str) -> Path:
    src, obj, elf = tmp / f"{name}.S", tmp / f"{name}.o", tmp / name
    src.write_text(text)
    subprocess.run(["gcc", "-c", "-o", obj, src], check=True)
    subprocess.run(["ld", "-e", "f", "-Ttext=0x401000", "--section-start=.bolt.text=0x408000", "-o", elf, obj], check=True)
    return elf


def bolted(tmp: Path, pre: Path, f_text: str = POST_F) -> Path:
    """BOLT's output of `pre`: f rewritten (its code `f_text`, in place and in .bolt.text), the lists as they were."""
    post = link(tmp, "post", LISTS_HEAD + f_text + LISTS_TAIL + POST_COLD + POST_LISTS)
    a, b = bolt._Elf(pre), bolt._Elf(post)
    data = bytearray(b.data)
    for name in bolt.PATCH_LISTS:  # BOLT copies the lists unchanged
        (addr, off, size), (addr2, off2, size2) = a.sections[name], b.sections[name]
        assert (addr, size) == (addr2, size2)
        data[off2:off2 + size2] = a.data[off:off + size]
    post.write_bytes(bytes(data))
    return post


@pytest.fixture
def lists_pre(tmp_path: Path) -> Path:
    return link(tmp_path, "pre", LISTS_HEAD + PRE_F + LISTS_TAIL + PRE_COLD + PRE_LISTS)


def addr_of(elf: Path, name: str) -> int:
    return next(f.address for f in codesize.symbols(elf).functions if f.name == name)


@needs_gcc
def test_patch_lists_are_written_again_for_the_code_bolt_moved(lists_pre: Path, tmp_path: Path) -> None:
    pre = lists_pre
    assert bolt.check_lists(bolt._Elf(pre)) == {n: {"entries": e, "valid": e} for n, e in
                                                ((".return_sites", 3), (".retpoline_sites", 1), (".call_sites", 3), (".ibt_endbr_seal", 2))}
    post = bolted(tmp_path, pre)
    stale = bolt.check_lists(bolt._Elf(post))
    assert stale[".return_sites"]["valid"] < 3 and stale[".retpoline_sites"]["valid"] == 0  # what BOLT 19 leaves
    skip = tmp_path / "skip"
    assert bolt._main(["sites", str(pre), str(post), str(skip)]) == 0
    assert bolt.check_lists(bolt._Elf(post)) == bolt.check_lists(bolt._Elf(pre))
    lists = bolt.patch_lists(bolt._Elf(post))
    cold, f, g = addr_of(post, "f.cold.0"), addr_of(post, "f"), addr_of(post, "g")
    assert lists[".retpoline_sites"] == [cold]  # the thunk call BOLT moved out
    assert sorted(lists[".return_sites"]) == sorted([f + 4 + 5 + 2 + 6 + 5, cold + 5, g + 4 + 5])  # g's stays as it was
    assert lists[".ibt_endbr_seal"] == [f, g] and bolt.patch_lists(bolt._Elf(pre))[".call_sites"][2] == lists[".call_sites"][2]
    assert not skip.exists() or skip.read_text() == ""


@needs_gcc
def test_a_function_whose_listed_instructions_bolt_changed_is_skipped(lists_pre: Path, tmp_path: Path) -> None:
    """BOLT's f calls h three times where it called it twice: which call is which entry? f is left to BOLT's skip
    list, and BOLT runs again."""
    post = bolted(tmp_path, lists_pre, POST_F.replace("\tcall h\n", "\tcall h\n\tcall h\n", 1))
    rw = bolt.rewrite_lists(lists_pre, post)
    assert list(rw.unmatched) == ["f"] and "3 call instructions" in rw.unmatched["f"]
    skip = tmp_path / "skip"
    assert bolt._main(["sites", str(lists_pre), str(post), str(skip)]) == bolt.EXIT_SKIP_MORE
    assert skip.read_text() == "f(/.*)?\n"
    assert bolt._main(["sites", str(lists_pre), str(post), str(skip)]) == 1  # skipped, yet changed: BOLT did not obey


@needs_gcc
def test_functions_with_a_hlt_are_left_to_the_skip_list(tmp_path: Path) -> None:
    """BOLT 19 takes HLT for the end of a path; the kernel's default_idle goes on after it (`sti; hlt; cli; ret`): the
    step names every function holding one in BOLT's skip list before the first pass."""
    elf = link(tmp_path, "idle", """
	.globl f, idle
	.text
	.type f, @function
f:	ret
	.size f, . - f
	.type idle, @function
idle:	sti
	hlt
	cli
	ret
	.size idle, . - idle
	.section .bolt.text, "ax"
	int3
""")
    assert bolt.halting_functions(elf) == ["idle"]
    skip = tmp_path / "skip"
    assert bolt._main(["halting", str(elf), str(skip)]) == 0 and skip.read_text() == "idle(/.*)?\n"
