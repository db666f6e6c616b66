"""Branch records from kpgo's QEMU plugin (docs/SIM.md, "Branch records"): the one reader of its records file, and
what the layout tools read, made from it:

- BOLT's pre-aggregated profile (`perf2bolt -pa` / `llvm-bolt -aggregate-only -pa`): `B from to count mispred`
  and `F start end count` lines, hex without 0x, single spaces, nothing else in the file;
- `perf script` branch-stack text for `llvm-profgen --perfscript` (with `--kernel` for a vmlinux): an MMAP2 line,
  then one line per distinct sampled stack, after a line with its repeat count;
- the call graph: caller -> callee function with counts, from the recorded calls (and tail calls).

A records file names the binary it belongs to by its GNU build id; reading it for another binary is a one-line
UserError before anything else is read, and so is a truncated file."""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

import numpy as np

from kpgo import inputs
from kpgo.errors import InfraError, UserError
from kpgo.kernel import codesize

RECORD_AGAIN = "record it again (`kpgo collect BUILD_DIR --branches`)"

RECORDS_FORMAT = 1
MAGIC = b"KPGOBRN\0"
END = b"KPGOEND\0"
DEPTH = 32  # entries of a sampled stack, as Intel's LBR has
# magic, 18 words (kpgosim.c write_records), 64 bytes of build id
_HEAD = struct.Struct("<8s18Q64s")
_TAIL = struct.Struct("<8sQ")
SIDES = ("user", "kernel")
# The perf mmap names llvm-profgen --kernel takes as the kernel image (DESIGN.md: it needs one of them).
KERNEL_MMAP = "[kernel.kallsyms]_text"
KERNEL_TEXT_SYMBOL = "_text"


class Kind(IntEnum):
    """What the instruction at an edge's source is (kpgosim.c enum bkind). NONE: not a branch, so the edge is an
    interrupt or exception taken after it."""

    NONE = 0
    COND = 1
    JUMP = 2
    CALL = 3
    RET = 4
    SYSCALL = 5
    SYSRET = 6


@dataclass(frozen=True)
class Stack:
    count: int  # times this exact stack was sampled
    branches: np.ndarray  # (n, 2) uint64: from, to; newest first, n <= DEPTH


@dataclass(frozen=True)
class Records:
    """One records file. Counts add up over the windows it recorded; `lost_*` are executions of keys that found
    their table full (the plugin's bounds): the file's counts are exact for the keys it holds, and those are
    missing from it."""

    side: str  # "kernel" or "user": the side whose branches were recorded
    period: int  # a stack sampled every `period` recorded branches
    depth: int
    vcpus: int
    windows: int  # closed windows recorded
    open_window: bool  # a window was still open when the file was written (QEMU exited in it)
    branches: int  # recorded taken branches (either end on the side)
    samples: int
    lost_edges: int
    lost_ranges: int
    lost_samples: int
    entries_bound: int  # distinct edges (and ranges) per vCPU
    stacks_bound: int  # distinct stacks per vCPU
    build_id: str  # hex, "" when the plugin was given none
    edges: np.ndarray  # (n, 4) uint64: from, to, count, kind; sorted
    ranges: np.ndarray  # (n, 3) uint64: start, end, count; sorted
    stacks: tuple[Stack, ...]
    size: int  # bytes of the file

    def summary(self) -> dict[str, int | str | bool]:
        """The counts a profile's manifest keeps."""
        return {
            "side": self.side, "period": self.period, "depth": self.depth, "vcpus": self.vcpus, "windows": self.windows,
            "open_window": self.open_window, "branches": self.branches, "samples": self.samples,
            "edges": len(self.edges), "ranges": len(self.ranges), "stacks": len(self.stacks),
            "edge_count": int(self.edges[:, 2].sum()), "range_count": int(self.ranges[:, 2].sum()),
            "lost_edges": self.lost_edges, "lost_ranges": self.lost_ranges, "lost_samples": self.lost_samples,
            "entries_bound": self.entries_bound, "stacks_bound": self.stacks_bound, "build_id": self.build_id,
            "bytes": self.size,
        }


