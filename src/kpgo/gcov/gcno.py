"""Reader of GCC notes files (.gcno), GCC 9–14 layouts: per function its identifiers and control-flow graph.

    header: magic "gcno", version, stamp, [checksum (GCC >= 12)], cwd string, support_unexecuted_blocks
    FUNCTION 0x01000000: ident, lineno_checksum, cfg_checksum, name string, artificial, source string, start line,
                         start column, end line [, end column (GCC >= 12)]
    BLOCKS   0x01410000: number of blocks (block 0 is ENTRY, block 1 is EXIT)
    ARCS     0x01430000: source block, then (destination block, flags) pairs
    LINES    0x01450000: block, then per location (0, file name string) when the file changes, and the line;
                         (0, empty string) ends it. Read only when asked (lines=True: `kpgo profile port` maps blocks
                         by their lines), skipped otherwise.
Lengths count words before GCC 12 and bytes from GCC 12; strings are a length in words plus NUL-padded text before
GCC 12, and a length in bytes plus unpadded text (NUL included) from GCC 12, so records need not be word-aligned.

The arc counters of a function in the .gcda are those of its arcs *not* on the spanning tree (flag ON_TREE unset),
in the order of this file: blocks by ARCS record, arcs in record order.

API
    parse_gcno(data, name, lines=False) -> Gcno
    read_gcno(path, lines=False) -> Gcno
    iter_notes(paths, names) -> Iterator[NotesTable]   many files, batch by batch, as flat arrays
    read_notes(paths, names) -> NotesTable              all of them in one table
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from kpgo import inputs
from kpgo.gcov.gcda import (
    DAMAGED_GCNO_HINT,
    GCNO_MAGIC,
    TAG_FUNCTION,
    GcovFormatError,
    Layout,
    byte_order,
    gcc_major,
    layout_for_version,
    version_text,
)

TAG_BLOCKS = 0x01410000
TAG_ARCS = 0x01430000
TAG_LINES = 0x01450000

ARC_ON_TREE = 1
ARC_FAKE = 2
ARC_FALLTHROUGH = 4


@dataclass
class GcnoFunction:
    ident: int
    lineno_checksum: int
    cfg_checksum: int
    name: str | None
    source: str | None
    start_line: int
    n_blocks: int
    arc_src: np.ndarray  # int64, one entry per arc, in file order
    arc_dst: np.ndarray
    arc_flags: np.ndarray
    end_line: int = 0
    # With lines=True: per block, the (file, line) locations GCC attributes to it, in record order; else None.
    block_lines: list[list[tuple[str, int]]] | None = None

    @property
    def n_counters(self) -> int:
        """Arc counters this function has in the .gcda: its arcs not on the spanning tree."""
        return int(np.count_nonzero((self.arc_flags & ARC_ON_TREE) == 0))


@dataclass
class Gcno:
    name: str
    layout: Layout
    version: int
    stamp: int
    checksum: int | None
    cwd: str | None
    functions: list[GcnoFunction]

    @property
    def version_text(self) -> str:
        return version_text(self.version)


class _Reader:
    def __init__(self, data: bytes, order: str, name: str, layout: Layout) -> None:
        self.data = data
        self.bo: Literal["little", "big"] = "little" if order == "<" else "big"
        self.name = name
        self.layout = layout

    def u32(self, pos: int) -> int:
        if pos + 4 > len(self.data):
            raise GcovFormatError(self.name, f"truncated at byte {pos}")
        return int.from_bytes(self.data[pos : pos + 4], self.bo)

    def string(self, pos: int) -> tuple[str | None, int]:
        n = self.u32(pos)
        nbytes = n if self.layout.byte_lengths else 4 * n
        if pos + 4 + nbytes > len(self.data):
            raise GcovFormatError(self.name, f"string at byte {pos} runs past the end of the file")
        raw = self.data[pos + 4 : pos + 4 + nbytes]
        text = raw.split(b"\0", 1)[0].decode("utf-8", "replace") if n else None
        return text, pos + 4 + nbytes


def _block_lines(r: _Reader, body: int, end: int) -> tuple[int, list[tuple[str, int]]]:
    """The block of a LINES record and its (file, line) locations (the file is named when it changes)."""
    block = r.u32(body)
    out: list[tuple[str, int]] = []
    p = body + 4
    cur = ""
    while p + 4 <= end:
        w = r.u32(p)
        p += 4
        if w:
            out.append((cur, w))
            continue
        fname, p = r.string(p)
        if fname is None:
            break
        cur = fname
    return block, out


def parse_gcno(data: bytes, name: str, lines: bool = False) -> Gcno:
    if len(data) < 12:
        raise GcovFormatError(name, "truncated header" if data else "empty file")
    order = byte_order(data[:4], name, "gcno")
    bo: Literal["little", "big"] = "little" if order == "<" else "big"
    version = int.from_bytes(data[4:8], bo)
    layout = layout_for_version(version, name)
    r = _Reader(data, order, name, layout)
    stamp = r.u32(8)
    pos = 12
    checksum = None
    if layout.header_checksum:
        checksum = r.u32(pos)
        pos += 4
    cwd, pos = r.string(pos)
    pos += 4  # support_unexecuted_blocks
    mult = 1 if layout.byte_lengths else 4
    n = len(data)
    dt = np.dtype(order + "u4")
    functions: list[GcnoFunction] = []
    # Per function: arcs collected as (payload offset, words) pairs, decoded together at the end.
    cur: dict | None = None
    arc_chunks: list[tuple[int, int]] = []
    pending: list[tuple[dict, list[tuple[int, int]]]] = []
    while pos + 8 <= n:
        tag = int.from_bytes(data[pos : pos + 4], bo)
        length = int.from_bytes(data[pos + 4 : pos + 8], bo) * mult
        body = pos + 8
        if body + length > n:
            raise GcovFormatError(name, f"record 0x{tag:08x} at byte {pos} runs past the end of the file")
        if tag == TAG_FUNCTION:
            if cur is not None:
                pending.append((cur, arc_chunks))
            arc_chunks = []
            ident, lcs, ccs = r.u32(body), r.u32(body + 4), r.u32(body + 8)
            fname = source = None
            line = end_line = 0
            try:  # the location part is informative only: tolerate what an unexpected layout puts there
                fname, p = r.string(body + 12)
                p += 4  # artificial
                source, p = r.string(p)
                line = r.u32(p)
                end_line = r.u32(p + 8) if p + 12 <= body + length else 0  # after the start column
            except GcovFormatError:
                pass
            cur = {"ident": ident, "lcs": lcs, "ccs": ccs, "name": fname, "source": source, "line": line,
                   "end": end_line, "blocks": 0, "lines": {} if lines else None}
        elif tag == TAG_BLOCKS and cur is not None:
            cur["blocks"] = r.u32(body)
        elif tag == TAG_ARCS and cur is not None:
            if length < 4 or (length - 4) % 8:
                raise GcovFormatError(name, f"ARCS record at byte {pos} has a bad length {length}")
            arc_chunks.append((body, length // 4))
        elif tag == TAG_LINES and cur is not None and cur["lines"] is not None and length >= 4:
            block, where = _block_lines(r, body, body + length)
            cur["lines"].setdefault(block, []).extend(where)
        elif tag == 0:
            break
        pos = body + length
    if cur is not None:
        pending.append((cur, arc_chunks))
    for info, chunks in pending:
        src: list[np.ndarray] = []
        dst: list[np.ndarray] = []
        flg: list[np.ndarray] = []
        for off, nw in chunks:
            w = np.frombuffer(data, dtype=dt, count=nw, offset=off).astype(np.int64)
            src.append(np.full((nw - 1) // 2, w[0], dtype=np.int64))
            dst.append(w[1::2])
            flg.append(w[2::2])
        def cat(xs: list[np.ndarray]) -> np.ndarray:
            return np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64)
        fn = GcnoFunction(
            ident=info["ident"], lineno_checksum=info["lcs"], cfg_checksum=info["ccs"], name=info["name"],
            source=info["source"], start_line=info["line"], n_blocks=info["blocks"],
            arc_src=cat(src), arc_dst=cat(dst), arc_flags=cat(flg), end_line=info["end"],
            block_lines=None if info["lines"] is None else [info["lines"].get(b, []) for b in range(info["blocks"])],
        )
        if len(fn.arc_dst) and (fn.arc_dst.max() >= max(fn.n_blocks, 1) or fn.arc_src.max() >= max(fn.n_blocks, 1)):
            raise GcovFormatError(name, f"function {fn.name or fn.ident}: arc to a block beyond its {fn.n_blocks}")
        functions.append(fn)
    return Gcno(name=name, layout=layout, version=version, stamp=stamp, checksum=checksum, cwd=cwd,
                functions=functions)


def read_gcno(path: Path | str, lines: bool = False) -> Gcno:
    path = Path(path)
    return parse_gcno(inputs.read_bytes(path, DAMAGED_GCNO_HINT), str(path), lines)


# -- many files at once ------------------------------------------------------------------------------------------
#
# `kpgo profile compare` needs the CFG of every function of a build (tens of thousands of functions, ~10^6 arcs).
# read_notes reads the .gcno files in batches of about 8 MB: a lean walk over the record headers of each file
# notes where the FUNCTION, BLOCKS and ARCS records are, and numpy then decodes the records of the whole batch at
# once. Records need not be word-aligned (GCC 12 writes strings unpadded), so positions are byte offsets. A file
# the walk does not take as it is (big-endian, a record the per-file reader would reject or read differently) is
# read by parse_gcno, which gives the same result or the error.

_BATCH_BYTES = 8 << 20
_II = struct.Struct("<II")


@dataclass
class NotesTable:
    """The functions and arcs of many .gcno files as flat arrays (files in the order given, functions and arcs in
    file order). File k's functions are func_first[k]:func_first[k+1]; function j's arcs arc_first[j]:arc_first[j+1]."""

    names: list[str]  # the files read (those that could not be read are in `errors`)
    stamps: list[int]
    errors: dict[str, str]  # name -> problem ("missing" when there is no file)
    func_first: np.ndarray  # int64 (files + 1,)
    ident: np.ndarray  # int64 (functions,)
    lineno_checksum: np.ndarray
    cfg_checksum: np.ndarray
    n_blocks: np.ndarray  # int64
    fname: list[str | None]  # function names
    arc_first: np.ndarray  # int64 (functions + 1,)
    arc_src: np.ndarray  # int32 (arcs,)
    arc_dst: np.ndarray
    arc_flags: np.ndarray


def _u32(v: np.ndarray, p: np.ndarray) -> np.ndarray:
    """Little-endian 32-bit words at byte positions p of the byte array v, as int64."""
    out = v[p].astype(np.int64)
    out |= v[p + 1].astype(np.int64) << 8
    out |= v[p + 2].astype(np.int64) << 16
    out |= v[p + 3].astype(np.int64) << 24
    return out


def _walk(data: bytes, name: str, base: int, fn: list[int], blk: list[int], arc: list[int], arc_len: list[int]
          ) -> bool:
    """Append the byte positions (plus base) of the FUNCTION, BLOCKS and ARCS records of a little-endian .gcno,
    and the payload lengths of the ARCS records. False (nothing appended) when the file is for parse_gcno."""
    if len(data) < 16 or data[:4] != GCNO_MAGIC.to_bytes(4, "little"):
        return False
    try:
        layout = layout_for_version(int.from_bytes(data[4:8], "little"), name)
    except GcovFormatError:
        return False
    n = len(data)
    pos = 16 if layout.header_checksum else 12
    if pos + 4 > n:
        return False
    ln = int.from_bytes(data[pos : pos + 4], "little")
    pos += 4 + (ln if layout.byte_lengths else 4 * ln) + 4  # cwd string, support_unexecuted_blocks
    mult = 1 if layout.byte_lengths else 4
    f: list[int] = []
    b: list[int] = []
    a: list[int] = []
    al: list[int] = []
    unpack = _II.unpack_from
    have_fn = False
    while pos + 8 <= n:
        tag, length = unpack(data, pos)
        length *= mult
        end = pos + 8 + length
        if end > n:
            return False
        if tag == TAG_ARCS:
            if have_fn:
                if length < 4 or (length - 4) % 8:
                    return False
                a.append(pos)
                al.append(length)
        elif tag == TAG_FUNCTION:
            if length < 12:
                return False
            f.append(pos)
            have_fn = True
        elif tag == TAG_BLOCKS:
            if have_fn:
                if length < 4:
                    return False
                b.append(pos)
        elif tag == 0:
            break
        pos = end
    fn.extend(x + base for x in f)
    blk.extend(x + base for x in b)
    arc.extend(x + base for x in a)
    arc_len.extend(al)
    return True


def _scan(datas: list[bytes], names: list[str]) -> tuple[np.ndarray, dict[str, np.ndarray], list[str | None]]:
    """Read a batch: which files were read here, and for those their functions and arcs (file order)."""
    nf = len(datas)
    start = np.zeros(nf + 1, dtype=np.int64)
    np.cumsum([len(d) for d in datas], out=start[1:])
    good = np.zeros(nf, dtype=bool)
    fn: list[int] = []
    blk: list[int] = []
    arc: list[int] = []
    arc_len: list[int] = []
    mult = np.ones(nf, dtype=np.int64)
    for k, (d, name) in enumerate(zip(datas, names)):
        good[k] = _walk(d, name, int(start[k]), fn, blk, arc, arc_len)
        if good[k] and gcc_major_of(d) < 12:
            mult[k] = 4
    buf = b"".join([*datas, b"\0" * 8])  # padding: reads a few bytes past any position stay inside
    v = np.frombuffer(buf, dtype=np.uint8)
    fpos = np.array(fn, dtype=np.int64)
    ffid = np.searchsorted(start, fpos, side="right") - 1
    nfunc = len(fpos)

    def owner(q: np.ndarray) -> np.ndarray:  # the function of each record: the last FUNCTION before it
        return np.searchsorted(fpos, q, side="right") - 1

    nb = np.zeros(nfunc, dtype=np.int64)
    bpos = np.array(blk, dtype=np.int64)
    nb[owner(bpos)] = _u32(v, bpos + 8)  # the last BLOCKS record of a function counts
    apos = np.array(arc, dtype=np.int64)
    aown = owner(apos)
    pairs = (np.array(arc_len, dtype=np.int64) - 4) // 8
    total = int(pairs.sum())
    j = np.arange(total, dtype=np.int64) - np.repeat(np.cumsum(pairs) - pairs, pairs)
    pos = np.repeat(apos + 12, pairs) + 8 * j
    arc_func = np.repeat(aown, pairs)
    src = np.repeat(_u32(v, apos + 8), pairs)
    dst = _u32(v, pos)
    flags = _u32(v, pos + 4)
    lim = np.maximum(nb, 1)[arc_func]
    outside = (dst >= lim) | (src >= lim)
    if outside.any():  # the per-file reader names the function
        good[ffid[arc_func[outside]]] = False
    fields = {
        "fid": ffid, "ident": _u32(v, fpos + 8), "lcs": _u32(v, fpos + 12), "ccs": _u32(v, fpos + 16), "nb": nb,
        "arc_func": arc_func, "src": src.astype(np.int32), "dst": dst.astype(np.int32),
        "flags": flags.astype(np.int32),
    }
    names_out: list[str | None] = []
    for q, k in zip(fpos.tolist(), ffid.tolist()):
        end = int(start[k + 1])
        at = q + 20
        fname = None
        if at + 4 <= end:
            ln = int.from_bytes(buf[at : at + 4], "little")
            nbytes = ln * int(mult[k])
            if ln and at + 4 + nbytes <= end:
                fname = buf[at + 4 : at + 4 + nbytes].split(b"\0", 1)[0].decode("utf-8", "replace")
        names_out.append(fname)
    return good, fields, names_out


def gcc_major_of(data: bytes) -> int:
    return gcc_major(int.from_bytes(data[4:8], "little")) or 0


def iter_notes(paths: list[str], names: list[str] | None = None) -> Iterator[NotesTable]:
    """Read many .gcno files, one NotesTable per batch of about 8 MB of files, in order. Missing files are in the
    batch's `errors` as "missing", unreadable ones with the problem. Memory: one batch."""
    names = names or paths
    i = 0
    while i < len(paths):
        datas: list[bytes] = []
        idx: list[int] = []
        errors: dict[str, str] = {}
        size = 0
        while i < len(paths) and (size < _BATCH_BYTES or not datas):
            d = inputs.read_bytes_if_present(paths[i], DAMAGED_GCNO_HINT)
            if d is None:
                errors[names[i]] = "missing"
                i += 1
                continue
            datas.append(d)
            idx.append(i)
            size += len(d)
            i += 1
        yield _batch_table(datas, [paths[k] for k in idx], [names[k] for k in idx], errors)


