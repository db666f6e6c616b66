"""BOLT on the kernel (issue 35 part 2; docs/LAYOUT.md "BOLT").

From the branch records kpgo takes from the emulator (`kpgo collect BUILD --branches`, kpgo.branches), BOLT 19
(Debian's bolt-19) rewrites vmlinux: blocks in the order ext-tsp gives, each profiled function split into a hot
part, left where the function was, and a cold part, moved into room the linker script keeps at the end of the text.

What BOLT needs from a 6.12 build, and how kpgo gives it (kernel/bolt/bolt.patch, on a cached copy of the source):
- the relocations kept in vmlinux (--emit-relocs; arch/x86/Makefile.postlink strips them, so BOLT runs before it);
- room for the code it moves: __bolt_reserved_start/__bolt_reserved_end, last in the text, so that no function
  moves and the records of a kernel linked without the patch still name the same code;
- a vmlinux with __ksymtab and __ksymtab_gpl sections: BOLT 19 reads them unchecked and dies of a segmentation
  fault where they are missing (a kernel without modules exports nothing, and ld drops the empty sections); kpgo
  adds empty ones to BOLT's input;
- BOLT's hands off the x86 runtime constants (runtime_ptr_*/runtime_shift_* sections, patched at boot), which BOLT
  19 does not rewrite: the step compares BOLT's output with its input and runs BOLT again without the functions whose
  sites it changed (the tiny kernel died in ___d_drop, where the kernel wrote a pointer into the moved code);
- the lists of whole instructions the kernel patches at boot (returns under RETHUNK, retpoline calls, direct calls
  under call-depth tracking, ENDBRs to seal under IBT), which BOLT 19 leaves pointing into the code it rewrote: kpgo
  finds each listed instruction again in BOLT's code and writes the lists again (PATCH_LISTS, rewrite_lists).
BOLT 19 turns its relocation mode off for the Linux kernel ("disabling relocation mode for Linux kernel"), and
without it refuses -reorder-functions ("function reordering only works when relocations are enabled"): it keeps
every function where it is. Function order on the kernel is kpgo.kernel.order's (variants order, pgo-order).

The records become BOLT's profile before anything is built: kpgo writes them as BOLT's pre-aggregated profile without
the interrupts and exceptions (edges from an instruction that is not a branch: with them BOLT took 98 hot functions'
profiles for stale, 18.4% of the samples, on the tiny kernel under micro; without them none), perf2bolt reads it
against the kernel they were recorded on and writes a profile that names functions and offsets (fdata), which BOLT then matches
to the functions of the kernel being built; what no longer matches it reports as stale. After the link, the step
kpgo writes into the build directory (STEP, run by the patched scripts/link-vmlinux.sh) runs llvm-bolt on vmlinux.
BOLT flips a bit of the build id: the BOLTed vmlinux, and the kernel the bzImage boots, have a build id of their own.

API
    recording(path) -> Recording            the branch profile, its kernel, checked (one-line errors)
    require_unsplit(recording) -> dict      refuses records whose kernel GCC split (BOLT cannot use those functions)
    per_function(recording) -> (fns, n)     the records' taken branches per function, for the two below
    split_functions(...) / reserve_bytes(...) the split functions that ran; the room BOLT's moved code gets
    to_fdata(recording, out) -> dict        perf2bolt's profile and what it said
    write_step(out, fdata) -> Path          the command link-vmlinux.sh runs
    report(log) -> dict                     BOLT's own figures from its output
    moved_sites(pre, post) -> list          runtime-constant sites whose code BOLT changed (`python -m kpgo.kernel.bolt sites`)
    rewrite_lists(pre, post) -> ListsRewrite where BOLT put the instructions of the boot-time patch lists
    check(out, ...) -> dict                 build.json's "bolt"; enforce() fails the build below the thresholds
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
import shlex
import struct
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kpgo import proc
from kpgo.errors import InfraError, UserError
from kpgo.kernel import codesize, source
from kpgo.kernel.source import KernelSource

HERE = Path(__file__).parent
PATCH = HERE / "bolt" / "bolt.patch"
MAKE_VAR = "KPGO_BOLT"  # the command the patched link-vmlinux.sh runs on vmlinux
RESERVE_VAR = "KPGO_BOLT_RESERVE"  # bytes the patched linker script keeps for BOLT
LLVM_BOLT = "llvm-bolt-19"
# /usr/bin/perf2bolt-19 is llvm-bolt under another name (BOLT picks its mode from its own name): the real one is here.
PERF2BOLT = Path("/usr/lib/llvm-19/bin/perf2bolt")
PACKAGE = "bolt-19"
STEP = "bolt-step.sh"  # in the build directory: what link-vmlinux.sh runs
FDATA = "bolt.fdata"  # perf2bolt's profile of the records
PREAGG = "bolt.preagg"  # the records as BOLT's pre-aggregated profile, branches only
PERF2BOLT_LOG = "perf2bolt.log"
LOG = "bolt.log"  # llvm-bolt's output
PRE_BOLT = "vmlinux.pre-bolt"  # the linked kernel as BOLT got it
VERSION = 5  # of the options and the step: part of the build key
# BOLT's options. Its Linux guide's set: blocks by ext-tsp, hot/cold splitting (into the reserved room), no
# unreachable-code elimination or conditional tail calls (code the kernel patches at run time must stay), and the
# entry text left alone (its symbols mark addresses the kernel computes with).
OPTIONS = (
    "-reorder-blocks=ext-tsp",
    "-split-functions",
    "-split-strategy=profile2",
    "-eliminate-unreachable=0",
    "-simplify-conditional-tail-calls=0",
    "-skip-funcs=__entry_text_start,irq_entries_start",
    "-dyno-stats",
)
RESERVE_MIN = 2 << 20
# The build fails when BOLT finds no profiled function, or when less than this share of the profile's samples lands
# in functions whose profile still matches their code (stale ones BOLT ignores).
MIN_VALID_SHARE = 0.9
KSYMTABS = ("__ksymtab", "__ksymtab_gpl")
# x86 runtime constants (Linux 6.11+, arch/x86/include/asm/runtime-const.h; no config turns them off): each section
# runtime_ptr_SYM / runtime_shift_SYM lists, as 32-bit self-relative offsets, immediates in the text that the kernel
# overwrites at boot (runtime_const_init): the 8 bytes of `mov $0x0123456789abcdef, REG`, the byte 12 of `shrl $12, REG`.
# BOLT 19's LinuxKernelRewriter does not read these sections: where it rewrites a function holding a site, the kernel
# then writes its pointer into whatever BOLT put at the old address (the tiny kernel died of it in ___d_drop). The step
# skips those functions (SKIP_FILE) and runs BOLT again; check() proves every site intact in the output.
RUNTIME_CONST_PREFIXES = {"runtime_ptr_": 8, "runtime_shift_": 1}  # section prefix -> bytes the kernel writes at a site
SKIP_FILE = "bolt-skip-funcs"  # in the build directory: regexes of the functions BOLT must leave alone
PASSES = 3  # BOLT runs at most this often: every pass may only add functions to SKIP_FILE
EXIT_SKIP_MORE = 3  # `python -m kpgo.kernel.bolt sites`: functions added, run BOLT again


def tools_missing() -> list[str]:
    return [t for t in (LLVM_BOLT, str(PERF2BOLT)) if proc.which(t) is None]


def require_tools() -> None:
    missing = tools_missing()
    if missing:
        raise UserError(f"the BOLT variants need BOLT 19 ({', '.join(missing)} not found)", f"apt-get install {PACKAGE} (`make setup` installs it)")


# ---- the input: a branch profile and the kernel it was recorded on ----

@dataclass(frozen=True)
class Recording:
    dir: Path
    preagg: Path  # BOLT's pre-aggregated profile (kpgo.branches.BOLT_FILE)
    vmlinux: Path  # the kernel it was recorded on
    build_id: str


def recording(path: Path) -> Recording:
    """The branch profile directory at `path` (from `kpgo collect BUILD --branches`) and the kernel it was recorded on,
    which its profile.json names. Records made for another vmlinux than that one (their build id differs), a truncated
    records file, a missing file: one-line UserErrors, before anything is built."""
    from kpgo import branches

    path = Path(path).resolve()
    hint = "pass the directory `kpgo collect BUILD_DIR --branches` wrote"
    if not path.is_dir():
        raise UserError(f"branch profile {path} not found" if not path.exists() else f"{path} is not a branch profile directory", hint)
    info = branches.read_profile(path)  # the records against the manifest's build id; every file present
    vmlinux, have = branches.recorded_kernel(info, f"the branch profile {path}")
    if info.get("records", {}).get("side") != "kernel":
        raise UserError(f"the branch profile {path} holds user-space branches, not the kernel's", hint)
    return Recording(path, path / branches.BOLT_FILE, vmlinux, have)


def input_digest(r: Recording) -> str:
    """What a build key holds of BOLT: the profile's bytes, its kernel, BOLT's options and version."""
    h = hashlib.sha256()
    h.update(json.dumps({"version": VERSION, "options": OPTIONS, "build_id": r.build_id, "bolt": bolt_version()}).encode())
    h.update(r.preagg.read_bytes())
    return h.hexdigest()[:16]


def bolt_version() -> str:
    """llvm-bolt's LLVM version ("19.1.7"), or "" without it."""
    if proc.which(LLVM_BOLT) is None:
        return ""
    m = re.search(r"LLVM version (\S+)", proc.capture([LLVM_BOLT, "--version"]))
    return m.group(1) if m else ""


