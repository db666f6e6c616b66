"""GCC coverage data files (.gcda) of GCC 9-14: the format, its one parser, the per-file model and the summary
record. Every other module reads and writes .gcda through this one.

A .gcda file is a sequence of 32-bit words in the byte order of the machine that wrote it (found from the magic):

    header:  magic "gcda", version, stamp [, checksum (GCC >= 12)]
    record:  tag, length, payload words
    counter: 64-bit, stored as two words, low word first

The layout is chosen from the file's version word (e.g. "B22*" = GCC 12.2): record lengths count words before
GCC 12 and bytes from GCC 12, and GCC 12 added the header checksum word. From GCC 12, libgcov and gcov-tool write a
counter record whose counters are all zero with a *negative* length and no payload; the Linux kernel never does.
The object summary (tag 0xa1000000) holds runs and sum_max as two 32-bit words in every supported layout.
Value profiles (-fprofile-values) add counter kinds 1-7; the top-N kinds of GCC >= 11 (topn, indirect_call) hold
sites of variable length - per site its total, the number n <= 32 of (value, count) pairs, then the pairs - which the
parser follows (follow_sites) and checks: a site whose n is negative, above 32 or past its record's end is a defect.

The parser takes the files of one buffer (a whole profile read by kpgo.gcov.image, or one file) and checks and
indexes them all at once with numpy (index_image). A file takes that path when its layout is verified cheaply:

    magic "gcda" in the machine's byte order (little-endian machines only), a supported version word, a size that
    is a multiple of 4 holding at least the header, and a chain of records of known tags (FUNCTION, counters of
    kinds 0-8, summaries) with non-negative lengths that starts right after the header and ends exactly at the end
    of the file or at a zero word (libgcov's end marker, kept verbatim with what follows it), and whose top-N
    records hold well-formed sites (followed for all records of the profile together, a site of each per round).

The chain is checked without walking it: every word that could be a record tag (low 16 bits zero, in the set of
known tags) is a candidate; the file passes when its candidates are exactly its record chain - the first one right
after the header, each record's end the next candidate, the last one's end the end of the file or an end marker.
Files the kernel writes always pass. Any other file (another byte order, negative lengths, a counter value that
looks like a tag, a defect) is read by walking its record chain (walk_gcda, through Index.gcda), which gives the
same records or a GcovFormatError naming the file and the defect. parse_gcda is the same parser on a buffer of one
file.

API
    parse_gcda(data, name) -> Gcda          parse bytes; any defect raises GcovFormatError (a UserError) naming `name`
    read_gcda(path, name=None) -> Gcda      read and parse a file
    index_image(image) -> Index             check and index every file of an Image at once
    Index.gcda(k) -> Gcda                   file k as the per-file model (walked when it did not pass)
    walk_gcda(data, name) -> Gcda           the walk alone (the reference the tests hold the whole-profile check to)
    Gcda.to_bytes() -> bytes                rebuild the file from the parsed model (parse -> to_bytes is byte-identical)
    Gcda.counters(kind=ARCS) -> ndarray     all counters of one kind, in file order (uint64)
    Gcda.with_counters(kind, values)        copy with that kind's counters replaced
    Gcda.summary -> Summary | None          the object summary, if present
    Gcda.with_summary(runs, sum_max)        copy whose only summary is (runs, sum_max), placed after the header
    Gcda.without_summary()                  copy without summary records (the shape the kernel writes)
    Gcda.functions() -> list[Function]      per-function view: ident, checksums, counters by kind
    Gcda.sites(kind) -> Sites               the top-N sites of a kind: totals and (value, count) pairs, file order
    Gcda.with_sites(kind, sites)            copy with that kind's records rebuilt from the sites (lengths follow)
    Index.sites(record_mask) -> Sites       the sites of the selected top-N records of the fast files, at once
    follow_sites(words, starts, ends)       the site chain of top-N records, and the first defect of each
    summary_record(unit, runs, sum_max)     the object summary record as GCC writes it
    layout_for_version(version, name) -> Layout
    version_text(version) -> str            the version word as text, e.g. "B22*"
    gcov_version_prefix(gcc) -> str         what the version word of files a GCC writes starts with ("12.2.0" -> "B22")
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from kpgo import inputs
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
_LITTLE = sys.byteorder == "little"


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


ARCS_TAG = counter_tag(ARCS)
# The tags the whole-profile check takes as record candidates; a file with any other record is walked.
KNOWN_TAGS = np.array(
    sorted({TAG_FUNCTION, TAG_OBJECT_SUMMARY, TAG_PROGRAM_SUMMARY} | {counter_tag(k) for k in range(9)}),
    dtype=np.uint32,
)
_KNOWN_HIGH = np.zeros(1 << 16, dtype=bool)  # by high half: the low half of every known tag is zero
_KNOWN_HIGH[KNOWN_TAGS >> 16] = True


@dataclass(frozen=True)
class Layout:
    major: int
    byte_lengths: bool  # record lengths count bytes (GCC >= 12) instead of words
    header_checksum: bool  # header has a checksum word after the stamp (GCC >= 12)
    counter_kinds: tuple[str, ...]  # counter names by kind, from that GCC's gcov-counter.def
    topn_kinds: frozenset[int] = frozenset()  # kinds whose records are top-N sites of variable length (GCC >= 11)

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


# Top-N counters (GCC >= 11, libgcov-driver.c write_top_counters): each site is its total (executions, negative when
# a merge dropped values), the number n of (value, count) pairs, then the pairs; GCC tracks at most 32 values a site.
# GCC 10 wrote top-N sites of a fixed size and GCC 9 "single" ones: both are plain counter records to kpgo.
TOPN_KINDS = frozenset({3, 4})  # topn, indirect_call
TOPN_MAX_VALUES = 32  # GCOV_TOPN_MAXIMUM_TRACKED_VALUES


def _layout(major: int) -> Layout:
    kinds = _KINDS_9 if major == 9 else _KINDS_14 if major >= 14 else _KINDS_10
    return Layout(major=major, byte_lengths=major >= 12, header_checksum=major >= 12, counter_kinds=kinds,
                  topn_kinds=TOPN_KINDS if major >= 11 else frozenset())


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


def gcov_version_prefix(gcc: str) -> str:
    """The first characters of the version word a GCC writes, from its version string ("12.2.0" -> "B22": tens of
    the major as a letter, its last digit, the minor); "" when `gcc` does not start with a number. The word's last
    character (the release status) is not in the version string."""
    major, _, rest = gcc.partition(".")
    if not major.isdigit():
        return ""
    return f"{chr(ord('A') + int(major) // 10)}{int(major) % 10}{rest.partition('.')[0]}"


def _layout_of(version: int) -> Layout | None:
    major = gcc_major(version)
    return _LAYOUTS.get(major) if major is not None else None


def layout_for_version(version: int, name: str) -> Layout:
    layout = _layout_of(version)
    if layout is None:
        major = gcc_major(version)
        which = f" (GCC {major})" if major is not None else ""
        raise GcovFormatError(
            name, f"unsupported gcov version '{version_text(version)}'{which}; kpgo reads files of GCC 9 to 14"
        )
    return layout


def summary_record(unit: int, runs: int, sum_max: int) -> np.ndarray:
    """The object summary record as GCC writes it: tag, length (2 words, in the layout's `unit`s), runs and sum_max.
    Both are 32-bit words in the file; larger values are clamped (GCC reads sum_max as 32 bits)."""
    cap = 0xFFFFFFFF
    return np.array([TAG_OBJECT_SUMMARY, 2 * unit, min(runs, cap), min(sum_max, cap)], dtype=np.uint32)


# Record sizes no GCC writes: a counter record holding half a counter (counters are two words), an object summary
# that is not (runs, sum_max). GCC would read such a file out of step and use wrong counts.
def _half_counter(tags: np.ndarray, plen: np.ndarray) -> np.ndarray:
    ctr = (tags >= TAG_COUNTER_BASE) & (tags < TAG_COUNTER_BASE + (32 << 17)) & ((tags & 0xFFFF) == 0)
    return ctr & (plen % 2 == 1)


def _bad_summary(tags: np.ndarray, plen: np.ndarray) -> np.ndarray:
    return (tags == TAG_OBJECT_SUMMARY) & (plen != 2)


# -- 64-bit counters in 32-bit words ---------------------------------------------------------------------------

def _ranges(starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Concatenation of arange(s, s + n) for each (s, n), without a Python loop."""
    total = int(sizes.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    excl = np.cumsum(sizes) - sizes
    return np.repeat(starts - excl, sizes) + np.arange(total, dtype=np.int64)


def pair_positions(starts: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Concatenation of starts[i] + 2*arange(pairs[i]): the low words of consecutive 64-bit counters."""
    total = int(pairs.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    excl = np.cumsum(pairs) - pairs
    out = np.repeat(starts - 2 * excl, pairs)
    out += 2 * np.arange(total, dtype=np.int64)
    return out


def counter_values(words: np.ndarray, lo: np.ndarray) -> np.ndarray:
    """64-bit counters whose low words are at positions lo (high word follows)."""
    return words[lo].astype(np.uint64) | (words[lo + 1].astype(np.uint64) << np.uint64(32))


def store_counters(words: np.ndarray, lo: np.ndarray, values: np.ndarray) -> None:
    """Write 64-bit counters at positions lo (low word) and lo + 1 (high word)."""
    words[lo] = (values & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    words[lo + 1] = (values >> np.uint64(32)).astype(np.uint32)


# -- top-N sites: variable-length, followed a site at a time ------------------------------------------------------

@dataclass(frozen=True)
class SiteChain:
    """The sites of some top-N records, in position order, and the first defect of each record that has one."""

    pos: np.ndarray  # int64, word position of each site (the low word of its total)
    rec: np.ndarray  # int64, its record (index into the records followed)
    n: np.ndarray  # int64, its number of (value, count) pairs
    defects: dict[int, tuple[int, int, str]]  # record -> (site index, word position, problem); its sites left out


def _signed(lo: int, hi: int) -> int:
    v = (hi << 32) | lo
    return v - (1 << 64) if v >= 1 << 63 else v


def follow_sites(words: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> SiteChain:
    """Follow the sites of top-N records whose payloads are words[starts[r]:ends[r]]: each site is its total, n, then
    n (value, count) pairs, 64-bit each, and the sites fill the record exactly. All records are followed together,
    one site of each per round (rounds: the most sites of one record), so a profile costs a few array operations
    per round, not a Python step per site. A site whose n is negative or above TOPN_MAX_VALUES, or that runs past
    its record's end, is the record's defect."""
    starts = np.asarray(starts, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    cur = starts.copy()
    index = np.zeros(len(starts), dtype=np.int64)
    active = np.flatnonzero(cur < ends)
    last = max(len(words) - 4, 0)
    pos_parts: list[np.ndarray] = []
    rec_parts: list[np.ndarray] = []
    n_parts: list[np.ndarray] = []
    defects: dict[int, tuple[int, int, str]] = {}
    while len(active):
        p = cur[active]
        end = ends[active]
        short = end - p < 4
        q = np.minimum(p, last)
        lo = words[q + 2].astype(np.int64)
        hi = words[q + 3]
        badn = (hi != 0) | (lo > TOPN_MAX_VALUES)
        nxt = p + 4 + 4 * lo
        wrong = short | badn | (nxt > end)
        if wrong.any():
            for j in np.flatnonzero(wrong).tolist():
                at, left = int(p[j]), 4 * int(end[j] - p[j])
                if short[j]:
                    problem = f"ends inside a site's header ({left} bytes left, a site starts with 16: total and value count)"
                else:
                    values = _signed(int(lo[j]), int(hi[j]))
                    if values < 0:
                        problem = f"has a negative value count ({values})"
                    elif values > TOPN_MAX_VALUES:
                        problem = f"has {values} values, more than the {TOPN_MAX_VALUES} GCC tracks at a site"
                    else:
                        problem = (f"lists {values} values ({16 * values} bytes), past the end of the record "
                                   f"({left - 16} bytes left)")
                defects[int(active[j])] = (int(index[active[j]]), at, problem)
            good = ~wrong
            p, lo, nxt, a = p[good], lo[good], nxt[good], active[good]
        else:
            a = active
        pos_parts.append(p)
        rec_parts.append(a)
        n_parts.append(lo)
        index[a] += 1
        cur[a] = nxt
        active = a[nxt < ends[a]]
    if not pos_parts:
        empty = np.zeros(0, dtype=np.int64)
        return SiteChain(empty, empty, empty, defects)
    pos, rec, n = np.concatenate(pos_parts), np.concatenate(rec_parts), np.concatenate(n_parts)
    if defects:
        keep = ~np.isin(rec, np.fromiter(defects, dtype=np.int64, count=len(defects)))
        pos, rec, n = pos[keep], rec[keep], n[keep]
    order = np.argsort(pos, kind="stable")
    return SiteChain(pos[order], rec[order], n[order], defects)


@dataclass(frozen=True)
class Sites:
    """The sites of one top-N kind of a file, in file order: site i has total[i] (executions; GCC reads it signed, and
    a merge that dropped values leaves it negative) and the (value, count) pairs values/counts[first[i]:first[i+1]].
    per_record: how many sites each record of the kind holds (file order), which rebuilding the records needs."""

    total: np.ndarray  # uint64 (s,)
    first: np.ndarray  # int64 (s + 1,)
    values: np.ndarray  # uint64 (p,)
    counts: np.ndarray  # uint64 (p,)
    per_record: np.ndarray  # int64 (r,)

    def __len__(self) -> int:
        return len(self.total)

    @property
    def n(self) -> np.ndarray:
        return np.diff(self.first)

    def magnitude(self) -> tuple[np.ndarray, np.ndarray]:
        """|total| of every site (uint64), and which totals are negative (GCC's mark of a site that lost values)."""
        neg = self.total >= np.uint64(1 << 63)
        return np.where(neg, ~self.total + np.uint64(1), self.total), neg

    def site(self, i: int) -> tuple[int, list[tuple[int, int]]]:
        """Site i as GCC reads it: (total, [(value, count), ...]), signed 64-bit numbers."""
        a, b = int(self.first[i]), int(self.first[i + 1])
        return (int(self.total[i : i + 1].view(np.int64)[0]),
                list(zip(self.values[a:b].view(np.int64).tolist(), self.counts[a:b].view(np.int64).tolist())))

    def take(self, idx: np.ndarray, per_record: np.ndarray) -> Sites:
        """The sites idx (ascending), as the sites of records holding per_record of them each."""
        n = self.n[idx]
        first = np.zeros(len(idx) + 1, dtype=np.int64)
        np.cumsum(n, out=first[1:])
        pairs = _ranges(self.first[idx], n)
        return Sites(self.total[idx], first, self.values[pairs], self.counts[pairs], per_record)

    def words(self) -> tuple[np.ndarray, np.ndarray]:
        """The sites as record payload words, and where each site's words start (plus the end)."""
        n = self.n
        size = 4 + 4 * n
        start = np.zeros(len(n) + 1, dtype=np.int64)
        np.cumsum(size, out=start[1:])
        out = np.zeros(int(start[-1]), dtype=np.uint32)
        store_counters(out, start[:-1], self.total)
        store_counters(out, start[:-1] + 2, n.astype(np.uint64))
        lo = pair_positions(start[:-1] + 4, n)  # the value of each pair; its count two words on
        lo = 2 * lo - np.repeat(start[:-1] + 4, n)
        store_counters(out, lo, self.values)
        store_counters(out, lo + 2, self.counts)
        return out, start


def read_sites(words: np.ndarray, chain: SiteChain, nrec: int) -> Sites:
    """The Sites of a chain over words (the records it followed, all of them well formed)."""
    n = chain.n
    first = np.zeros(len(n) + 1, dtype=np.int64)
    np.cumsum(n, out=first[1:])
    lo = pair_positions(chain.pos + 4, n)  # pairs are four words apart: value at 4k, count at 4k + 2
    lo = 2 * lo - np.repeat(chain.pos + 4, n)
    return Sites(
        total=counter_values(words, chain.pos), first=first, values=counter_values(words, lo),
        counts=counter_values(words, lo + 2), per_record=np.bincount(chain.rec, minlength=nrec).astype(np.int64),
    )


# -- the per-file model ----------------------------------------------------------------------------------------

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
            return counter_values(self.payload, pair_positions(self.offsets[sel], counts))
        values = np.zeros(int(counts.sum()), dtype=np.uint64)
        stored = ~negative
        dst = _ranges((np.cumsum(counts) - counts)[stored], counts[stored])
        values[dst] = counter_values(self.payload, pair_positions(self.offsets[sel[stored]], counts[stored]))
        return values

    def all_zero(self) -> bool:
        """True when every counter of every kind is zero (the object never ran in the profiled window)."""
        return not any(self.counters(k).any() for k in self.counter_kinds_present())

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
        if not negative.any():
            payload = self.payload.copy()
            store_counters(payload, pair_positions(self.offsets[sel], counts), values)
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
            store_counters(words, np.arange(0, len(words), 2), values[a:b])
            new_payloads[rec] = words
            lengths[rec] = len(words) * self.layout.unit
        return self._with_payloads(lengths, new_payloads)

    # -- top-N sites ----------------------------------------------------------------------------------------
    def is_topn(self, kind: int) -> bool:
        """Whether `kind` holds top-N sites of variable length in this file's layout."""
        return kind in self.layout.topn_kinds

    def sites(self, kind: int) -> Sites:
        """The sites of a top-N kind (see Sites), in file order."""
        if not self.is_topn(kind):
            raise ValueError(f"{self.name}: '{self.layout.kind_name(kind)}' counters are not top-N sites here")
        sel = np.flatnonzero(self.tags == counter_tag(kind))
        chain = follow_sites(self.payload, self.offsets[sel], self.offsets[sel + 1])
        if chain.defects:  # the parser refuses such a file; a model built by hand can still hold one
            r, (i, at, problem) = min(chain.defects.items())
            raise GcovFormatError(self.name, f"{self.layout.kind_name(kind)} record {r}: site {i} {problem}")
        return read_sites(self.payload, chain, len(sel))

    def with_sites(self, kind: int, sites: Sites) -> Gcda:
        """Copy with the records of a top-N kind rebuilt from `sites` (as many sites per record as before)."""
        sel = np.flatnonzero(self.tags == counter_tag(kind))
        if not np.array_equal(sites.per_record, self.sites(kind).per_record):
            raise ValueError(f"{self.name}: the sites given do not fit the file's {self.layout.kind_name(kind)} records")
        words, start = sites.words()
        bounds = start[np.concatenate(([0], np.cumsum(sites.per_record)))]
        payloads = [self.payload[self.offsets[i] : self.offsets[i + 1]] for i in range(len(self.tags))]
        lengths = self.lengths.copy()
        for j, rec in enumerate(sel.tolist()):
            payloads[rec] = words[bounds[j] : bounds[j + 1]]
            lengths[rec] = (bounds[j + 1] - bounds[j]) * self.layout.unit
        return self._with_payloads(lengths, payloads)

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
        return self._keep(self.tags != TAG_OBJECT_SUMMARY)

    def arcs_only(self) -> Gcda:
        """Copy without the counter records of every kind but arcs (what an arc-only instrumented kernel writes:
        -fprofile-values adds the value kinds and time_profiler); function records and the summary stay."""
        counters = np.array([counter_kind(int(t)) is not None for t in self.tags], dtype=bool)
        return self._keep(~counters | (self.tags == ARCS_TAG))

    def values_zeroed(self) -> Gcda:
        """Copy with every value counter zero (a top-N site: total 0, no values), arcs and time_profiler as they are:
        a profile from which GCC applies no value transform. (Dropping the value records instead, keeping
        time_profiler, makes gcc-12's profile pass crash.)"""
        g = self
        for kind in sorted(self.counter_kinds_present() - {ARCS}):
            if self.layout.kind_name(kind) == "time_profiler":
                continue
            if self.is_topn(kind):
                old = self.sites(kind)
                none = np.zeros(0, dtype=np.uint64)
                g = g.with_sites(kind, Sites(np.zeros(len(old), dtype=np.uint64), np.zeros(len(old) + 1, dtype=np.int64),
                                             none, none, old.per_record))
            else:
                g = g.with_counters(kind, np.zeros(self.counter_count(kind), dtype=np.uint64))
        return g

    def _keep(self, mask: np.ndarray) -> Gcda:
        """Copy with the records where mask holds, in order."""
        keep = np.flatnonzero(mask)
        if len(keep) == len(self.tags):
            return self
        sizes = np.diff(self.offsets)[keep]
        offsets = np.zeros(len(keep) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        payload = self.payload[_ranges(self.offsets[keep], sizes)]
        return self._copy(tags=self.tags[keep], lengths=self.lengths[keep], offsets=offsets, payload=payload)

    def with_function_ids(self, ids: dict[int, tuple[int, int]]) -> Gcda:
        """Copy whose function records say (ident, line checksum) = ids[old ident]; functions not in ids and their
        CFG checksums and counters stay as they are (kpgo.gcov.ident.rekey)."""
        payload = self.payload.copy()
        for i in np.flatnonzero(self.tags == TAG_FUNCTION).tolist():
            a, b = int(self.offsets[i]), int(self.offsets[i + 1])
            new = ids.get(int(payload[a])) if b - a >= 3 else None
            if new is not None:
                payload[a], payload[a + 1] = new
        return self._copy(payload=payload)

    def with_summary(self, runs: int, sum_max: int) -> Gcda:
        """Copy whose only object summary is summary_record(runs, sum_max), first after the header as libgcov
        writes it."""
        base = self.without_summary()
        rec = summary_record(self.layout.unit, runs, sum_max)
        tags = np.concatenate([rec[:1], base.tags])
        lengths = np.concatenate([rec[1:2], base.lengths])
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), base.offsets + 2])
        payload = np.concatenate([rec[2:], base.payload])
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
                vals = counter_values(self.payload, np.arange(a, b, 2))
            cur.counters[kind] = vals
        return out


def _model(name: str, layout: Layout, order: str, words: np.ndarray, hp: np.ndarray, plen: np.ndarray,
           end: int) -> Gcda:
    """The per-file model of a file's native words, its record positions hp, their payload words (0 for a
    negative length) and where its records end (any trailer follows)."""
    offsets = np.zeros(len(hp) + 1, dtype=np.int64)
    np.cumsum(plen, out=offsets[1:])
    return Gcda(
        name=name, layout=layout, byteorder=order, version=int(words[1]), stamp=int(words[2]),
        checksum=int(words[3]) if layout.header_checksum else None,
        tags=words[hp].astype(np.uint32), lengths=words[hp + 1].astype(np.uint32), offsets=offsets,
        payload=words[_ranges(hp + 2, plen)].astype(np.uint32), trailer=words[end:].astype(np.uint32),
    )


# -- files in one buffer, indexed at once ------------------------------------------------------------------------

@dataclass(eq=False)
class Image:
    """Files in one buffer. File k is buf[4*wstart[k] : 4*wstart[k] + size[k]] (each file starts on a word
    boundary; a file whose size is not a multiple of 4 is padded)."""

    src: str  # the directory the paths are relative to ("" when rels are names)
    rels: list[str]
    buf: bytes
    words: np.ndarray  # uint32 view of buf (little-endian)
    wstart: np.ndarray  # int64 (n + 1,), word offset of each file; wstart[n] = len(words)
    size: np.ndarray  # int64 (n,), bytes of each file

    def path(self, k: int) -> str:
        return os.path.join(self.src, self.rels[k])

    def file_bytes(self, k: int) -> bytes:
        a = 4 * int(self.wstart[k])
        return self.buf[a : a + int(self.size[k])]

    def index_of(self) -> dict[str, int]:
        return {r: i for i, r in enumerate(self.rels)}


def make_image(src: str, rels: list[str], files: list[bytes]) -> Image:
    """An Image of the bytes of each file (src/rels name them)."""
    size = np.fromiter(map(len, files), dtype=np.int64, count=len(files))
    chunks: list[bytes] = []
    for data in files:
        chunks.append(data)
        if len(data) & 3:
            chunks.append(b"\0" * (-len(data) & 3))
    buf = b"".join(chunks)
    del chunks
    wstart = np.zeros(len(files) + 1, dtype=np.int64)
    np.cumsum((size + 3) // 4, out=wstart[1:])
    return Image(src=src, rels=rels, buf=buf, words=np.frombuffer(buf, dtype="<u4"), wstart=wstart, size=size)


@dataclass(eq=False)
class Index:
    """The records of the files of an Image that passed the whole-profile check (`fast`); the others are read by
    walking them (gcda(k)).

    Record arrays are in file order, files in image order; positions are word offsets into image.words."""

    image: Image
    fast: np.ndarray  # bool (n,)
    version: np.ndarray  # uint32 (n,), version word (meaningful where fast)
    stamp: np.ndarray  # uint32 (n,)
    hw: np.ndarray  # int64 (n,), header words (3 before GCC 12, 4 from GCC 12)
    unit: np.ndarray  # int64 (n,), length units per word (1 before GCC 12, 4 from GCC 12)
    layouts: dict[int, Layout]  # version word -> layout
    rec_pos: np.ndarray  # int64, position of each record's tag word
    rec_tag: np.ndarray  # uint32
    rec_len: np.ndarray  # int64, payload words
    rec_fid: np.ndarray  # int64, file of each record
    rec_first: np.ndarray  # int64 (n + 1,), records of file k are rec_first[k]:rec_first[k+1] (0 when not fast)
    rend: np.ndarray  # int64 (n,), word position where file k's records end: its end, or its end marker (tag 0)
    # The sites of the fast files' top-N records (GCC >= 11), in position order: where each starts (its total), its
    # record (index into the rec_ arrays) and its number of (value, count) pairs.
    site_pos: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    site_rec: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    site_n: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n(self) -> int:
        return len(self.image.rels)

    def slow(self) -> list[int]:
        return np.flatnonzero(~self.fast).tolist()

    def gcda(self, k: int, words: np.ndarray | None = None) -> Gcda:
        """File k as the per-file model: from the index when it passed the check, else by walking its records
        (a defect is a GcovFormatError naming the file). words: the image's words with other counters in place
        (same records: a merge's output), for a fast file."""
        img = self.image
        if not self.fast[k]:
            assert words is None
            return walk_gcda(img.file_bytes(k), img.path(k))
        ws = int(img.wstart[k])
        words = (img.words if words is None else words)[ws : ws + int(img.size[k]) // 4]
        r = slice(int(self.rec_first[k]), int(self.rec_first[k + 1]))
        return _model(img.path(k), self.layouts[int(self.version[k])], "<", words, self.rec_pos[r] - ws,
                      self.rec_len[r], int(self.rend[k]) - ws)

    def sites(self, record_mask: np.ndarray) -> tuple[Sites, np.ndarray]:
        """The sites of the selected top-N records (of fast files), in position order, and the record of each."""
        sel = record_mask[self.site_rec]
        chain = SiteChain(self.site_pos[sel], self.site_rec[sel], self.site_n[sel], {})
        return read_sites(self.image.words, chain, len(self.rec_pos)), chain.rec

    def counter_slots(self, record_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Word positions of the low words of the counters of the selected records, and the file of each."""
        sel = np.flatnonzero(record_mask)
        pairs = self.rec_len[sel] // 2
        return pair_positions(self.rec_pos[sel] + 2, pairs), np.repeat(self.rec_fid[sel], pairs)

    def summary_records(self) -> np.ndarray:
        """Indices of the object-summary records."""
        return np.flatnonzero(self.rec_tag == TAG_OBJECT_SUMMARY)

    def structure_positions(self) -> tuple[np.ndarray, np.ndarray]:
        """Words that must be equal in another profile of the same build for a file to share this file's layout:
        magic, version, stamp, every record's tag and length word, and the FUNCTION records' payloads (ident and
        checksums). With the same file size, equal words there mean the same record chain; the counters then sit
        at the same positions. Returns positions and their files (int32), in no particular order."""
        fast = np.flatnonzero(self.fast)
        ws = self.image.wstart[fast]
        head = (ws[:, None] + np.arange(3)).ravel()
        head_fid = np.repeat(fast, 3)
        fsel = np.flatnonzero(self.rec_tag == TAG_FUNCTION)
        fpos = _ranges(self.rec_pos[fsel] + 2, self.rec_len[fsel])
        ffid = np.repeat(self.rec_fid[fsel], self.rec_len[fsel])
        pos = np.concatenate([head, self.rec_pos, self.rec_pos + 1, fpos])
        fid = np.concatenate([head_fid, self.rec_fid, self.rec_fid, ffid]).astype(np.int32)
        return pos, fid


class SummaryWriter:
    """Fast files with one object summary (runs, sum_max) right after the header and no other, as pieces of buf
    (the image's bytes, or a copy with changed counters) around the new record: the bytes are not rebuilt. Same
    bytes as Gcda.with_summary(runs, sum_max).to_bytes() of the file."""

    def __init__(self, idx: Index, buf: memoryview, runs: int, sum_max: int) -> None:
        self.idx, self.buf = idx, buf
        self.records = {u: summary_record(u, runs, sum_max).astype("<u4").tobytes() for u in (1, 4)}
        self.old: dict[int, list[int]] = {}  # files holding summaries -> those records
        for r in idx.summary_records().tolist():
            self.old.setdefault(int(idx.rec_fid[r]), []).append(r)

    def pieces(self, k: int) -> list[memoryview | bytes]:
        idx, buf = self.idx, self.buf
        a = 4 * int(idx.image.wstart[k])
        end = a + int(idx.image.size[k])
        h = a + 4 * int(idx.hw[k])
        pieces: list[memoryview | bytes] = [buf[a:h], self.records[int(idx.unit[k])]]
        pos = h
        for r in self.old.get(k, ()):
            s = 4 * int(idx.rec_pos[r])
            if s > pos:
                pieces.append(buf[pos:s])
            pos = s + 8 + 4 * int(idx.rec_len[r])
        if end > pos:
            pieces.append(buf[pos:end])
        return pieces


def index_image(image: Image) -> Index:
    """Check every file of the image at once and index the records of those that pass (see the module's doc)."""
    words = image.words
    nf = len(image.rels)
    wstart = image.wstart[:-1]
    wend = wstart + (image.size + 3) // 4
    nw = len(words)
    ok = (image.size % 4 == 0) & (image.size >= 12)
    if not _LITTLE:
        ok[:] = False
    safe = np.minimum(wstart, max(nw - 3, 0))
    if nw >= 3:
        ok &= words[safe] == GCDA_MAGIC
        version = words[safe + 1].copy()
        stamp = words[safe + 2].copy()
    else:
        ok[:] = False
        version = np.zeros(nf, dtype=np.uint32)
        stamp = np.zeros(nf, dtype=np.uint32)
    hw = np.full(nf, 4, dtype=np.int64)
    unit = np.ones(nf, dtype=np.int64)
    layouts: dict[int, Layout] = {}
    for v in sorted(set(version[ok].tolist())):  # (np.unique would import numpy.ma: 12 ms)
        lay = _layout_of(v)
        vmask = version == v
        if lay is None:
            ok &= ~vmask
            continue
        layouts[v] = lay
        hw[vmask] = lay.header_words
        unit[vmask] = lay.unit
    ok &= image.size >= 4 * hw

    # Candidate record headers: words that look like a known tag (low half zero, high half not), in a checked file,
    # after its header. The halves are read through a 16-bit view: no full-size temporary.
    halves = words.view(np.uint16)
    low = halves[0::2] == 0
    low &= halves[1::2] != 0
    cand = np.flatnonzero(low)
    del low, halves
    high = words[cand]
    high >>= 16
    cand = cand[_KNOWN_HIGH[high]]
    del high
    fid = np.searchsorted(wstart, cand, side="right") - 1 if nf else np.zeros(0, dtype=np.int64)
    keep = ok[fid] & (cand >= wstart[fid] + hw[fid])
    cand, fid = cand[keep], fid[keep]

    # The candidates of a good file are exactly its record chain, which ends at the end of the file or at a zero
    # word (libgcov's end marker: from there on the file is kept verbatim, as the walk keeps it).
    bad = np.zeros(nf, dtype=bool)
    lens = words[np.minimum(cand + 1, nw - 1)].astype(np.int64) if len(cand) else np.zeros(0, dtype=np.int64)
    fu = unit[fid]
    badlen = (lens >= 1 << 31) | ((lens % fu) != 0) | (cand + 1 >= wend[fid])
    bad[fid[badlen]] = True
    plen = lens // fu
    ctag = words[cand]
    bad[fid[_half_counter(ctag, plen) | _bad_summary(ctag, plen)]] = True  # the walk names the defect
    nxt = cand + 2 + plen
    rend = wstart + hw  # end of the records (start of any trailer), files without records
    if len(cand):
        same = fid[1:] == fid[:-1]
        link = nxt[:-1] == cand[1:]
        bad[fid[:-1][same & ~link]] = True
        last = np.flatnonzero(np.concatenate((~same, [True])))
        rend[fid[last]] = nxt[last]
        first = np.flatnonzero(np.concatenate(([True], ~same)))
        bad[fid[first][cand[first] != wstart[fid[first]] + hw[fid[first]]]] = True
    short = rend < wend
    at = np.minimum(rend, max(nw - 1, 0))
    bad |= (rend > wend) | (short & (words[at] != 0 if nw else True))
    fast = ok & ~bad
    sites = _index_sites(words, layouts, version, fast, cand, fid, plen, ctag)  # may take files off the fast path
    keep = fast[fid]
    cand, fid, plen = cand[keep], fid[keep], plen[keep]
    counts = np.bincount(fid, minlength=nf) if nf else np.zeros(0, dtype=np.int64)
    rec_first = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(counts, out=rec_first[1:])
    site_pos, site_cand, site_n = sites
    site_rec = (np.cumsum(keep) - 1)[site_cand]
    return Index(
        image=image, fast=fast, version=version, stamp=stamp, hw=hw, unit=unit, layouts=layouts,
        rec_pos=cand, rec_tag=words[cand], rec_len=plen, rec_fid=fid, rec_first=rec_first, rend=rend,
        site_pos=site_pos, site_rec=site_rec, site_n=site_n,
    )


def _index_sites(words: np.ndarray, layouts: dict[int, Layout], version: np.ndarray, fast: np.ndarray,
                 cand: np.ndarray, fid: np.ndarray, plen: np.ndarray, ctag: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sites of the top-N records of the fast files (position, candidate record, n). A file with a malformed
    site is taken off the fast path (fast is updated; the walk names the defect). Nothing to do, and no cost beyond
    one comparison per record, for a profile without top-N records."""
    empty = np.zeros(0, dtype=np.int64)
    versions = [v for v, lay in layouts.items() if lay.topn_kinds]
    if not versions:
        return empty, empty, empty
    topn = np.isin(ctag, _topn_tags(layouts[versions[0]]))  # the same tags in every layout that has them
    if not topn.any():
        return empty, empty, empty
    if len(versions) < len(layouts):
        topn &= np.isin(version[fid], versions)
    sel = np.flatnonzero(topn & fast[fid])
    chain = follow_sites(words, cand[sel] + 2, cand[sel] + 2 + plen[sel])
    site_cand = sel[chain.rec]
    if chain.defects:
        fast[fid[sel[list(chain.defects)]]] = False
        ok = fast[fid[site_cand]]
        return chain.pos[ok], site_cand[ok], chain.n[ok]
    return chain.pos, site_cand, chain.n


# -- the walk: files the whole-profile check does not take, and every defect ------------------------------------

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


def walk_gcda(data: bytes, name: str) -> Gcda:
    """Read a whole .gcda by following its record chain. Every defect is a GcovFormatError naming `name` and the
    byte offset."""
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
    plen = np.where(negative, 0, lengths.astype(np.int64) >> shift)
    odd = np.flatnonzero(_half_counter(tags, plen))
    if len(odd):
        i = int(odd[0])
        raise GcovFormatError(name, f"counter record 0x{int(tags[i]):08x} at byte {int(hp[i]) * 4} holds {int(plen[i])} "
                                    "words, an impossible count (each counter takes two)")
    bad = np.flatnonzero(_bad_summary(tags, plen))
    if len(bad):
        i = int(bad[0])
        n = int(plen[i])
        raise GcovFormatError(name, f"object summary at byte {int(hp[i]) * 4} holds {n} word{'' if n == 1 else 's'}, "
                                    "not the two (runs, sum_max) GCC reads")
    if layout.topn_kinds:
        _check_sites(name, layout, words, tags, hp, plen, negative)
    return _model(name, layout, order, words, hp, plen, end)


def _topn_tags(layout: Layout) -> np.ndarray:
    return np.array(sorted(counter_tag(k) for k in layout.topn_kinds), dtype=np.uint32)


def _check_sites(name: str, layout: Layout, words: np.ndarray, tags: np.ndarray, hp: np.ndarray, plen: np.ndarray,
                 negative: np.ndarray) -> None:
    """The top-N records of a walked file hold well-formed sites, or a GcovFormatError names the first defect."""
    sel = np.flatnonzero(np.isin(tags, _topn_tags(layout)))
    if not len(sel):
        return
    what = [layout.kind_name(counter_kind(int(t)) or 0) for t in tags[sel].tolist()]
    neg = np.flatnonzero(negative[sel])
    if len(neg):
        i = int(neg[0])
        raise GcovFormatError(name, f"{what[i]} record 0x{int(tags[sel[i]]):08x} at byte {int(hp[sel[i]]) * 4} has a "
                                    "negative length (GCC and the kernel write top-N sites in full)")
    chain = follow_sites(words, hp[sel] + 2, hp[sel] + 2 + plen[sel])
    if chain.defects:
        r, (site, at, problem) = min(chain.defects.items())
        raise GcovFormatError(name, f"{what[r]} record 0x{int(tags[sel[r]]):08x} at byte {int(hp[sel[r]]) * 4}: "
                                    f"site {site} at byte {at * 4} {problem}")


def parse_gcda(data: bytes, name: str) -> Gcda:
    """Parse a whole .gcda file (the whole-profile parser on a buffer of one file). Every defect is a
    GcovFormatError naming `name` and the byte offset."""
    return index_image(make_image("", [name], [data])).gcda(0)


def read_gcda(path: Path | str, name: str | None = None) -> Gcda:
    return parse_gcda(inputs.read_bytes(path, DAMAGED_HINT), name or str(path))