def _batch_table(datas: list[bytes], paths: list[str], names: list[str], errors: dict[str, str]) -> NotesTable:
    func_first = [0]
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("ident", "lcs", "ccs", "nb", "src", "dst", "flags",
                                                          "arcs_per_func")}
    fnames: list[str | None] = []
    read_names: list[str] = []
    stamps: list[int] = []
    good, fld, fn_names = _scan(datas, names) if datas else (np.zeros(0, bool), None, [])
    if fld is not None:
        # Functions per file of the batch, in file order; files that failed go through parse_gcno.
        fcount = np.bincount(fld["fid"], minlength=len(datas))
        ffirst = np.zeros(len(datas) + 1, dtype=np.int64)
        np.cumsum(fcount, out=ffirst[1:])
        acount = np.bincount(fld["arc_func"], minlength=len(fld["fid"]))
        afirst = np.zeros(len(fld["fid"]) + 1, dtype=np.int64)
        np.cumsum(acount, out=afirst[1:])
    for b, name in enumerate(names):
        if good[b]:
            assert fld is not None  # good[b] is only set by _scan, which also returned fld
            a, z = int(ffirst[b]), int(ffirst[b + 1])
            parts["ident"].append(fld["ident"][a:z])
            parts["lcs"].append(fld["lcs"][a:z])
            parts["ccs"].append(fld["ccs"][a:z])
            parts["nb"].append(fld["nb"][a:z])
            parts["arcs_per_func"].append(acount[a:z])
            s, e = int(afirst[a]), int(afirst[z])
            parts["src"].append(fld["src"][s:e])
            parts["dst"].append(fld["dst"][s:e])
            parts["flags"].append(fld["flags"][s:e])
            fnames.extend(fn_names[a:z])
            stamps.append(int.from_bytes(datas[b][8:12], "little"))
        else:
            try:
                g = parse_gcno(datas[b], paths[b])
            except GcovFormatError as e:
                errors[name] = e.problem
                continue
            fs = g.functions
            parts["ident"].append(np.array([f.ident for f in fs], dtype=np.int64))
            parts["lcs"].append(np.array([f.lineno_checksum for f in fs], dtype=np.int64))
            parts["ccs"].append(np.array([f.cfg_checksum for f in fs], dtype=np.int64))
            parts["nb"].append(np.array([f.n_blocks for f in fs], dtype=np.int64))
            parts["arcs_per_func"].append(np.array([len(f.arc_src) for f in fs], dtype=np.int64))
            for key, attr in (("src", "arc_src"), ("dst", "arc_dst"), ("flags", "arc_flags")):
                parts[key].extend(getattr(f, attr).astype(np.int32) for f in fs)
            fnames.extend(f.name for f in fs)
            stamps.append(g.stamp)
        read_names.append(name)
        func_first.append(func_first[-1] + len(parts["ident"][-1]))
    return _table(read_names, stamps, errors, func_first, parts, fnames)