def patched(src: KernelSource) -> KernelSource:
    """The cached copy of `src` with kpgo's BOLT patch (kpgo.kernel.source.patched_copy)."""
    return source.patched_copy(src, PATCH, "bolt", "kpgo's BOLT patch",
                               "BOLT needs Linux 6.12's x86 build scripts (the default source); build without it on this tree")


# ---- before the build: the records as BOLT's profile ----

def _has_ksymtabs(elf: Path) -> bool:
    names = set(re.findall(r"\]\s+(\S+)", proc.capture(["readelf", "-SW", elf], timeout=120)))
    return all(s in names for s in KSYMTABS)


def _ksymtab_args() -> list[str]:
    """objcopy's arguments that add empty __ksymtab sections (BOLT 19 crashes without them)."""
    args: list[str] = []
    for s in KSYMTABS:
        args += ["--add-section", f"{s}=/dev/null", "--set-section-flags", f"{s}=alloc,readonly"]
    return args


def bolt_input(elf: Path, dest: Path) -> Path:
    """`elf` as BOLT 19 can read it: itself, or a copy at `dest` with empty __ksymtab sections."""
    if _has_ksymtabs(elf):
        return elf
    proc.run(["objcopy", *_ksymtab_args(), elf, dest], what="objcopy (empty __ksymtab for BOLT)")
    return dest


# GCC's name for the part of a function it split off under a profile (-freorder-blocks-and-partition); BOLT's own are
# NAME.cold.N. On the kernel BOLT 19 has no relocation mode, where a function with such a part is not simple: BOLT keeps
# its code and drops its profile (the records of its traces count as mismatching). Records whose kernel split more than
# this share of their taken branches are refused before the build (kpgo.variants.NO_SPLIT, pgo-nosplit).
_GCC_COLD = re.compile(r"(.+)\.cold")
MAX_SPLIT_SHARE = 0.02


def per_function(r: Recording) -> tuple[Any, Any]:
    """The recorded kernel's functions (kpgo.branches.Functions) and the records' taken branches in each: what
    split_functions and reserve_bytes read (the records and the symbol table, once for both)."""
    from kpgo import branches

    records = branches.read_records(r.dir / branches.RECORDS_FILE, r.build_id)
    fns = branches.Functions(r.vmlinux)
    return fns, branches.function_branches(records, fns)


