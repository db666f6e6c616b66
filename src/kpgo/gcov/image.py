"""A whole profile in one buffer: every .gcda of a profile directory read into one array of words, and the records
of all files checked and indexed at once (numpy over the whole profile, not a parse per file).

This is the fast path of `kpgo profile stats`, `fix` and `merge`. A file takes it when its layout is verified
cheaply for the whole profile at once:

    magic "gcda" in the machine's byte order (little-endian machines only), a supported version word (GCC 9-14),
    a size that is a multiple of 4 holding at least the header, and a chain of records of known tags
    (FUNCTION, counters of kinds 0-8, summaries) with non-negative lengths that starts right after the header
    and ends exactly at the end of the file or at a zero word (libgcov's end marker, kept verbatim with what
    follows it, as the parser keeps it).

The chain is checked without walking it: every word that could be a record tag (low 16 bits zero, in the set of
known tags) is a candidate; the file passes when its candidates are exactly its record chain - the first one
right after the header, each record's end the next candidate, the last one's end the end of the file or an end
marker. A counter value that happens to look like a tag, a negative length (libgcov's all-zero records), another byte
order or a defect makes the file fail the check, and the callers then handle it with the full parser
(kpgo.gcov.gcda.parse_gcda), which gives the same results and the one-line errors. Files the kernel writes always
pass.

API
    gcda_rels(src) -> list[str]                    relative paths of the .gcda files, sorted (as iter_gcda)
    read_image(src, rels) -> Image                 read the files (one buffer); no checks yet
    index_image(image) -> Index                    check every file and index the records of those that pass
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from kpgo.errors import UserError
from kpgo.gcov.gcda import (
    _LAYOUTS,
    ARCS,
    GCDA_MAGIC,
    TAG_COUNTER_BASE,
    TAG_FUNCTION,
    TAG_OBJECT_SUMMARY,
    TAG_PROGRAM_SUMMARY,
    Layout,
    _ranges,
    counter_tag,
    gcc_major,
)

_LITTLE = sys.byteorder == "little"
_READ_CHUNK = 1 << 16  # one read() covers almost every .gcda; larger files take more reads
KNOWN_TAGS = np.array(
    sorted({TAG_FUNCTION, TAG_OBJECT_SUMMARY, TAG_PROGRAM_SUMMARY} | {counter_tag(k) for k in range(9)}),
    dtype=np.uint32,
)
ARCS_TAG = counter_tag(ARCS)


def gcda_rels(src: str | os.PathLike[str]) -> list[str]:
    """Relative paths ('/'-separated) of the .gcda files under src, sorted; hidden files and directories (our own
    temporary outputs) skipped, symbolic links to directories not followed (as os.walk)."""
    root = os.fspath(src)
    if not os.path.isdir(root):
        what = "is not a directory" if os.path.exists(root) else "does not exist"
        raise UserError(f"profile directory {root} {what}", "give a directory of .gcda files")
    out: list[str] = []
    nested: list[str] = []  # subdirectories that are profiles of their own (they hold a profile.json)
    stack = [("", root)]
    while stack:
        rel, path = stack.pop()
        with os.scandir(path) as it:
            for e in it:
                name = e.name
                if name.startswith("."):
                    continue
                if e.is_dir():
                    if not e.is_symlink():
                        stack.append((rel + name + "/", e.path))
                elif name.endswith(".gcda"):
                    out.append(rel + name)
                elif rel and name == "profile.json":
                    nested.append(rel.rstrip("/"))
    if nested:
        # `kpgo collect --workload a,b -o DIR` writes DIR/a and DIR/b: read as one, their files would land on the
        # wrong paths (a/kernel/sched.gcda) and mix two workloads.
        nested.sort()
        raise UserError(f"{root} holds {len(nested)} profiles ({', '.join(nested[:4])}{', ...' if len(nested) > 4 else ''}), "
                        "not one", f"pass one of them, e.g. {os.path.join(root, nested[0])}")
    out.sort()
    return out


def read_file(path: str) -> bytes:
    """The bytes of one file; an unreadable file is a one-line UserError naming it."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})", "check the path and permissions") from None
    try:
        data = os.read(fd, _READ_CHUNK)
        if len(data) == _READ_CHUNK:
            parts = [data]
            while True:
                more = os.read(fd, 1 << 20)
                if not more:
                    break
                parts.append(more)
            data = b"".join(parts)
    except OSError as e:
        raise UserError(f"{path}: cannot read ({e.strerror})", "check the path and permissions") from None
    finally:
        os.close(fd)
    return data


@dataclass(eq=False)
class Image:
    """The files of one profile directory in one buffer. File k is buf[4*wstart[k] : 4*wstart[k] + size[k]]
    (each file starts on a word boundary; a file whose size is not a multiple of 4 is padded)."""

    src: str
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