def read_records(path: Path, build_id: str | None = None) -> Records:
    """The records file at `path`. With `build_id` (hex), a file made for another binary is refused first: before
    its contents are checked. Problems are one-line UserErrors."""
    path = Path(path)
    data = inputs.read_bytes(path, "record one with `kpgo collect BUILD_DIR --branches`")
    if len(data) < _HEAD.size or data[:8] != MAGIC:
        if len(data) < _HEAD.size and MAGIC.startswith(data[:8]):
            raise UserError(f"the branch records file {path} is truncated ({len(data)} bytes, not even its header)",
                            "record it again; the plugin writes it whole at each window close and at QEMU's exit")
        raise UserError(f"{path} is not a kpgo branch records file", "record one with `kpgo collect BUILD_DIR --branches`")
    (_, fmt, side, period, depth, vcpus, windows, open_window, branches, samples, lost_e, lost_r, lost_s, entries_bound,
     stacks_bound, n_edges, n_ranges, n_stacks, id_len, id_bytes) = _HEAD.unpack_from(data)
    if fmt != RECORDS_FORMAT:
        raise UserError(f"the branch records file {path} has format {fmt}, this kpgo reads {RECORDS_FORMAT}",
                        "rebuild the plugin (`.venv/bin/python -m kpgo.sim`) and record again")
    if id_len > len(id_bytes) or side > 1 or depth != DEPTH:
        raise UserError(f"the branch records file {path} has a corrupt header", RECORD_AGAIN)
    file_id = id_bytes[:id_len].hex()
    if build_id is not None and file_id != build_id.lower():
        raise UserError(f"the branch records {path} belong to the binary with build id {file_id or '(none)'}, not {build_id}",
                        "give the vmlinux (or build) the records were made with")
    end = len(data) - _TAIL.size
    if end < _HEAD.size or data[end:end + 8] != END or _TAIL.unpack_from(data, end)[1] != len(data):
        raise UserError(f"the branch records file {path} is truncated or damaged ({len(data)} bytes, no end record)",
                        "record it again; the plugin writes it whole at each window close and at QEMU's exit")
    at = _HEAD.size
    need = at + 8 * (4 * n_edges + 3 * n_ranges)
    if need > end:
        raise UserError(f"the branch records file {path} is damaged: its tables overrun the file", RECORD_AGAIN)
    edges = np.frombuffer(data, dtype="<u8", count=4 * n_edges, offset=at).reshape(n_edges, 4).astype(np.uint64)
    at += 32 * n_edges
    ranges = np.frombuffer(data, dtype="<u8", count=3 * n_ranges, offset=at).reshape(n_ranges, 3).astype(np.uint64)
    at += 24 * n_ranges
    stacks = []
    for _ in range(n_stacks):
        if at + 16 > end:
            raise UserError(f"the branch records file {path} is damaged: its stacks overrun the file", RECORD_AGAIN)
        count, n = struct.unpack_from("<2Q", data, at)
        if n > DEPTH or at + 16 + 16 * n > end:
            raise UserError(f"the branch records file {path} is damaged: a stack overruns the file", RECORD_AGAIN)
        stacks.append(Stack(int(count), np.frombuffer(data, dtype="<u8", count=2 * n, offset=at + 16).reshape(n, 2).astype(np.uint64)))
        at += 16 + 16 * n
    if at != end:
        raise UserError(f"the branch records file {path} is damaged: {end - at} bytes between its stacks and its end record", RECORD_AGAIN)
    return Records(SIDES[side], period, depth, vcpus, windows, bool(open_window), branches, samples, lost_e, lost_r, lost_s,
                   entries_bound, stacks_bound, file_id, edges, ranges, tuple(stacks), len(data))


def write_records(records: Records, out: Path) -> None:
    """`records` in the plugin's format (kpgosim.c write_records), written whole: how a merge of records is kept, so
    that every reader of records reads it as it reads the plugin's."""
    ident = bytes.fromhex(records.build_id)
    parts = [_HEAD.pack(MAGIC, RECORDS_FORMAT, SIDES.index(records.side), records.period, records.depth, records.vcpus,
                        records.windows, int(records.open_window), records.branches, records.samples, records.lost_edges,
                        records.lost_ranges, records.lost_samples, records.entries_bound, records.stacks_bound,
                        len(records.edges), len(records.ranges), len(records.stacks), len(ident), ident),
             records.edges.astype("<u8").tobytes(), records.ranges.astype("<u8").tobytes()]
    for st in records.stacks:
        parts += [struct.pack("<2Q", st.count, len(st.branches)), st.branches.astype("<u8").tobytes()]
    body = b"".join(parts) + END
    from kpgo import atomic

    atomic.write_bytes(out, body + struct.pack("<Q", len(body) + 8))