def _table(read_names: list[str], stamps: list[int], errors: dict[str, str], func_first: list[int],
           parts: dict[str, list[np.ndarray]], fnames: list[str | None]) -> NotesTable:
    def cat(key: str) -> np.ndarray:
        if parts[key]:
            return np.concatenate(parts[key])
        return np.zeros(0, dtype=np.int32 if key in ("src", "dst", "flags") else np.int64)

    apf = cat("arcs_per_func")
    arc_first = np.zeros(len(apf) + 1, dtype=np.int64)
    np.cumsum(apf, out=arc_first[1:])
    return NotesTable(
        names=read_names, stamps=stamps, errors=errors, func_first=np.array(func_first, dtype=np.int64),
        ident=cat("ident"), lineno_checksum=cat("lcs"), cfg_checksum=cat("ccs"), n_blocks=cat("nb"), fname=fnames,
        arc_first=arc_first, arc_src=cat("src"), arc_dst=cat("dst"), arc_flags=cat("flags"),
    )


def read_notes(paths: list[str], names: list[str] | None = None) -> NotesTable:
    """All of iter_notes in one table."""
    names_all: list[str] = []
    stamps: list[int] = []
    errors: dict[str, str] = {}
    func_first = [0]
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("ident", "lcs", "ccs", "nb", "src", "dst", "flags",
                                                          "arcs_per_func")}
    fnames: list[str | None] = []
    for t in iter_notes(paths, names):
        names_all += t.names
        stamps += t.stamps
        errors.update(t.errors)
        func_first += (t.func_first[1:] + func_first[-1]).tolist()
        for key, arr in (("ident", t.ident), ("lcs", t.lineno_checksum), ("ccs", t.cfg_checksum),
                         ("nb", t.n_blocks), ("src", t.arc_src), ("dst", t.arc_dst), ("flags", t.arc_flags),
                         ("arcs_per_func", np.diff(t.arc_first))):
            parts[key].append(arr)
        fnames += t.fname
    return _table(names_all, stamps, errors, func_first, parts, fnames)