def read_image(src: str | os.PathLike[str], rels: list[str]) -> Image:
    root = os.fspath(src)
    chunks: list[bytes] = []
    size = np.empty(len(rels), dtype=np.int64)
    padded = np.empty(len(rels), dtype=np.int64)
    prefix = os.path.join(root, "")  # root + "/": the same strings as os.path.join(root, rel), cheaper
    for k, rel in enumerate(rels):
        data = read_file(prefix + rel)
        n = len(data)
        size[k] = n
        chunks.append(data)
        if n & 3:
            chunks.append(b"\0" * (4 - (n & 3)))
            n += 4 - (n & 3)
        padded[k] = n
    buf = b"".join(chunks)
    del chunks
    wstart = np.zeros(len(rels) + 1, dtype=np.int64)
    np.cumsum(padded // 4, out=wstart[1:])
    words = np.frombuffer(buf, dtype="<u4")
    return Image(src=root, rels=rels, buf=buf, words=words, wstart=wstart, size=size)


@dataclass(eq=False)
class Index:
    """The records of the files of an Image that passed the check (`fast`); the others are left to the full parser.

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

    @property
    def n(self) -> int:
        return len(self.image.rels)

    def slow(self) -> list[int]:
        return np.flatnonzero(~self.fast).tolist()

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


def index_image(image: Image) -> Index:
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
        major = gcc_major(v)
        vmask = version == v
        if major is None or major not in _LAYOUTS:
            ok &= ~vmask
            continue
        lay = _LAYOUTS[major]
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
    cand = cand[np.isin(words[cand], KNOWN_TAGS)]
    fid = np.searchsorted(wstart, cand, side="right") - 1 if nf else np.zeros(0, dtype=np.int64)
    keep = ok[fid] & (cand >= wstart[fid] + hw[fid])
    cand, fid = cand[keep], fid[keep]

    # The candidates of a good file are exactly its record chain, which ends at the end of the file or at a zero
    # word (libgcov's end marker: from there on the file is kept verbatim, as the parser keeps it).
    bad = np.zeros(nf, dtype=bool)
    lens = words[np.minimum(cand + 1, nw - 1)].astype(np.int64) if len(cand) else np.zeros(0, dtype=np.int64)
    fu = unit[fid]
    badlen = (lens >= 1 << 31) | ((lens % fu) != 0) | (cand + 1 >= wend[fid])
    bad[fid[badlen]] = True
    plen = lens // fu
    # Sizes no GCC writes (half a counter, a summary that is not two words): the full parser names the defect.
    ctag = words[cand]
    is_ctr = (ctag >= TAG_COUNTER_BASE) & (ctag < TAG_COUNTER_BASE + (32 << 17))
    bad[fid[(is_ctr & (plen % 2 == 1)) | ((ctag == TAG_OBJECT_SUMMARY) & (plen != 2))]] = True
    nxt = cand + 2 + plen
    rend = wstart + hw  # end of the records (start of any trailer), files without records
    if len(cand):
        same = fid[1:] == fid[:-1]
        link = nxt[:-1] == cand[1:]
        bad[fid[:-1][same & ~link]] = True
        last = np.flatnonzero(np.r_[~same, True])
        rend[fid[last]] = nxt[last]
        first = np.flatnonzero(np.r_[True, ~same])
        bad[fid[first][cand[first] != wstart[fid[first]] + hw[fid[first]]]] = True
    short = rend < wend
    at = np.minimum(rend, max(nw - 1, 0))
    bad |= (rend > wend) | (short & (words[at] != 0 if nw else True))
    fast = ok & ~bad
    keep = fast[fid]
    cand, fid, plen = cand[keep], fid[keep], plen[keep]
    counts = np.bincount(fid, minlength=nf) if nf else np.zeros(0, dtype=np.int64)
    rec_first = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum(counts, out=rec_first[1:])
    return Index(
        image=image, fast=fast, version=version, stamp=stamp, hw=hw, unit=unit, layouts=layouts,
        rec_pos=cand, rec_tag=words[cand], rec_len=plen, rec_fid=fid, rec_first=rec_first, rend=rend,
    )


def summary_record(unit: int, runs: int, sum_max: int) -> bytes:
    """An object summary record as GCC writes it (little-endian): tag, length (2 words), runs, sum_max (32 bits
    each; larger values clamped)."""
    cap = 0xFFFFFFFF
    return np.array([TAG_OBJECT_SUMMARY, 2 * unit, min(runs, cap), min(sum_max, cap)], dtype="<u4").tobytes()


def fixed_pieces(idx: Index, buf: memoryview, k: int, summaries: dict[int, bytes], drop: dict[int, list[int]]
                 ) -> list[memoryview | bytes]:
    """The pieces of fast file k (from buf, the image's bytes or a copy with changed counters) with one object
    summary right after the header and no other: header, summary, then the records except summaries."""
    a = 4 * int(idx.image.wstart[k])
    end = a + int(idx.image.size[k])
    h = a + 4 * int(idx.hw[k])
    pieces: list[memoryview | bytes] = [buf[a:h], summaries[int(idx.unit[k])]]
    cut = drop.get(k)
    if not cut:
        pieces.append(buf[h:end])
        return pieces
    pos = h
    for r in cut:
        s = 4 * int(idx.rec_pos[r])
        if s > pos:
            pieces.append(buf[pos:s])
        pos = s + 8 + 4 * int(idx.rec_len[r])
    if end > pos:
        pieces.append(buf[pos:end])
    return pieces


def summaries_by_file(idx: Index) -> dict[int, list[int]]:
    """Fast files that hold object-summary records -> those records."""
    out: dict[int, list[int]] = {}
    for r in idx.summary_records().tolist():
        out.setdefault(int(idx.rec_fid[r]), []).append(r)
    return out