def _summed(keys: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct rows of `keys` (sorted, as the plugin writes its tables) and the sum of `counts` over each."""
    if not len(keys):
        return keys, counts
    uniq, inv = np.unique(keys, axis=0, return_inverse=True)
    sums = np.zeros(len(uniq))
    np.add.at(sums, inv.reshape(-1), counts)
    return uniq, sums


def merge_records(parts: list[Records], factors: list[float]) -> Records:
    """The records of one kernel added up, part i's counts times factors[i], rounded to whole counts (a key whose
    count rounds to 0 is left out). Parts of another side, sampling period or kernel are a UserError."""
    first = parts[0]
    for r in parts[1:]:
        if (r.side, r.period, r.build_id) != (first.side, first.period, first.build_id):
            raise UserError(f"branch records of the {r.side} side every {r.period} branches of build id {r.build_id or '(none)'} cannot be "
                            f"added to those of the {first.side} side every {first.period} of {first.build_id or '(none)'}",
                            "merge records of one kernel, recorded with the same --period")

    def whole(x: float) -> int:
        return int(round(x))

    edges, e_counts = _summed(np.concatenate([r.edges[:, [0, 1, 3]] for r in parts]),
                              np.concatenate([r.edges[:, 2].astype(float) * f for r, f in zip(parts, factors)]))
    ranges, r_counts = _summed(np.concatenate([r.ranges[:, :2] for r in parts]),
                               np.concatenate([r.ranges[:, 2].astype(float) * f for r, f in zip(parts, factors)]))
    e_counts, r_counts = np.rint(e_counts).astype(np.uint64), np.rint(r_counts).astype(np.uint64)
    edges = np.column_stack([edges[:, :2], e_counts, edges[:, 2]]).astype(np.uint64)[e_counts > 0] if len(edges) else first.edges[:0]
    ranges = np.column_stack([ranges, r_counts]).astype(np.uint64)[r_counts > 0] if len(ranges) else first.ranges[:0]
    stacks: dict[bytes, tuple[float, np.ndarray]] = {}
    for r, f in zip(parts, factors):
        for st in r.stacks:
            key = st.branches.tobytes()
            have = stacks.get(key)
            stacks[key] = ((have[0] if have else 0.0) + st.count * f, st.branches)
    kept = tuple(Stack(whole(c), b) for c, b in stacks.values() if whole(c) > 0)

    def total(key: str) -> int:
        return whole(sum(getattr(r, key) * f for r, f in zip(parts, factors)))

    return Records(first.side, first.period, first.depth, max(r.vcpus for r in parts), sum(r.windows for r in parts),
                   any(r.open_window for r in parts), total("branches"), sum(st.count for st in kept), total("lost_edges"),
                   total("lost_ranges"), total("lost_samples"), max(r.entries_bound for r in parts), max(r.stacks_bound for r in parts),
                   first.build_id, edges, ranges, kept, 0)


# ---- ELF: build id and executable segments (no pyelftools) ----

@dataclass(frozen=True)
class Segment:
    vaddr: int
    memsz: int
    offset: int


@dataclass(frozen=True)
class Elf:
    build_id: str | None
    exec_segments: tuple[Segment, ...]  # PT_LOAD with PF_X, in file order


PT_LOAD, PT_NOTE, PF_X, NT_GNU_BUILD_ID = 1, 4, 1, 3


def read_elf(path: Path) -> Elf:
    """The GNU build id (from the PT_NOTE segments) and the executable PT_LOAD segments of a 64-bit ELF file."""
    path = Path(path)
    if not inputs.is_regular(path):  # open() of a FIFO would wait for a writer
        what = f"is {inputs.kind(path)}" if path.exists() else "does not exist"
        raise UserError(f"{path} {what}, not an ELF file", "give a vmlinux (or the binary the records were made for)")
    try:
        with open(path, "rb") as f:
            ident = f.read(64)
            if len(ident) < 64 or ident[:4] != b"\x7fELF":
                raise UserError(f"{path} is not an ELF file", "give a vmlinux (or the binary the records were made for)")
            if ident[4] != 2 or ident[5] != 1:
                raise UserError(f"{path} is not a 64-bit little-endian ELF file", "branch records are made for x86-64 binaries")
            phoff, = struct.unpack_from("<Q", ident, 32)
            phentsize, phnum = struct.unpack_from("<HH", ident, 54)
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            if len(table) < phentsize * phnum:
                raise UserError(f"{path} is a truncated ELF file", "rebuild it")
            segs, notes = [], []
            for i in range(phnum):
                p_type, p_flags, p_offset, p_vaddr, _paddr, p_filesz, p_memsz, _align = struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
                if p_type == PT_LOAD and p_flags & PF_X:
                    segs.append(Segment(p_vaddr, p_memsz, p_offset))
                elif p_type == PT_NOTE:
                    f.seek(p_offset)
                    notes.append(f.read(p_filesz))
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror}", "check the path and its permissions") from None
    return Elf(next((b for n in notes if (b := notes_build_id(n))), None), tuple(segs))


def notes_build_id(notes: bytes) -> str | None:
    """The GNU build id in an ELF note section's bytes (a running kernel's /sys/kernel/notes), hex; None without one."""
    at = 0
    while at + 12 <= len(notes):
        namesz, descsz, ntype = struct.unpack_from("<III", notes, at)
        name_at = at + 12
        desc_at = name_at + (namesz + 3) // 4 * 4
        if ntype == NT_GNU_BUILD_ID and notes[name_at:name_at + namesz].rstrip(b"\0") == b"GNU":
            return notes[desc_at:desc_at + descsz].hex()
        at = desc_at + (descsz + 3) // 4 * 4
    return None


def build_id_of(path: Path) -> str:
    """The GNU build id of an ELF file, hex; a UserError when it has none (records could not be tied to it)."""
    bid = read_elf(path).build_id
    if not bid:
        raise UserError(f"{path} has no GNU build id", "link it with --build-id (the kernel's build does by default)")
    return bid


def recorded_kernel(manifest: dict, what: str) -> tuple[Path, str]:
    """The vmlinux a branch profile's manifest (profile.json) names and its build id: it must still be there and be
    the kernel the records were made on. `what` names the profile in the one-line errors ("the call graph X")."""
    candidates = [Path(str(manifest[k])) / tail for k, tail in (("vmlinux", ""), ("build_dir", "vmlinux")) if manifest.get(k)]
    vmlinux = next((c for c in candidates if c.is_file()), None)
    again = "record the branches again on a kernel that is kept (`kpgo collect BUILD_DIR --branches`)"
    if vmlinux is None:
        raise UserError(f"the kernel {what} was recorded on is gone ({candidates[0] if candidates else 'profile.json names none'})", again)
    want = str(manifest.get("build_id") or "")
    have = build_id_of(vmlinux)
    if have != want:
        raise UserError(f"{vmlinux} is not the kernel {what} was recorded on (build id {have}, the profile's {want or 'none'})", again)
    return vmlinux, have


# ---- the outputs ----

def write_bolt(records: Records, out: Path) -> dict[str, int]:
    """BOLT's pre-aggregated profile: every edge as `B from to count 0` (no mispredictions: an emulator has no
    predictor), every fall-through range as `F start end count`. Ranges whose start lies after their end (none
    expected) are left out and counted."""
    lines = [f"B {a:x} {b:x} {c} 0" for a, b, c, _ in records.edges.tolist()]
    ok = records.ranges[:, 0] <= records.ranges[:, 1]
    lines += [f"F {a:x} {b:x} {c}" for a, b, c in records.ranges[ok].tolist()]
    out.write_text("".join(ln + "\n" for ln in lines))
    return {"lines": len(lines), "ranges_left_out": int((~ok).sum()), "bytes": out.stat().st_size}


def mmap_line(elf: Path, kernel: bool) -> str:
    """The PERF_RECORD_MMAP2 line llvm-profgen maps the samples with: for a kernel, `[kernel.kallsyms]_text`
    at _text as perf names it (profgen --kernel takes the load base from it); otherwise the first executable
    segment of `elf` under the binary's own path (profgen matches it by base name)."""
    info = read_elf(elf)
    if not info.exec_segments:
        raise UserError(f"{elf} has no executable segment", "give a vmlinux (or the binary the records were made for)")
    seg = info.exec_segments[0]
    if kernel:
        syms = codesize.symbols(elf)
        text = _text_address(elf) or seg.vaddr
        end = max((f.end for f in syms.functions), default=seg.vaddr + seg.memsz)
        return f"PERF_RECORD_MMAP2 -1/0: [{text:#x}({end - text:#x}) @ {text:#x} 00:00 0 0]: r-xp {KERNEL_MMAP}"
    return (f"PERF_RECORD_MMAP2 1/1: [{seg.vaddr:#x}({seg.memsz:#x}) @ {seg.offset:#x} 00:00 0 0]: r-xp "
            f"{Path(elf).resolve()}")


