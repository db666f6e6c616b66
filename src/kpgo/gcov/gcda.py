"""Pure reader/writer of GCC coverage data files (.gcda), GCC 9–14 layouts.

A .gcda file is a sequence of 32-bit words in the byte order of the machine that wrote it (found from the magic):

    header:  magic "gcda", version, stamp [, checksum (GCC >= 12)]
    record:  tag, length, payload words
    counter: 64-bit, stored as two words, low word first

The layout is chosen from the file's version word (e.g. "B22*" = GCC 12.2): record lengths count words before
GCC 12 and bytes from GCC 12, and GCC 12 added the header checksum word. From GCC 12, libgcov and gcov-tool write a
counter record whose counters are all zero with a *negative* length and no payload; the Linux kernel never does.
The object summary (tag 0xa1000000) holds runs and sum_max as two 32-bit words in every supported layout.

API
    parse_gcda(data, name) -> Gcda          parse bytes; any defect raises GcovFormatError (a UserError) naming `name`
    read_gcda(path, name=None) -> Gcda      read and parse a file
    Gcda.to_bytes() -> bytes                rebuild the file from the parsed model (parse -> to_bytes is byte-identical)
    Gcda.counters(kind=ARCS) -> ndarray     all counters of one kind, in file order (uint64)
    Gcda.with_counters(kind, values)        copy with that kind's counters replaced
    Gcda.summary -> Summary | None          the object summary, if present
    Gcda.with_summary(runs, sum_max)        copy whose only summary is (runs, sum_max), placed after the header
    Gcda.without_summary()                  copy without summary records (the shape the kernel writes)
    Gcda.functions() -> list[Function]      per-function view: ident, checksums, counters by kind
    layout_for_version(version, name) -> Layout
    version_text(version) -> str            the version word as text, e.g. "B22*"

This is the per-file model, the reference for everything else. Whole profiles are read faster by kpgo.gcov.image,
which falls back to this parser for any file it does not take.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kpgo.errors import UserError

GCDA_MAGIC = 0x67636461  # "gcda"
GCNO_MAGIC = 0x67636E6F  # "gcno"

TAG_FUNCTION = 0x01000000
TAG_COUNTER_BASE = 0x01A10000
TAG_OBJECT_SUMMARY = 0xA1000000
TAG_PROGRAM_SUMMARY = 0xA3000000  # obsolete, kept as an opaque record

ARCS = 0  # counter kind of arc (edge) counters in every layout

MIN_MAJOR, MAX_MAJOR = 9, 14

_NATIVE = "<" if sys.byteorder == "little" else ">"


# What a user does about a damaged coverage file: it cannot be repaired, only made again.
DAMAGED_HINT = "collect the profile again (`kpgo collect`), or remove the damaged file from the profile"
DAMAGED_GCNO_HINT = "build the instrumented kernel again (`kpgo build --variant instrumented`)"


class GcovFormatError(UserError):
    """A coverage file that cannot be read: the message names the file and the defect (and the next step)."""

    def __init__(self, name: str, problem: str, hint: str | None = None) -> None:
        super().__init__(f"{name}: {problem}", hint or (DAMAGED_GCNO_HINT if name.endswith(".gcno") else DAMAGED_HINT))
        self.name = name
        self.problem = problem


def counter_tag(kind: int) -> int:
    return TAG_COUNTER_BASE + (kind << 17)


def counter_kind(tag: int) -> int | None:
    """The counter kind of a counter tag, None for any other tag."""
    if tag & 0xFFFF or tag < TAG_COUNTER_BASE or tag >= TAG_COUNTER_BASE + (32 << 17):
        return None
    if (tag - TAG_COUNTER_BASE) & 0x1FFFF:
        return None
    return (tag - TAG_COUNTER_BASE) >> 17


@dataclass(frozen=True)
class Layout:
    major: int
    byte_lengths: bool  # record lengths count bytes (GCC >= 12) instead of words
    header_checksum: bool  # header has a checksum word after the stamp (GCC >= 12)
    counter_kinds: tuple[str, ...]  # counter names by kind, from that GCC's gcov-counter.def

    @property
    def unit(self) -> int:
        """Length units per 32-bit word."""
        return 4 if self.byte_lengths else 1

    @property
    def header_words(self) -> int:
        return 4 if self.header_checksum else 3

    def kind_name(self, kind: int) -> str:
        return self.counter_kinds[kind] if kind < len(self.counter_kinds) else f"kind{kind}"


_KINDS_9 = ("arcs", "interval", "pow2", "single", "indirect_call", "average", "ior", "time_profiler")
_KINDS_10 = ("arcs", "interval", "pow2", "topn", "indirect_call", "average", "ior", "time_profiler")
_KINDS_14 = _KINDS_10 + ("conditions",)


def _layout(major: int) -> Layout:
    kinds = _KINDS_9 if major == 9 else _KINDS_14 if major >= 14 else _KINDS_10
    return Layout(major=major, byte_lengths=major >= 12, header_checksum=major >= 12, counter_kinds=kinds)


_LAYOUTS = {m: _layout(m) for m in range(MIN_MAJOR, MAX_MAJOR + 1)}


def version_text(version: int) -> str:
    """The version word as its four characters ("B22*"), or hex when not printable."""
    raw = version.to_bytes(4, "big")
    if all(0x20 < b < 0x7F for b in raw):
        return raw.decode("ascii")
    return f"0x{version:08x}"


def gcc_major(version: int) -> int | None:
    """GCC major version encoded in a version word: 'A'..'Z' tens, then a digit ("B22*" -> 12)."""
    tens, ones = (version >> 24) & 0xFF, (version >> 16) & 0xFF
    if not (ord("A") <= tens <= ord("Z") and ord("0") <= ones <= ord("9")):
        return None
    return (tens - ord("A")) * 10 + (ones - ord("0"))


def layout_for_version(version: int, name: str) -> Layout:
    major = gcc_major(version)
    if major is None or major not in _LAYOUTS:
        which = f" (GCC {major})" if major is not None else ""
        raise GcovFormatError(
            name, f"unsupported gcov version '{version_text(version)}'{which}; kpgo reads files of GCC 9 to 14"
        )
    return _LAYOUTS[major]


@dataclass(frozen=True)
class Summary:
    runs: int
    sum_max: int


@dataclass
class Function:
    ident: int | None  # None for an empty FUNCTION record (function not emitted in this unit)
    lineno_checksum: int
    cfg_checksum: int
    counters: dict[int, np.ndarray] = field(default_factory=dict)  # kind -> uint64 values


def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), without a Python loop."""
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    excl = np.cumsum(sizes) - sizes
    return np.repeat(starts - excl, sizes) + np.arange(total, dtype=np.int64)