def split_functions(ran: tuple[Any, Any]) -> dict[str, Any]:
    """The functions of the recorded kernel GCC split into a hot part and NAME.cold that ran under the records, and
    their share of the records' taken branches (either part); `ran` is per_function's."""
    fns, per = ran
    parents = {m.group(1) for n in fns.names if (m := _GCC_COLD.fullmatch(n))}
    family: dict[str, float] = {}
    for name, n in zip(fns.names, per.tolist()):
        m = _GCC_COLD.fullmatch(name)
        if m or name in parents:
            key = m.group(1) if m else name
            family[key] = family.get(key, 0.0) + n
    hot = sorted((k for k, n in family.items() if n > 0), key=lambda k: -family[k])
    total = float(per.sum()) or 1.0
    return {"functions": len(parents), "ran": len(hot), "share": round(sum(family.values()) / total, 6), "hottest": hot[:5]}


def require_unsplit(r: Recording) -> dict[str, Any]:
    """split_functions of r's records, or a one-line UserError when BOLT would have to leave more than MAX_SPLIT_SHARE of the
    records unused for it."""
    split = split_functions(per_function(r))
    if split["share"] > MAX_SPLIT_SHARE:
        raise UserError(f"the branch profile {r.dir} was recorded on a kernel whose functions GCC split into hot and cold parts: "
                        f"{split['ran']:,} of them ran ({', '.join(split['hottest'][:3])}, ...), holding {split['share']:.1%} of its "
                        "taken branches, which BOLT cannot use on the kernel",
                        "record on a kernel built with -fno-reorder-blocks-and-partition: for pgo-bolt, "
                        "`kpgo build --variant pgo-nosplit --profile P` (docs/LAYOUT.md, \"BOLT on a PGO kernel\")")
    return split


_P2B_MISMATCH = re.compile(r"traces mismatching disassembled function contents: (\d+) \(([\d.]+)%\)")
_P2B_ENTRIES = re.compile(r"read (\d+) aggregated (?:LBR|branch) entries")
_P2B_OBJECTS = re.compile(r"wrote (\d+) objects")
_PROFILED = re.compile(r"(\d+) out of (\d+) functions in the binary \(([\d.]+)%\) have non-empty execution profile")


def to_fdata(r: Recording, out: Path) -> dict[str, Any]:
    """perf2bolt -pa over the records against the kernel they were recorded on: FDATA in `out` (names and offsets,
    which BOLT matches to the kernel being built) and what perf2bolt said of them."""
    require_tools()
    out.mkdir(parents=True, exist_ok=True)
    src = bolt_input(r.vmlinux, out / "vmlinux.recorded")
    log = out / PERF2BOLT_LOG
    fdata = out / FDATA
    dropped = write_preagg(r, out / PREAGG)
    res = proc.run([PERF2BOLT, "-pa", "-p", out / PREAGG, "-o", fdata, src], log=log, check=False, keep_output=True, timeout=1800)
    if src != r.vmlinux:
        src.unlink(missing_ok=True)
    text = res.output
    if res.returncode != 0 or not fdata.is_file():
        err = next((ln for ln in text.splitlines() if "ERROR" in ln or "error" in ln), (text.strip().splitlines() or ["(no output)"])[-1])
        raise InfraError(f"perf2bolt could not read the branch records {r.preagg}: {err.strip()[:200]}", f"full log: {log}")
    m, e, o, p = _P2B_MISMATCH.search(text), _P2B_ENTRIES.search(text), _P2B_OBJECTS.search(text), _PROFILED.search(text)
    return {
        **dropped,
        "entries": int(e.group(1)) if e else None,
        "mismatching_traces": int(m.group(1)) if m else None,
        "mismatching_share": round(float(m.group(2)) / 100, 6) if m else None,
        "entries_written": int(o.group(1)) if o else None,
        "functions_profiled": int(p.group(1)) if p else None,
        "log": str(log),
    }


def write_preagg(r: Recording, out: Path) -> dict[str, Any]:
    """BOLT's pre-aggregated profile of the records (kpgo.branches.write_bolt's lines) without the edges whose source
    is not a branch: interrupts and exceptions, which LBR records too but which BOLT, finding a branch at an
    instruction that is none, counts against the whole function's profile (stale). Returns what was left out."""
    from kpgo import branches

    records = branches.read_records(r.dir / branches.RECORDS_FILE, r.build_id)
    kinds = records.edges[:, 3]
    keep = kinds != int(branches.Kind.NONE)
    lines = [f"B {a:x} {b:x} {c} 0" for a, b, c, _ in records.edges[keep].tolist()]
    ok = records.ranges[:, 0] <= records.ranges[:, 1]
    lines += [f"F {a:x} {b:x} {c}" for a, b, c in records.ranges[ok].tolist()]
    out.write_text("".join(ln + "\n" for ln in lines))
    total = int(records.edges[:, 2].sum()) or 1
    return {"interrupt_edges_left_out": int((~keep).sum()), "interrupt_share_left_out": round(int(records.edges[~keep, 2].sum()) / total, 6)}