def _text_address(elf: Path) -> int | None:
    from kpgo import proc

    for line in proc.capture(["nm", "--defined-only", str(elf)], timeout=300).splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[2] == KERNEL_TEXT_SYMBOL:
            return int(parts[0], 16)
    return None


def write_perf_script(records: Records, elf: Path, out: Path) -> dict[str, int]:
    """`perf script -F ip,brstack`-style text (DESIGN.md's llvm-profgen quirks): the MMAP2 line, then for each
    distinct sampled stack its repeat count on a line of its own (when above 1) and the stack: the sample's IP
    (the newest branch's target) in hex without 0x, then `0xFROM/0xTO/P/-/-/0` newest first."""
    with open(out, "w") as f:
        f.write(mmap_line(elf, records.side == "kernel") + "\n")
        for st in records.stacks:
            if not len(st.branches):
                continue
            if st.count > 1:
                f.write(f"{st.count}\n")
            pairs = " ".join(f"{a:#x}/{b:#x}/P/-/-/0" for a, b in st.branches.tolist())
            f.write(f"{int(st.branches[0, 1]):x} {pairs}\n")
    return {"stacks": len(records.stacks), "samples": sum(st.count for st in records.stacks), "bytes": out.stat().st_size}


# ---- symbols ----

class Functions:
    """Address -> function of an ELF's symbol table (kpgo.kernel.codesize: `nm -S`, t/T/w/W with a size). Aliases
    share an address: the name kept is the first of global over local, then the shortest; objtool's __pfx_
    padding symbols count as functions of their own (a branch into one is rare and says so)."""

    def __init__(self, elf: Path) -> None:
        best: dict[int, codesize.Function] = {}
        for fn in codesize.symbols(Path(elf)).functions:
            have = best.get(fn.address)
            if have is None or (fn.kind.isupper(), -len(fn.name), fn.size) > (have.kind.isupper(), -len(have.name), have.size):
                best[fn.address] = fn
        fns = sorted(best.values(), key=lambda f: f.address)
        self.names = [f.name for f in fns]
        self.starts = np.array([f.address for f in fns], dtype=np.uint64)
        self.ends = np.array([f.end for f in fns], dtype=np.uint64)

    def index(self, addrs: np.ndarray) -> np.ndarray:
        """The function index of each address, -1 where no function holds it."""
        addrs = np.asarray(addrs, dtype=np.uint64)
        i = np.searchsorted(self.starts, addrs, side="right").astype(np.int64) - 1
        inside = (i >= 0) & (addrs < self.ends[np.maximum(i, 0)])
        return np.where(inside, i, -1)

    def is_entry(self, addrs: np.ndarray) -> np.ndarray:
        i = np.searchsorted(self.starts, addrs)
        return (i < len(self.starts)) & (self.starts[np.minimum(i, len(self.starts) - 1)] == addrs)