@dataclass(eq=False)
class Gcda:
    """A parsed .gcda: header fields and the record table over one array of payload words.

    Record i has tag tags[i], the raw length word lengths[i] and payload payload[offsets[i]:offsets[i+1]]."""

    name: str
    layout: Layout
    byteorder: str  # "<" or ">", as in the file
    version: int
    stamp: int
    checksum: int | None  # header checksum word (GCC >= 12), None before
    tags: np.ndarray  # uint32 (n,)
    lengths: np.ndarray  # uint32 (n,), as stored (may encode a negative length)
    offsets: np.ndarray  # int64 (n + 1,)
    payload: np.ndarray  # uint32, native byte order
    trailer: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.uint32))  # from an end marker (tag 0) on

    # -- whole-file views ------------------------------------------------------------------------------------
    @property
    def version_text(self) -> str:
        return version_text(self.version)

    def __len__(self) -> int:
        return len(self.tags)

    def _copy(self, **changes: object) -> Gcda:
        fields = dict(
            name=self.name, layout=self.layout, byteorder=self.byteorder, version=self.version, stamp=self.stamp,
            checksum=self.checksum, tags=self.tags, lengths=self.lengths, offsets=self.offsets,
            payload=self.payload, trailer=self.trailer,
        )
        fields.update(changes)
        return Gcda(**fields)  # type: ignore[arg-type]

    def _header(self) -> list[int]:
        head = [GCDA_MAGIC, self.version, self.stamp]
        if self.layout.header_checksum:
            head.append(self.checksum or 0)
        return head

    def to_bytes(self) -> bytes:
        """Rebuild the file: header, then for each record its tag, length and payload, then any trailer."""
        head = self._header()
        n = len(self.tags)
        sizes = np.diff(self.offsets)
        body_len = 2 * n + len(self.payload)
        out = np.empty(len(head) + body_len + len(self.trailer), dtype=np.uint32)
        out[: len(head)] = head
        hpos = len(head) + 2 * np.arange(n, dtype=np.int64) + self.offsets[:-1]
        out[hpos] = self.tags
        out[hpos + 1] = self.lengths
        out[_ranges(hpos + 2, sizes)] = self.payload
        out[len(head) + body_len :] = self.trailer
        return out.astype(self.byteorder + "u4", copy=False).tobytes()

    # -- counters --------------------------------------------------------------------------------------------
    def _counter_records(self, kind: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Indices of the records of `kind`, their counter counts, and which are negative-length (all zero)."""
        sel = np.flatnonzero(self.tags == counter_tag(kind))
        lengths = self.lengths[sel].astype(np.int64)
        negative = lengths >= 1 << 31
        words = np.where(negative, ((1 << 32) - lengths) // self.layout.unit, np.diff(self.offsets)[sel])
        return sel, words // 2, negative

    def counters(self, kind: int = ARCS) -> np.ndarray:
        """All counters of one kind, concatenated in file order; negative-length records count as zeros."""
        sel, counts, negative = self._counter_records(kind)
        if not negative.any():
            idx = _ranges(self.offsets[sel], counts * 2)
            return self.payload[idx[0::2]].astype(np.uint64) | (self.payload[idx[1::2]].astype(np.uint64) << 32)
        values = np.zeros(int(counts.sum()), dtype=np.uint64)
        stored = ~negative
        idx = _ranges(self.offsets[sel[stored]], counts[stored] * 2)
        dst = _ranges((np.cumsum(counts) - counts)[stored], counts[stored])
        values[dst] = self.payload[idx[0::2]].astype(np.uint64) | (self.payload[idx[1::2]].astype(np.uint64) << 32)
        return values

    def all_zero(self) -> bool:
        """True when every counter of every kind is zero (the object never ran in the profiled window)."""
        kinds = {int(t - TAG_COUNTER_BASE) >> 17 for t in self.tags.tolist() if TAG_COUNTER_BASE <= t < TAG_COUNTER_BASE + (32 << 17)}
        return not any(self.counters(k).any() for k in kinds)

    def counter_count(self, kind: int = ARCS) -> int:
        return int(self._counter_records(kind)[1].sum())

    def counter_kinds_present(self) -> set[int]:
        kinds = set()
        for tag in set(self.tags.tolist()):
            k = counter_kind(tag)
            if k is not None:
                kinds.add(k)
        return kinds

    def with_counters(self, kind: int, values: np.ndarray) -> Gcda:
        """Copy with the counters of `kind` replaced by `values` (same count, file order).

        A negative-length record stays so while its counters stay zero and gets its payload back otherwise; a
        stored record keeps its payload even when all zero (as the kernel writes it)."""
        values = np.asarray(values, dtype=np.uint64)
        sel, counts, negative = self._counter_records(kind)
        if len(values) != int(counts.sum()):
            raise ValueError(f"{self.name}: {len(values)} counters given, the file has {int(counts.sum())}")
        lo = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        hi = (values >> np.uint64(32)).astype(np.uint32)
        if not negative.any():
            payload = self.payload.copy()
            idx = _ranges(self.offsets[sel], counts * 2)
            payload[idx[0::2]] = lo
            payload[idx[1::2]] = hi
            return self._copy(payload=payload)
        # Rare path (libgcov-written files): rebuild record by record.
        starts = np.cumsum(counts) - counts
        new_payloads = [self.payload[self.offsets[i] : self.offsets[i + 1]] for i in range(len(self.tags))]
        lengths = self.lengths.copy()
        for j, rec in enumerate(sel.tolist()):
            a, b = int(starts[j]), int(starts[j] + counts[j])
            if negative[j] and not values[a:b].any():
                continue
            words = np.empty(2 * (b - a), dtype=np.uint32)
            words[0::2], words[1::2] = lo[a:b], hi[a:b]
            new_payloads[rec] = words
            lengths[rec] = len(words) * self.layout.unit
        return self._with_payloads(lengths, new_payloads)

    def _with_payloads(self, lengths: np.ndarray, payloads: list[np.ndarray]) -> Gcda:
        sizes = np.array([len(p) for p in payloads], dtype=np.int64)
        offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        payload = np.concatenate(payloads) if payloads else np.zeros(0, dtype=np.uint32)
        return self._copy(lengths=lengths, offsets=offsets, payload=payload.astype(np.uint32, copy=False))

    # -- summary ---------------------------------------------------------------------------------------------
    @property
    def summary(self) -> Summary | None:
        sel = np.flatnonzero(self.tags == TAG_OBJECT_SUMMARY)
        for i in sel.tolist():
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            if b - a >= 2:
                return Summary(runs=int(self.payload[a]), sum_max=int(self.payload[a + 1]))
        return None

    def without_summary(self) -> Gcda:
        keep = np.flatnonzero(self.tags != TAG_OBJECT_SUMMARY)
        if len(keep) == len(self.tags):
            return self
        sizes = np.diff(self.offsets)[keep]
        offsets = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        payload = self.payload[_ranges(self.offsets[keep], sizes)]
        return self._copy(tags=self.tags[keep], lengths=self.lengths[keep], offsets=offsets, payload=payload)

    def with_summary(self, runs: int, sum_max: int) -> Gcda:
        """Copy whose only object summary is (runs, sum_max), first after the header as libgcov writes it.

        Both are 32-bit words in the file; values above 2**32-1 are clamped (GCC reads sum_max as 32 bits)."""
        base = self.without_summary()
        cap = 0xFFFFFFFF
        tags = np.concatenate([np.array([TAG_OBJECT_SUMMARY], dtype=np.uint32), base.tags])
        lengths = np.concatenate([np.array([2 * self.layout.unit], dtype=np.uint32), base.lengths])
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), base.offsets + 2])
        words = np.array([min(runs, cap), min(sum_max, cap)], dtype=np.uint32)
        payload = np.concatenate([words, base.payload])
        return base._copy(tags=tags, lengths=lengths, offsets=offsets, payload=payload)

    # -- per-function view -----------------------------------------------------------------------------------
    def functions(self) -> list[Function]:
        """Functions in file order with their counters; counter records before any FUNCTION are ignored."""
        out: list[Function] = []
        cur: Function | None = None
        tags = self.tags.tolist()
        lengths = self.lengths.tolist()
        offsets = self.offsets.tolist()
        unit = self.layout.unit
        for i, tag in enumerate(tags):
            a, b = offsets[i], offsets[i + 1]
            if tag == TAG_FUNCTION:
                if b - a >= 3:
                    w = self.payload[a : a + 3].tolist()
                    cur = Function(ident=w[0], lineno_checksum=w[1], cfg_checksum=w[2])
                else:
                    cur = Function(ident=None, lineno_checksum=0, cfg_checksum=0)
                out.append(cur)
                continue
            kind = counter_kind(tag)
            if kind is None or cur is None:
                continue
            if lengths[i] >= 1 << 31:
                vals = np.zeros(((1 << 32) - lengths[i]) // unit // 2, dtype=np.uint64)
            else:
                w = self.payload[a:b]
                vals = w[0::2].astype(np.uint64) | (w[1::2].astype(np.uint64) << 32)
            cur.counters[kind] = vals
        return out


_MAGICS = {"gcda": (GCDA_MAGIC, ".gcda data file"), "gcno": (GCNO_MAGIC, ".gcno notes file")}


def byte_order(head: bytes, name: str, kind: str) -> str:
    """'<' or '>' from the magic word of a file of `kind` ("gcda" or "gcno"); the other kind, or
    anything else, is a GcovFormatError naming `name`."""
    magic, what = _MAGICS[kind]
    if head == magic.to_bytes(4, "little"):
        return "<"
    if head == magic.to_bytes(4, "big"):
        return ">"
    for other, (other_magic, other_what) in _MAGICS.items():
        if other != kind and head in (other_magic.to_bytes(4, "little"), other_magic.to_bytes(4, "big")):
            raise GcovFormatError(name, f"is a {other_what}, not a {what}")
    raise GcovFormatError(name, f"not a .{kind} file (magic bytes {head.hex()}, expected '{kind}')")


def parse_gcda(data: bytes, name: str) -> Gcda:
    """Parse a whole .gcda file. Every defect is a GcovFormatError naming `name` and the byte offset."""
    if len(data) == 0:
        raise GcovFormatError(name, "empty file (a .gcda has at least a 12-byte header)")
    if len(data) < 12:
        raise GcovFormatError(name, f"truncated header ({len(data)} bytes)")
    order = byte_order(data[:4], name, "gcda")
    version = int.from_bytes(data[4:8], "little" if order == "<" else "big")
    layout = layout_for_version(version, name)
    if len(data) % 4:
        raise GcovFormatError(name, f"truncated: size {len(data)} is not a multiple of 4 bytes")
    nwords = len(data) // 4
    if nwords < layout.header_words:
        raise GcovFormatError(name, f"truncated header ({len(data)} bytes)")
    words = np.frombuffer(data, dtype=order + "u4")
    if order != _NATIVE:
        words = words.astype(np.uint32)
    hw = layout.header_words
    stamp = int(words[2])
    checksum = int(words[3]) if layout.header_checksum else None
    shift = 2 if layout.byte_lengths else 0
    unit = layout.unit
    # Record walk as pointer chasing: the would-be next record position for every word, computed at once; the
    # Python loop then only follows the chain. Negative lengths (>= 2**31) mean no payload.
    lens = words[hw + 1 :].astype(np.int64)
    step = np.where(lens >= 1 << 31, 2, 2 + (lens >> shift))
    nxt = (np.arange(hw, hw + len(step), dtype=np.int64) + step).tolist()
    hpos: list[int] = []
    add = hpos.append
    pos = hw
    last = nwords - 1  # a header needs two words
    while pos < last:
        add(pos)
        pos = nxt[pos - hw]
    hp = np.array(hpos, dtype=np.int64)
    tags = words[hp]
    end = nwords
    zero = np.flatnonzero(tags == 0)
    if len(zero):  # end-of-file marker (libgcov writes one zero word): keep it and what follows verbatim
        end = int(hp[zero[0]])
        hp = hp[: zero[0]]
        tags = tags[: zero[0]]
    elif pos == last:
        if words[pos] == 0:
            end = pos
        else:
            raise GcovFormatError(name, f"truncated record header at byte {pos * 4}")
    lengths = words[hp + 1]
    negative = lengths >= 1 << 31
    if negative.any():
        for i in np.flatnonzero(negative).tolist():
            tag, length = int(tags[i]), int(lengths[i])
            if counter_kind(tag) is None:
                raise GcovFormatError(name, f"record 0x{tag:08x} at byte {int(hp[i]) * 4} runs past the end of "
                                            f"the file (length {length << (2 - shift)} bytes)")
            if ((1 << 32) - length) % (2 * unit):
                raise GcovFormatError(name, f"record 0x{tag:08x} at byte {int(hp[i]) * 4} has a bad negative length")
    if unit > 1:
        bad = np.flatnonzero(~negative & ((lengths & 3) != 0))
        if len(bad):
            i = int(bad[0])
            raise GcovFormatError(name, f"record 0x{int(tags[i]):08x} at byte {int(hp[i]) * 4} has length "
                                        f"{int(lengths[i])}, not a multiple of 4 bytes")
    if len(hp) and end == nwords and pos > nwords:
        i = len(hp) - 1
        raise GcovFormatError(
            name,
            f"record 0x{int(tags[i]):08x} at byte {int(hp[i]) * 4} runs past the end of the file "
            f"(length {int(lengths[i]) << (2 - shift)} bytes, {(nwords - int(hp[i]) - 2) * 4} left)",
        )
    _check_record_sizes(name, tags, hp, np.where(negative, 0, lengths.astype(np.int64) >> shift), negative)
    body = words[:end]
    tags = tags.astype(np.uint32)
    lengths = lengths.astype(np.uint32)
    mask = np.ones(len(body), dtype=bool)
    mask[: layout.header_words] = False
    mask[hp] = False
    mask[hp + 1] = False
    payload = body[mask].astype(np.uint32)
    # Payload offsets: record i's payload starts after its header, minus the headers before it.
    offsets = np.empty(len(hp) + 1, dtype=np.int64)
    offsets[:-1] = hp + 2 - layout.header_words - 2 * (np.arange(len(hp), dtype=np.int64) + 1)
    offsets[-1] = len(payload)
    return Gcda(
        name=name, layout=layout, byteorder=order, version=version, stamp=stamp, checksum=checksum,
        tags=tags, lengths=lengths, offsets=offsets, payload=payload, trailer=words[end:].astype(np.uint32),
    )


def _check_record_sizes(name: str, tags: np.ndarray, hp: np.ndarray, words: np.ndarray, negative: np.ndarray) -> None:
    """Records whose size no GCC writes: a counter record holding half a counter (counters are two words), an
    object summary that is not (runs, sum_max). GCC would read such a file out of step and use wrong counts."""
    ctr = (tags >= TAG_COUNTER_BASE) & (tags < TAG_COUNTER_BASE + (32 << 17)) & ((tags & 0xFFFF) == 0) & ~negative
    odd = np.flatnonzero(ctr & (words % 2 == 1))
    if len(odd):
        i = int(odd[0])
        raise GcovFormatError(name, f"counter record 0x{int(tags[i]):08x} at byte {int(hp[i]) * 4} holds {int(words[i])} "
                                    "words, an impossible count (each counter takes two)")
    bad = np.flatnonzero((tags == TAG_OBJECT_SUMMARY) & (words != 2))
    if len(bad):
        i = int(bad[0])
        n = int(words[i])
        raise GcovFormatError(name, f"object summary at byte {int(hp[i]) * 4} holds {n} word{'' if n == 1 else 's'}, "
                                    "not the two (runs, sum_max) GCC reads")


def summary_bytes(g: Gcda, data: bytes, runs: int, sum_max: int) -> bytes:
    """The bytes of `data` (the file g was parsed from, possibly with changed counters in place) with one object
    summary (runs, sum_max) right after the header: a splice, no rebuild. Same result as
    g.with_summary(runs, sum_max).to_bytes() when data is g's file."""
    cap = 0xFFFFFFFF
    dt = np.dtype(g.byteorder + "u4")
    if np.any(g.tags == TAG_OBJECT_SUMMARY):
        return g.with_summary(runs, sum_max).to_bytes() if data == g.to_bytes() else _rebuild_summary(g, data,
                                                                                                      runs, sum_max)
    hb = 4 * g.layout.header_words
    rec = np.array([TAG_OBJECT_SUMMARY, 2 * g.layout.unit, min(runs, cap), min(sum_max, cap)], dtype=dt).tobytes()
    return data[:hb] + rec + data[hb:]


def _rebuild_summary(g: Gcda, data: bytes, runs: int, sum_max: int) -> bytes:
    return parse_gcda(data, g.name).with_summary(runs, sum_max).to_bytes()


def read_gcda(path: Path | str, name: str | None = None) -> Gcda:
    path = Path(path)
    data = path.read_bytes()
    return parse_gcda(data, name or str(path))