def reserve_bytes(ran: tuple[Any, Any]) -> int:
    """The room kept for BOLT: the size of the recorded kernel's functions that ran (their cold parts go there, and
    never more than the whole function), rounded up to 2 MiB; `ran` is per_function's."""
    fns, per = ran
    hit = per.nonzero()[0]
    size = int((fns.ends[hit] - fns.starts[hit]).sum()) if len(hit) else 0
    return max(RESERVE_MIN, -(-size // RESERVE_MIN) * RESERVE_MIN)


_UNSAFE = re.compile(r"[\s\"'$\\]")


def check_out(out: Path) -> None:
    """The build directory can hold the step: its path goes through make and the shell unquoted."""
    if _UNSAFE.search(str(out.resolve())):
        raise UserError(f"the build directory {out.resolve()} has a blank, quote, $ or backslash in its path, which the BOLT step "
                        "cannot be run from", "choose an -o without them")


def write_step(out: Path, fdata: Path) -> Path:
    """The shell script the patched link-vmlinux.sh runs on vmlinux (in the build directory, its argument `vmlinux`):
    keeps the linked kernel as PRE_BOLT, runs llvm-bolt into a new file, again without the functions whose
    runtime-constant sites it changed (SKIP_FILE, at most PASSES runs), and puts it in vmlinux's place. A failure
    fails the link with BOLT's first error line (its output is in LOG)."""
    check_out(out)
    out = out.resolve()
    bolt = proc.which(LLVM_BOLT) or LLVM_BOLT
    opts = " ".join(shlex.quote(o) for o in OPTIONS)
    python, pypath = shlex.quote(sys.executable), shlex.quote(str(Path(__file__).resolve().parents[2]))  # this kpgo
    ksym = " ".join(shlex.quote(a) for a in _ksymtab_args())
    text = f"""#!/bin/sh
# kpgo BOLT step (kpgo/kernel/bolt.py), written for this build: scripts/link-vmlinux.sh runs it on vmlinux.
set -e
v="$1"
cp "$v" {out}/{PRE_BOLT}
in={out}/{PRE_BOLT}
# BOLT 19 dies of a segmentation fault on a kernel without __ksymtab sections (no modules): give it empty ones.
if ! readelf -SW "$in" | grep -q ' __ksymtab_gpl '; then
	objcopy {ksym} "$in" {out}/vmlinux.bolt-in
	in={out}/vmlinux.bolt-in
fi
# BOLT 19 does not rewrite the runtime-constant sites: functions holding one that BOLT changed are skipped, and BOLT
# runs again (kpgo.kernel.bolt.RUNTIME_CONST_PREFIXES); nor the lists of returns, retpoline calls, direct calls and
# ENDBRs patched at boot: kpgo writes them again for BOLT's code (PATCH_LISTS), or skips what it cannot find again.
: > {out}/{SKIP_FILE}
# BOLT 19 takes HLT for the end of a path; in the kernel code runs on after it (kpgo.kernel.bolt.halting_functions)
if ! PYTHONPATH={pypath} {python} -m kpgo.kernel.bolt halting "$in" {out}/{SKIP_FILE} > {out}/{LOG}.halting 2>&1; then
	echo "kpgo: finding the functions with a HLT failed: $(tail -n1 {out}/{LOG}.halting)" >&2
	exit 1
fi
pass=1
while :; do
	if ! {bolt} "$in" -o {out}/vmlinux.bolted -data={fdata} {opts} -skip-funcs-file={out}/{SKIP_FILE} > {out}/{LOG} 2>&1; then
		echo "kpgo: llvm-bolt failed: $(grep -m1 -E 'BOLT-ERROR|Segmentation|Assertion|error' {out}/{LOG} || tail -n1 {out}/{LOG}) (log: {out}/{LOG})" >&2
		exit 1
	fi
	rc=0
	PYTHONPATH={pypath} {python} -m kpgo.kernel.bolt sites "$in" {out}/vmlinux.bolted {out}/{SKIP_FILE} >> {out}/{LOG} 2>&1 || rc=$?
	[ $rc = 0 ] && break
	if [ $rc != {EXIT_SKIP_MORE} ] || [ $pass = {PASSES} ]; then
		echo "kpgo: BOLT's output would be patched wrongly at boot: $(tail -n1 {out}/{LOG}) (log: {out}/{LOG})" >&2
		exit 1
	fi
	pass=$((pass + 1))
done
echo "kpgo: BOLT passes: $pass" >> {out}/{LOG}
rm -f {out}/vmlinux.bolt-in
mv {out}/vmlinux.bolted "$v"
"""
    step = out / STEP
    step.write_text(text)
    step.chmod(0o755)
    return step


# ---- boot-time patch sites BOLT 19 does not rewrite ----

@dataclass(frozen=True)
class Site:
    section: str  # runtime_ptr_SYM or runtime_shift_SYM
    address: int  # of the bytes the kernel writes
    width: int


class _Elf:
    """The section headers of a little-endian ELF64 file (vmlinux) and the bytes at its loaded addresses."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self.data = path.read_bytes()
            if self.data[:6] != b"\x7fELF\x02\x01":
                raise InfraError(f"{path} is not a 64-bit little-endian ELF file", "pass an x86-64 vmlinux")
            shoff, = struct.unpack_from("<Q", self.data, 0x28)
            size, num, strndx = struct.unpack_from("<HHH", self.data, 0x3A)
            heads = [struct.unpack_from("<IIQQQQIIQQ", self.data, shoff + i * size) for i in range(num)]
            names = heads[strndx][4]
        except OSError as err:
            raise InfraError(f"cannot read {path}: {err.strerror}") from None
        except (struct.error, IndexError):
            raise InfraError(f"{path} is a truncated or damaged ELF file", "rebuild it") from None
        # name -> (address, file offset, size), sections with file contents only (not SHT_NOBITS)
        self.sections: dict[str, tuple[int, int, int]] = {}
        for sh_name, sh_type, _flags, addr, off, sz, *_ in heads:
            if sh_type != 8:
                end = self.data.find(b"\0", names + sh_name)
                self.sections[self.data[names + sh_name : end].decode(errors="replace")] = (addr, off, sz)

    def at(self, address: int, n: int) -> bytes:
        """The n bytes the file holds for the loaded `address`, b"" when no allocated section holds them all."""
        for addr, off, sz in self.sections.values():
            if addr and addr <= address and address + n <= addr + sz:
                return self.data[off + address - addr : off + address - addr + n]
        return b""


class _Functions:
    """The sized function symbols of an ELF file, by address."""

    def __init__(self, elf: Path) -> None:
        self.fns = sorted((f.address, f.end, f.name) for f in codesize.symbols(elf).functions if f.size)
        self.starts = [f[0] for f in self.fns]

    def holding(self, address: int) -> tuple[int, int, str] | None:
        """(start, end, name) of the function holding `address`: the last symbol starting at or before it that also ends
        after it (aliases and sizeless neighbours); None outside every function."""
        i = bisect.bisect_right(self.starts, address)
        return next((f for f in reversed(self.fns[max(i - 8, 0) : i]) if address < f[1]), None)


def runtime_const_sites(elf: _Elf) -> list[Site]:
    """Every runtime-constant site the kernel in `elf` patches at boot (RUNTIME_CONST_PREFIXES)."""
    out = []
    for name, (addr, off, size) in elf.sections.items():
        width = next((w for p, w in RUNTIME_CONST_PREFIXES.items() if name.startswith(p)), 0)
        for i in range(0, size - size % 4 if width else 0, 4):
            out.append(Site(name, addr + i + struct.unpack_from("<i", elf.data, off + i)[0], width))
    return out


def moved_sites(pre: Path, post: Path) -> list[tuple[Site, str]]:
    """The runtime-constant sites of the kernel `pre` whose code BOLT's output `post` changed, with the function
    holding each ("" outside any): a site is intact when every byte from its function's start through the site is
    the same in both, so the same instruction is at the same address (BOLT does not rewrite those sections)."""
    a, b = _Elf(pre), _Elf(post)
    fns = _Functions(pre)
    out = []
    for s in runtime_const_sites(a):
        start, _end, name = fns.holding(s.address) or (s.address, 0, "")
        n = s.address + s.width - start
        if not a.at(start, n) or a.at(start, n) != b.at(start, n):
            out.append((s, name))
    return out


def skip_pattern(function: str) -> str:
    """BOLT's -skip-funcs-file line for `function`: a regex BOLT anchors, which also matches the names BOLT gives a
    local symbol ("NAME/1", "NAME/FILE/1")."""
    return re.escape(function) + "(/.*)?"


def skip_more(skip_file: Path, functions: set[str]) -> list[str]:
    """Add to `skip_file` the functions it does not name yet; return those."""
    have = set(skip_file.read_text().split()) if skip_file.is_file() else set()
    new = sorted(n for n in functions if n and skip_pattern(n) not in have)
    if new:
        with skip_file.open("a") as f:
            f.write("".join(skip_pattern(n) + "\n" for n in new))
    return new


# ---- functions BOLT 19 lays out wrong in a kernel ----

def halting_functions(elf: Path) -> list[str]:
    """The functions of `elf` that hold a HLT. BOLT 19 takes HLT for the end of a path, as it is in a user program; in
    the kernel the CPU goes on after it at the next interrupt (default_idle: `sti; hlt; cli; ret`), and BOLT put other
    code after it: with the mitigations' VERW before the HLT, BOLT's default_idle looped in place of returning, and
    every CPU stayed in it (gdb on the guest). The step gives them to BOLT's skip list before the first pass."""
    fns = _Functions(elf)
    return sorted({f[2] for a in _instructions(elf, None, "hlt") if (f := fns.holding(a)) is not None})


# ---- boot-time patch lists of whole instructions, written again for BOLT's output ----

# objtool lists, for the kernel to patch at boot, every return through the return thunk (MITIGATION_RETHUNK), every
# call or jump through a retpoline thunk (MITIGATION_RETPOLINE), every direct call (MITIGATION_CALL_DEPTH_TRACKING)
# and every ENDBR it seals (X86_KERNEL_IBT): each entry a 32-bit offset from itself to the instruction. BOLT 19 leaves
# the lists as they were, pointing into code it rewrote. For each function BOLT rewrote, kpgo finds the same
# instructions (kind and target) in its new code, the part left in place and the cold part BOLT moved into the room
# at the end of the text (NAME.cold.N), and writes their addresses into the lists. A function whose new code holds
# another number of them than its old code (or whose listed ones are not all of their kind) is left to BOLT's skip
# list, as for the runtime constants. check() then reads every entry of the final lists.
PATCH_LISTS = (".return_sites", ".retpoline_sites", ".call_sites", ".ibt_endbr_seal")
ENDBR64 = b"\xf3\x0f\x1e\xfa"
_COLD = re.compile(r"(.+)\.cold\.\d+$")  # BOLT's name for the part of a function it moved


def _insn(elf: _Elf, address: int) -> tuple[str, int] | None:
    """The patchable instruction at `address`: ("call" | "jmp" | "jcc", target) for a branch with a 32-bit
    displacement, ("endbr", 0) for an ENDBR64; None for anything else. A CS prefix (0x2e: GCC's
    -mindirect-branch-cs-prefix on retpoline calls, one byte for the kernel to patch an indirect call into) is kept
    in the kind ("cs call")."""
    at, cs = (address + 1, "cs ") if elf.at(address, 1) == b"\x2e" else (address, "")
    op = elf.at(at, 2)
    if op[:1] in (b"\xe8", b"\xe9"):
        d = elf.at(at + 1, 4)
        return (cs + ("call" if op[0] == 0xE8 else "jmp"), at + 5 + struct.unpack("<i", d)[0]) if d else None
    if op[:1] == b"\x0f" and 0x80 <= op[1] <= 0x8F:
        d = elf.at(at + 2, 4)
        return (cs + "jcc", at + 6 + struct.unpack("<i", d)[0]) if d else None
    return ("endbr", 0) if not cs and elf.at(address, 4) == ENDBR64 else None


def _matched(elf: _Elf, address: int) -> tuple[str, int] | None:
    """_insn's kind and target as rewrite_lists matches them: BOLT 19 re-encodes `cs call THUNK` without the prefix,
    and the kernel patches such a site only where its indirect call fits the 5 bytes (apply_retpolines: `len ==
    insn.length`), else it keeps the thunk call, which is right either way."""
    k = _insn(elf, address)
    return (k[0].removeprefix("cs "), k[1]) if k is not None else None


def patch_lists(elf: _Elf) -> dict[str, list[int]]:
    """The instruction addresses each of the kernel's boot-time patch lists (PATCH_LISTS) names, in entry order."""
    out = {}
    for name in PATCH_LISTS:
        if name in elf.sections:
            addr, off, size = elf.sections[name]
            n = size // 4
            out[name] = [addr + 4 * i + d for i, d in enumerate(struct.unpack_from(f"<{n}i", elf.data, off))]
    return out


BRANCHES = "(cs )?(call|j|endbr)"  # the mnemonics a patch list can name (after a CS prefix too)


def _instructions(elf: Path, keep: list[tuple[int, int]] | None, mnemonics: str = BRANCHES) -> list[int]:
    """The addresses of the instructions whose mnemonic starts with the regex `mnemonics` that `objdump -d` finds in
    `elf`, inside the sorted ranges `keep` (None: anywhere)."""
    starts = [a for a, _ in keep or ()]
    found: list[int] = []

    def line(text: str) -> None:
        head = text.partition(":\t")[0]  # an instruction line: "ffffffff81000000:\tcall ..."
        try:
            a = int(head, 16)
        except ValueError:
            return
        i = bisect.bisect_right(starts, a) - 1
        if keep is None or (i >= 0 and a < keep[i][1]):
            found.append(a)

    # grep keeps the lines of those mnemonics (branches and ENDBRs are a twentieth of the kernel's instructions), so
    # Python reads those, not every line
    cmd = f"set -o pipefail; objdump -d --no-show-raw-insn {shlex.quote(str(elf))} | {{ LC_ALL=C grep -P ':\\t{mnemonics}'; [ $? -le 1 ]; }}"
    proc.run(["bash", "-c", cmd], on_line=line, keep_output=False, what=f"objdump of {elf}")
    return sorted(found)


@dataclass
class ListsRewrite:
    lists: dict[str, list[int]]  # list section -> the instruction addresses it must name in BOLT's output
    moved: int  # entries whose instruction BOLT moved
    unmatched: dict[str, str]  # function -> why its listed instructions were not found again in BOLT's output


def rewrite_lists(pre: Path, post: Path) -> ListsRewrite:
    """Where the instructions of `pre`'s patch lists are in BOLT's output `post`."""
    a, b = _Elf(pre), _Elf(post)
    old = patch_lists(a)
    fns = _Functions(pre)
    changed: dict[int, tuple[int, int, str]] = {}  # start -> function, for those BOLT rewrote that hold a listed site
    listed: dict[int, list[tuple[str, int]]] = {}  # start -> (list, entry) of its sites
    unmatched: dict[str, str] = {}
    for name, sites in old.items():
        for i, s in enumerate(sites):
            f = fns.holding(s)
            if f is None or a.at(f[0], f[1] - f[0]) == b.at(f[0], f[1] - f[0]):
                continue  # not in a function, or in one BOLT left as it was: the entry holds
            changed[f[0]] = f
            listed.setdefault(f[0], []).append((name, i))
    new = {name: list(sites) for name, sites in old.items()}
    if not changed:
        return ListsRewrite(new, 0, unmatched)
    # each rewritten function's code before (its range) and after (the range, and its parts BOLT moved out)
    by_name: dict[str, list[int]] = {}
    for start, (_s, _e, fname) in changed.items():
        by_name.setdefault(fname, []).append(start)
    cold: dict[int, list[tuple[int, int]]] = {}
    for sym in codesize.symbols(post).functions:
        m = _COLD.match(sym.name)
        if m and sym.size and m.group(1) in by_name:
            owners = by_name[m.group(1)]
            if len(owners) > 1:  # two rewritten functions of one name: whose part is it?
                unmatched[m.group(1)] = "more than one function of this name, and BOLT moved a part of one"
            cold.setdefault(owners[0], []).append((sym.address, sym.end))
    ranges = sorted([(s, e) for s, e, _ in changed.values()])
    before = _instructions(pre, ranges)
    after = _instructions(post, sorted(ranges + [r for rs in cold.values() for r in rs]))
    ranges_after = {start: [(start, f[1]), *cold.get(start, [])] for start, f in changed.items()}

    def kinds(elf: _Elf, found: list[int], spans: list[tuple[int, int]]) -> dict[tuple[str, int], list[int]]:
        """The instructions of `found` (sorted) inside `spans`, by kind and target."""
        out: dict[tuple[str, int], list[int]] = {}
        for lo, hi in spans:
            for x in found[bisect.bisect_left(found, lo):bisect.bisect_left(found, hi)]:
                if (k := _matched(elf, x)) is not None:
                    out.setdefault(k, []).append(x)
        return out

    moved = 0
    for start, f in sorted(changed.items()):
        if f[2] in unmatched:
            continue
        was = kinds(a, before, [(f[0], f[1])])
        now = kinds(b, after, ranges_after[start])
        plan: list[tuple[str, list[int], list[int]]] = []  # list, its entries, the new addresses, per kind
        entries: dict[tuple[str, tuple[str, int]], list[int]] = {}
        why = ""
        for name, i in listed[start]:
            k = _matched(a, old[name][i])
            if k is None:
                why = f"{name} names {old[name][i]:#x}, which holds no call, jump or ENDBR"
                break
            entries.setdefault((name, k), []).append(i)
        for (name, k), idx in entries.items() if not why else ():
            if len(idx) != len(was.get(k, [])):
                why = f"{name} lists {len(idx)} of its {len(was.get(k, []))} {k[0]} instructions to {k[1]:#x}"
            elif len(now.get(k, [])) != len(idx):
                why = f"BOLT's code has {len(now.get(k, []))} {k[0]} instructions to {k[1]:#x} where it had {len(idx)}"
            if why:
                break
            plan.append((name, idx, now[k]))
        if why:
            unmatched[f[2]] = why
            continue
        for name, idx, addrs in plan:
            for i, x in zip(idx, addrs):
                moved += new[name][i] != x
                new[name][i] = x
    return ListsRewrite(new, moved, unmatched)


def write_lists(post: Path, lists: dict[str, list[int]]) -> None:
    """Write the patch lists into the ELF file `post` (each entry the offset from itself to its instruction)."""
    elf = _Elf(post)
    with open(post, "r+b") as f:
        for name, sites in lists.items():
            addr, off, size = elf.sections[name]
            assert size // 4 == len(sites), name
            f.seek(off)
            f.write(struct.pack(f"<{len(sites)}i", *(s - (addr + 4 * i) for i, s in enumerate(sites))))


def check_lists(elf: _Elf) -> dict[str, dict[str, int]]:
    """Every entry of the kernel's patch lists read back: per list, its entries and those that name an instruction
    of the list's kind (a return through the return thunk, a call or jump through a retpoline thunk, a direct call,
    an ENDBR64)."""
    # the thunks are labels without a size (SYM_INNER_LABEL in arch/x86/lib/retpoline.S): every name nm gives an address
    names: dict[int, set[str]] = {}
    for ln in proc.capture(["nm", "--defined-only", str(elf.path)], timeout=300).splitlines():
        addr, _, name = (ln.split() + ["", "", ""])[:3]
        if name.startswith("__x86_"):
            names.setdefault(int(addr, 16), set()).add(name)

    def thunk(target: int, prefix: str) -> bool:
        return any(n.startswith(prefix) for n in names.get(target, ()))

    ok_kind = {".return_sites": lambda k: k[0] == "jmp" and thunk(k[1], "__x86_return_thunk"),
               ".retpoline_sites": lambda k: k[0].removeprefix("cs ") in ("call", "jmp", "jcc") and thunk(k[1], "__x86_indirect_thunk_"),
               ".call_sites": lambda k: k[0] == "call",
               ".ibt_endbr_seal": lambda k: k[0] == "endbr"}
    out = {}
    for name, sites in patch_lists(elf).items():
        good = sum(1 for s in sites if (k := _insn(elf, s)) is not None and ok_kind[name](k))
        out[name] = {"entries": len(sites), "valid": good}
    return out


def _main(argv: list[str]) -> int:
    """`python -m kpgo.kernel.bolt sites PRE POST SKIP_FILE`, run by the step after each BOLT pass: 0 when every
    runtime-constant site is intact and the patch lists were written again into POST, EXIT_SKIP_MORE when functions
    were added to SKIP_FILE (BOLT runs again), 1 when functions BOLT was told to skip still changed."""
    if len(argv) == 3 and argv[0] == "halting":  # `halting PRE SKIP_FILE`: before the first pass
        names = halting_functions(Path(argv[1]))
        skip_more(Path(argv[2]), set(names))
        print(f"kpgo: {len(names)} functions with a HLT left to BOLT's skip list: {', '.join(names)}")
        return 0
    if len(argv) != 4 or argv[0] != "sites":
        print("usage: python -m kpgo.kernel.bolt sites PRE_BOLT_VMLINUX BOLTED_VMLINUX SKIP_FILE | halting PRE_BOLT_VMLINUX SKIP_FILE",
              file=sys.stderr)
        return 2
    pre, post, skip_file = (Path(a) for a in argv[1:])
    moved = moved_sites(pre, post)
    total = len(runtime_const_sites(_Elf(pre)))
    if moved:
        new = skip_more(skip_file, {n for _, n in moved})
        print(f"kpgo: BOLT moved {len(moved)} of {total} runtime-constant sites, in {', '.join(sorted({n or hex(s.address) for s, n in moved}))}"
              + (f"; skipping {len(new)} more functions" if new else "; they are skipped already"))
        return EXIT_SKIP_MORE if new else 1
    print(f"kpgo: all {total} runtime-constant sites intact after BOLT")
    lists = rewrite_lists(pre, post)
    if lists.unmatched:
        new = skip_more(skip_file, set(lists.unmatched))
        first = next(iter(lists.unmatched.items()))
        print(f"kpgo: the patch-list instructions of {len(lists.unmatched)} functions BOLT rewrote were not found again "
              f"(first: {first[0]}: {first[1]})" + (f"; skipping {len(new)} more functions" if new else "; they are skipped already"))
        return EXIT_SKIP_MORE if new else 1
    write_lists(post, lists.lists)
    print(f"kpgo: patch lists written again: {lists.moved} of {sum(map(len, lists.lists.values()))} entries moved "
          f"({', '.join(f'{n} {len(s)}' for n, s in lists.lists.items()) or 'none in this kernel'})")
    return 0


# ---- after the build: BOLT's report and the proof ----

_STALE = re.compile(r"(\d+) \(([\d.]+)% of all profiled\) functions have invalid \(possibly stale\) profile")
_STALE_SAMPLES = re.compile(r"(\d+) out of (\d+) samples in the binary \(([\d.]+)%\) belong to functions with invalid")
_SPLIT = re.compile(r"splitting separates (\d+) hot bytes from (\d+) cold bytes")
_OVERWRITTEN = re.compile(r"BOLT: (\d+) out of (\d+) functions were overwritten")
_NOT_OPTIMIZED = re.compile(r"(\d+) functions? with profile could not be optimized")
_REORDERED = re.compile(r"basic block reordering modified layout of (\d+) functions")
_DYNO_HEAD = "program-wide dynostats after all optimizations"
# "   1000 : taken branches (-12.5%)": the figure after BOLT, and its change from the input's (none when unchanged)
_DYNO = re.compile(r"^\s*(\d+) : ([a-z][a-z -]+?)(?: \(([+-][\d.]+)%\))?\s*$", re.M)
_DYNO_KEYS = ("executed instructions", "taken branches", "executed forward branches", "taken forward branches",
              "executed backward branches", "taken backward branches", "total branches")


def report(text: str) -> dict[str, Any]:
    """BOLT's own figures from its output: functions with a profile, the stale share (functions and samples),
    the bytes split hot/cold, the functions rewritten, and its dynamic stats after optimization."""
    p, st, ss, sp, ow, no, ro = (r.search(text) for r in (_PROFILED, _STALE, _STALE_SAMPLES, _SPLIT, _OVERWRITTEN, _NOT_OPTIMIZED, _REORDERED))
    out: dict[str, Any] = {
        "functions": int(p.group(2)) if p else None,
        "functions_profiled": int(p.group(1)) if p else 0,
        "functions_stale": int(st.group(1)) if st else 0,
        "stale_share": round(float(st.group(2)) / 100, 6) if st else 0.0,
        "samples_stale": int(ss.group(1)) if ss else 0,
        "samples": int(ss.group(2)) if ss else None,
        "samples_stale_share": round(float(ss.group(3)) / 100, 6) if ss else 0.0,
        "hot_bytes": int(sp.group(1)) if sp else 0,
        "cold_bytes_moved": int(sp.group(2)) if sp else 0,
        "functions_not_optimized": int(no.group(1)) if no else 0,  # with a profile, but not simple enough for BOLT to rewrite
        "functions_reordered": int(ro.group(1)) if ro else 0,  # whose block layout ext-tsp changed
        "functions_rewritten": int(ow.group(1)) if ow else 0,
        "linux_kernel": "Linux kernel binary detected" in text,
        "relocation_mode": "disabling relocation mode" not in text and "relocation mode" in text,
    }
    # -dyno-stats: BOLT's estimate, from the profile, of the optimized binary's figures and their change
    if _DYNO_HEAD in text:
        head, _, rest = text.split(_DYNO_HEAD, 1)[1].partition("\n")
        paras = [p for p in rest.split("\n\n") if _DYNO.search(p)][:1 if "no change" in head else 2]
        figures = [{name: int(n) for n, name, _ in _DYNO.findall(p) if name in _DYNO_KEYS} for p in paras]
        if figures:
            out["dyno_before"], out["dyno_after"] = figures[0], figures[-1]
    return out


def check(out: Path, r: Recording, fdata_info: dict[str, Any], reserve: int) -> dict[str, Any]:
    """build.json's "bolt": BOLT's report, the kernel's build ids before and after, and ok (MIN_VALID_SHARE)."""
    from kpgo import branches

    log = out / LOG
    if not log.is_file():
        raise InfraError(f"the build has no BOLT output ({log}): the BOLT step did not run", "check build.log for 'BOLT vmlinux'")
    rep = report(log.read_text(errors="replace"))
    pre, post = branches.build_id_of(out / PRE_BOLT), branches.build_id_of(out / "vmlinux")
    valid = 1.0 - rep["samples_stale_share"]
    problems = []
    if not rep["functions_profiled"]:
        problems.append("BOLT found no function with a profile")
    if valid < MIN_VALID_SHARE:
        problems.append(f"only {valid:.1%} of the profile's samples are in functions whose profile matches their code (stale profile)")
    if pre == post:
        problems.append("vmlinux kept its build id: it is not BOLT's output")
    moved = moved_sites(out / PRE_BOLT, out / "vmlinux")
    if moved:
        where = moved[0][1] or hex(moved[0][0].address)
        problems.append(f"BOLT changed the code of {len(moved)} runtime-constant sites the kernel patches at boot (in {where})")
    pre_elf, post_elf = _Elf(out / PRE_BOLT), _Elf(out / "vmlinux")
    lists, lists_pre = check_lists(post_elf), check_lists(pre_elf)
    before, after = patch_lists(pre_elf), patch_lists(post_elf)
    for name, counts in lists.items():  # the entries kpgo pointed at BOLT's new code, and those valid before BOLT
        counts["moved"] = sum(x != y for x, y in zip(before.get(name, []), after[name]))
        counts["valid_before"] = lists_pre.get(name, {}).get("valid", 0)
    bad = {n: c["valid_before"] - c["valid"] for n, c in lists.items() if c["valid"] < c["valid_before"]}
    if bad:
        name, n = next(iter(bad.items()))
        problems.append(f"{n} entries of {name} (patched at boot) name no instruction of their kind in BOLT's output")
    skip = out / SKIP_FILE
    skipped = [ln.removesuffix("(/.*)?").replace("\\", "") for ln in skip.read_text().split()] if skip.is_file() else []
    passes = re.search(r"kpgo: BOLT passes: (\d+)", log.read_text(errors="replace"))
    return {
        "ok": not problems, "problems": problems, "min_valid_share": MIN_VALID_SHARE, "valid_share": round(valid, 6),
        "options": list(OPTIONS), "bolt_version": bolt_version(), "reserve_bytes": reserve,
        "profile": {"dir": str(r.dir), "recorded_on": str(r.vmlinux), "recorded_build_id": r.build_id, "perf2bolt": fdata_info},
        "build_id_pre_bolt": pre, "build_id": post, "report": rep, "log": str(log),
        # BOLT 19 does not rewrite them: the functions holding one it changed are left alone (SKIP_FILE)
        "runtime_const": {"sites": len(runtime_const_sites(pre_elf)), "moved": len(moved), "functions_skipped": skipped,
                          "bolt_passes": int(passes.group(1)) if passes else None},
        # the lists of whole instructions kpgo wrote again (PATCH_LISTS), read back: entries, and those of their kind
        "patch_lists": lists,
    }


def enforce(record: dict[str, Any], out: Path) -> None:
    if not record["ok"]:
        raise InfraError(f"BOLT did not optimize the kernel in {out}: {record['problems'][0]}", f"BOLT's output: {record['log']}")


def summary_lines(record: dict[str, Any]) -> list[str]:
    rep = record["report"]
    lines = [f"BOLT: {rep['functions_profiled']:,} of {rep['functions'] or 0:,} functions with a profile, "
             f"{rep['functions_stale']:,} stale ({rep['stale_share']:.1%}); {record['valid_share']:.1%} of the samples usable; "
             f"{rep['functions_rewritten']:,} functions rewritten, {rep['cold_bytes_moved']:,} cold bytes moved out of "
             f"{rep['hot_bytes'] + rep['cold_bytes_moved']:,}"]
    rc = record.get("runtime_const") or {}
    if rc.get("functions_skipped"):
        lines.append(f"BOLT: {len(rc['functions_skipped'])} functions left alone (they hold a HLT, or boot-time patch sites BOLT "
                     f"would move): {', '.join(rc['functions_skipped'][:8])}{' ...' if len(rc['functions_skipped']) > 8 else ''}")
    if record.get("patch_lists"):
        lines.append("BOLT: boot-time patch lists written again for BOLT's code: " + ", ".join(
            f"{n} {c['valid']:,} of {c['entries']:,} valid, {c.get('moved', 0):,} moved" for n, c in record["patch_lists"].items()))
    lines.append(f"BOLT: build id {record['build_id_pre_bolt']} -> {record['build_id']} (the BOLTed vmlinux in the bzImage)")
    dyno0, dyno = rep.get("dyno_before", {}), rep.get("dyno_after", {})
    if dyno0.get("taken branches") and dyno.get("taken branches") is not None:
        lines.append(f"BOLT: taken branches (BOLT's estimate from the profile) {dyno0['taken branches']:,} -> {dyno['taken branches']:,} "
                     f"({dyno['taken branches'] / dyno0['taken branches'] - 1:+.1%})")
    return lines


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