# Speculation-mitigation thunks a kernel branches through where its source says an indirect call or jump, or a
# return (x86 retpolines, return thunks). The plugin records a branch through one as the branch it stands for
# (kpgosim.c, enum thunk): the records then say what a CPU that needs no thunk runs, and an indirect call's target
# is the function called, not the thunk. The untraining routines the entry code calls are not among them.
INDIRECT_THUNKS = re.compile(r"__x86_indirect_(call_|jump_|its_)?thunk_array")
RETURN_THUNKS = re.compile(r"__x86_return_thunk|its_return_thunk|call_depth_return_thunk|retbleed_return_thunk"
                           r"|srso_(alias_)?(return_thunk|safe_ret)")
MAX_THUNKS = 16  # the plugin's bound (kpgosim.c MAX_THUNKS)


def thunk_ranges(elf: Path) -> list[tuple[str, int, int]]:
    """The thunks of an ELF as the plugin takes them: (kind, start, end) with kind "thunk" or "return_thunk", those
    of a kind that follow one another within an alignment's padding merged into one range."""
    found = sorted(((("thunk" if INDIRECT_THUNKS.fullmatch(f.name) else "return_thunk"), f.address, f.end)
                    for f in codesize.symbols(Path(elf)).functions
                    if f.size and (INDIRECT_THUNKS.fullmatch(f.name) or RETURN_THUNKS.fullmatch(f.name))), key=lambda t: t[1])
    out: list[tuple[str, int, int]] = []
    for kind, lo, hi in found:
        if out and out[-1][0] == kind and lo <= out[-1][2] + 64:
            out[-1] = (kind, out[-1][1], max(out[-1][2], hi))
        else:
            out.append((kind, lo, hi))
    if len(out) > MAX_THUNKS:
        raise InfraError(f"{elf} has {len(out)} separate thunk ranges; kpgo's plugin takes {MAX_THUNKS} at most",
                         "report it: the kernel's thunk layout is new to kpgo")
    return out


@dataclass(frozen=True)
class CallEdge:
    caller: str
    callee: str
    calls: int  # executed calls (call instructions) from caller into callee's entry
    tail_calls: int  # jumps from caller to callee's entry (a tail call, or a jump to another function's start)


def call_graph(records: Records, fns: Functions) -> list[CallEdge]:
    """Caller -> callee from the recorded edges: a call instruction's edge, or a jump's edge that enters another
    function at its first address (a tail call). Both ends must be known functions; recursion (caller == callee)
    is kept. Sorted by count, then names. A call through a retpoline thunk is a call of its target (thunk_ranges)."""
    e = records.edges
    if not len(e):
        return []
    kind = e[:, 3]
    src, dst = fns.index(e[:, 0]), fns.index(e[:, 1])
    entry = fns.is_entry(e[:, 1])
    is_call = (kind == Kind.CALL) & entry
    is_tail = (kind == Kind.JUMP) & entry & (src != dst)
    keep = (is_call | is_tail) & (src >= 0) & (dst >= 0)
    acc: dict[tuple[int, int], list[int]] = {}
    for s, d, c, call in zip(src[keep].tolist(), dst[keep].tolist(), e[keep, 2].tolist(), is_call[keep].tolist()):
        slot = acc.setdefault((s, d), [0, 0])
        slot[0 if call else 1] += c
    edges = [CallEdge(fns.names[s], fns.names[d], v[0], v[1]) for (s, d), v in acc.items()]
    edges.sort(key=lambda x: (-(x.calls + x.tail_calls), x.caller, x.callee))
    return edges


CALL_GRAPH_HEADER = "caller\tcallee\tcalls\ttail_calls"


def write_call_graph(edges: list[CallEdge], out: Path) -> dict[str, int]:
    """One tab-separated line per caller -> callee, after a header line (CALL_GRAPH_HEADER)."""
    out.write_text(CALL_GRAPH_HEADER + "\n" + "".join(f"{e.caller}\t{e.callee}\t{e.calls}\t{e.tail_calls}\n" for e in edges))
    return {"edges": len(edges), "calls": sum(e.calls for e in edges), "tail_calls": sum(e.tail_calls for e in edges),
            "bytes": out.stat().st_size}


def read_call_graph(path: Path) -> list[CallEdge]:
    hint = "pass the callgraph.tsv of `kpgo collect --branches`"
    lines = inputs.read_text(path, hint).splitlines()
    if not lines or lines[0] != CALL_GRAPH_HEADER:
        raise UserError(f"{path} is not a kpgo call graph (no header line)", hint)
    out = []
    for n, line in enumerate(lines[1:], 2):
        parts = line.split("\t")
        if len(parts) != 4 or not parts[2].isdigit() or not parts[3].isdigit():
            raise UserError(f"{path}:{n}: not CALLER<TAB>CALLEE<TAB>CALLS<TAB>TAIL_CALLS", hint)
        out.append(CallEdge(parts[0], parts[1], int(parts[2]), int(parts[3])))
    return out


# ---- how well the sampled stacks stand for the exact records ----

def function_branches(records: Records, fns: Functions, sampled: bool = False) -> np.ndarray:
    """Per function, the taken branches whose source lies in it: exact, from the edges, or, with `sampled`, as the
    stacks estimate it (each branch sits in the ring for `depth` branches, so it is in depth/period of the samples
    on average: a sampled entry stands for period/depth branches)."""
    out = np.zeros(len(fns.names), dtype=np.float64)
    if sampled:
        if not records.stacks:
            return out
        src = np.concatenate([st.branches[:, 0] for st in records.stacks])
        w = np.concatenate([np.full(len(st.branches), st.count, dtype=np.float64) for st in records.stacks])
        w *= records.period / records.depth
    else:
        src, w = records.edges[:, 0], records.edges[:, 2].astype(np.float64)
    i = fns.index(src)
    np.add.at(out, i[i >= 0], w[i >= 0])
    return out


def _ranks(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (Spearman's convention)."""
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x), dtype=np.float64)
    sx = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sx[j + 1] == sx[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2.0
        i = j + 1
    return ranks


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    if len(a) < 2:
        return float("nan")
    ra, rb = _ranks(np.asarray(a, dtype=np.float64)), _ranks(np.asarray(b, dtype=np.float64))
    sa, sb = ra - ra.mean(), rb - rb.mean()
    den = float(np.sqrt((sa * sa).sum() * (sb * sb).sum()))
    return float((sa * sb).sum() / den) if den else float("nan")


def hot_overlap(a: np.ndarray, b: np.ndarray, share: float = 0.01) -> float:
    """|top(a) ∩ top(b)| / k, top = the k = max(1, share × non-zero entries of a) largest entries."""
    k = max(1, int(round(share * int((a > 0).sum()))))
    top_a = set(np.argsort(-a, kind="stable")[:k].tolist())
    top_b = set(np.argsort(-b, kind="stable")[:k].tolist())
    return len(top_a & top_b) / k


def sampling_match(records: Records, fns: Functions) -> dict[str, float | int]:
    """The sampled stacks' per-function branch counts against the exact ones, over the functions the exact edges
    reach: Spearman's rank correlation, cosine similarity, overlap of the hottest 1% and the share of the exact
    count in functions no sample saw."""
    exact, est = function_branches(records, fns), function_branches(records, fns, sampled=True)
    seen = exact > 0
    a, b = exact[seen], est[seen]
    den = float(np.linalg.norm(a) * np.linalg.norm(b))
    return {
        "functions": int(seen.sum()),
        "functions_sampled": int((b > 0).sum()),
        "spearman": round(spearman(a, b), 4),
        "cosine": round(float(a @ b) / den, 4) if den else float("nan"),
        "hot1pct_overlap": round(hot_overlap(a, b), 4),
        "unsampled_share": round(float(a[b == 0].sum() / a.sum()), 4) if a.sum() else float("nan"),
    }


def in_functions_share(records: Records, fns: Functions) -> float:
    """The share of recorded branches (by count) whose source on the recorded side lies in a function of the ELF:
    about 1 when the addresses are the ELF's (no KASLR offset), about 0 when they are not."""
    e = records.edges
    side_bit = np.uint64(1 << 63)
    mine = (e[:, 0] & side_bit) != 0 if records.side == "kernel" else (e[:, 0] & side_bit) == 0
    total = float(e[mine, 2].sum())
    if not total:
        return float("nan")
    return float(e[mine][fns.index(e[mine, 0]) >= 0, 2].sum()) / total


# ---- a branch profile directory ----

PROFILE_KIND = "kernel-branch-profile"
MANIFEST_SHAPE = {"kind?": str, "build_id?": (str, None), "vmlinux?": (str, None), "build_dir?": (str, None)}  # what is read of its profile.json
RECORDS_FILE = "branches.rec"  # the plugin's records, kept: every output is made from it
BOLT_FILE = "bolt.preagg"  # perf2bolt -pa -p FILE
PERF_SCRIPT_FILE = "perf.script"  # llvm-profgen --perfscript FILE [--kernel] (kpgo.afdo.PERF_SCRIPT)
CALL_GRAPH_FILE = "callgraph.tsv"
TOP = 10  # hottest functions and call edges a manifest lists
IN_FUNCTIONS_MIN = 0.5  # below: the addresses are not the ELF's (a KASLR offset, another binary)


def make_outputs(records: Records, elf: Path, out: Path) -> dict:
    """The three outputs of `records` (made for `elf`) written into the directory `out`, and what the manifest
    says of them: counts, sizes, the sampled stacks' agreement with the exact edges, the hottest functions and
    call edges. An InfraError when the recorded addresses do not fall into `elf`'s functions."""
    fns = Functions(elf)
    inside = in_functions_share(records, fns)
    if records.branches and not inside >= IN_FUNCTIONS_MIN:
        raise InfraError(f"only {inside:.1%} of the recorded branches leave from a function of {elf}: the addresses are not "
                         "this binary's (a kernel booted without nokaslr, or other code)", "record with `kpgo collect --branches`")
    graph = call_graph(records, fns)
    per_fn = function_branches(records, fns)
    hot = np.argsort(-per_fn, kind="stable")[:TOP]
    return {
        "records": records.summary(),
        "in_functions": round(inside, 6),
        "bolt": write_bolt(records, out / BOLT_FILE),
        "perf_script": write_perf_script(records, elf, out / PERF_SCRIPT_FILE),
        "call_graph": write_call_graph(graph, out / CALL_GRAPH_FILE),
        "sampling": sampling_match(records, fns),
        "hot_functions": [{"function": fns.names[i], "branches": int(per_fn[i])} for i in hot.tolist() if per_fn[i] > 0],
        "hot_calls": [{"caller": e.caller, "callee": e.callee, "calls": e.calls, "tail_calls": e.tail_calls} for e in graph[:TOP]],
    }


def read_profile(path: Path) -> dict:
    """A branch profile directory's manifest (profile.json), its records checked against the build id the manifest
    names (a one-line UserError if they differ or the file is truncated), and the sizes of its files now."""
    path = Path(path)
    hint = "give a directory written by `kpgo collect --branches`"
    if not os.path.lexists(path / "profile.json"):
        raise UserError(f"{path} holds no profile.json", hint)
    manifest = inputs.read_json(path / "profile.json", hint, MANIFEST_SHAPE)
    if manifest.get("kind") != PROFILE_KIND:
        raise UserError(f"{path} is not a branch profile (profile.json kind {manifest.get('kind')!r})", hint)
    records = read_records(path / RECORDS_FILE, manifest.get("build_id"))
    files = {}
    for name in (RECORDS_FILE, BOLT_FILE, PERF_SCRIPT_FILE, CALL_GRAPH_FILE):
        f = path / name
        if not f.is_file():
            raise UserError(f"the branch profile {path} lacks {name}", "collect it again")
        files[name] = f.stat().st_size
    return dict(manifest, records=records.summary(), files=files)


def read_inputs(inputs: Sequence[Path], out: Path, weights: Sequence[float] | None, kernel: str) -> tuple[list[dict], list[float], Path, str]:
    """What a step made from several branch profiles of one kernel checks first (`kpgo profile merge` of branch
    profiles, `kpgo profile afdo`): inputs given, one positive weight each (all 1 without), `out` free, every manifest
    read with its records checked, one build id among them and that kernel still there. Their manifests, the weights,
    the vmlinux and its build id; one-line UserErrors. `kernel` names the kernel they must share in the hint."""
    from kpgo import atomic

    if not inputs:
        raise UserError("no branch profile given", "pass one or more directories from `kpgo collect BUILD --branches`")
    weights = list(weights) if weights is not None else [1.0] * len(inputs)
    if len(weights) != len(inputs) or any(not w > 0 for w in weights):
        raise UserError(f"--weights needs {len(inputs)} positive numbers, one per input", "e.g. --weights 1,2")
    atomic.check_output(out, inputs=inputs)
    manifests = [read_profile(p) for p in inputs]
    ids = {str(m.get("build_id")) for m in manifests}
    if len(ids) != 1:
        raise UserError("the branch profiles were recorded on different kernels (build ids " + ", ".join(sorted(ids)) + ")",
                        f"merge the records of one {kernel}")
    vmlinux, build_id = recorded_kernel(manifests[0], f"the branch profile {inputs[0]}")
    return manifests, weights, vmlinux, build_id


def _workload_name(manifest: dict) -> str | None:
    wl = manifest.get("workload")
    return wl.get("name") if isinstance(wl, dict) and isinstance(wl.get("name"), str) else None


def merge(inputs: list[Path], out: Path, weights: list[float] | None = None, normalize: bool = False) -> dict:
    """The branch profiles `inputs`, recorded on one kernel, merged into the new profile directory `out` (a universal
    layout profile): edges, ranges and sampled stacks summed, input i's counts times weights[i] and, with
    `normalize`, times the most recorded branches of any input over its own (so each weighs as much as the others,
    as `kpgo profile merge --normalize` weighs gcov profiles); BOLT's profile, the perf script and the call graph are
    made from the merged records. Its manifest is returned."""
    import time

    from kpgo import atomic

    manifests, weights, vmlinux, build_id = read_inputs(inputs, out, weights, "kernel")
    parts = [read_records(Path(p) / RECORDS_FILE, build_id) for p in inputs]
    most = max(r.branches for r in parts)
    factors = [w * (most / r.branches if normalize and r.branches else 1.0) for w, r in zip(weights, parts)]
    merged = merge_records(parts, factors)
    first = manifests[0]
    with atomic.output_dir(out) as tmp:
        write_records(merged, tmp / RECORDS_FILE)
        outputs = make_outputs(read_records(tmp / RECORDS_FILE, build_id), vmlinux, tmp)
        manifest = {
            "kind": PROFILE_KIND,
            "build_id": build_id,
            "vmlinux": str(vmlinux),
            **{k: first[k] for k in ("kernel_release", "config_name", "build_dir", "build_key", "variant") if first.get(k) is not None},
            "merged": {"inputs": [{"dir": str(Path(p).resolve()), "workload": _workload_name(m),
                                   "collected_at": m.get("collected_at"), "branches": r.branches, "weight": w, "factor": round(f, 6)}
                                  for p, m, r, w, f in zip(inputs, manifests, parts, weights, factors)],
                       "normalize": normalize},
            **outputs,
            "collected_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        manifest["files"] = {p.name: p.stat().st_size for p in sorted(tmp.iterdir()) if p.is_file()}
        atomic.write_json(tmp / "profile.json", manifest)
    return manifest
