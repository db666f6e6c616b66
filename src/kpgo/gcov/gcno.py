"""Reader of GCC notes files (.gcno), GCC 9–14 layouts: per function its identifiers and control-flow graph.

    header: magic "gcno", version, stamp, [checksum (GCC >= 12)], cwd string, support_unexecuted_blocks
    FUNCTION 0x01000000: ident, lineno_checksum, cfg_checksum, name string, artificial, source string, start line,
                         start column, end line [, end column (GCC >= 12)]
    BLOCKS   0x01410000: number of blocks (block 0 is ENTRY, block 1 is EXIT)
    ARCS     0x01430000: source block, then (destination block, flags) pairs
    LINES    0x01450000: skipped
Lengths count words before GCC 12 and bytes from GCC 12; strings are a length in words plus NUL-padded text before
GCC 12, and a length in bytes plus unpadded text (NUL included) from GCC 12, so records need not be word-aligned.

The arc counters of a function in the .gcda are those of its arcs *not* on the spanning tree (flag ON_TREE unset),
in the order of this file: blocks by ARCS record, arcs in record order.

API
    parse_gcno(data, name) -> Gcno
    read_gcno(path) -> Gcno
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kpgo.gcov.gcda import GCDA_MAGIC, GCNO_MAGIC, TAG_FUNCTION, GcovFormatError, Layout, layout_for_version, version_text

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
        self.bo = "little" if order == "<" else "big"
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


def parse_gcno(data: bytes, name: str) -> Gcno:
    if len(data) < 12:
        raise GcovFormatError(name, "truncated header" if data else "empty file")
    head = data[:4]
    if head == GCNO_MAGIC.to_bytes(4, "little"):
        order = "<"
    elif head == GCNO_MAGIC.to_bytes(4, "big"):
        order = ">"
    elif head in (GCDA_MAGIC.to_bytes(4, "little"), GCDA_MAGIC.to_bytes(4, "big")):
        raise GcovFormatError(name, "is a .gcda data file, not a .gcno notes file")
    else:
        raise GcovFormatError(name, f"not a .gcno file (magic bytes {head.hex()}, expected 'gcno')")
    bo = "little" if order == "<" else "big"
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
            line = 0
            try:  # the location part is informative only: tolerate what an unexpected layout puts there
                fname, p = r.string(body + 12)
                p += 4  # artificial
                source, p = r.string(p)
                line = r.u32(p)
            except GcovFormatError:
                pass
            cur = {"ident": ident, "lcs": lcs, "ccs": ccs, "name": fname, "source": source, "line": line,
                   "blocks": 0}
        elif tag == TAG_BLOCKS and cur is not None:
            cur["blocks"] = r.u32(body)
        elif tag == TAG_ARCS and cur is not None:
            if length < 4 or (length - 4) % 8:
                raise GcovFormatError(name, f"ARCS record at byte {pos} has a bad length {length}")
            arc_chunks.append((body, length // 4))
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
        cat = (lambda xs: np.concatenate(xs) if xs else np.zeros(0, dtype=np.int64))
        fn = GcnoFunction(
            ident=info["ident"], lineno_checksum=info["lcs"], cfg_checksum=info["ccs"], name=info["name"],
            source=info["source"], start_line=info["line"], n_blocks=info["blocks"],
            arc_src=cat(src), arc_dst=cat(dst), arc_flags=cat(flg),
        )
        if len(fn.arc_dst) and (fn.arc_dst.max() >= max(fn.n_blocks, 1) or fn.arc_src.max() >= max(fn.n_blocks, 1)):
            raise GcovFormatError(name, f"function {fn.name or fn.ident}: arc to a block beyond its {fn.n_blocks}")
        functions.append(fn)
    return Gcno(name=name, layout=layout, version=version, stamp=stamp, checksum=checksum, cwd=cwd,
                functions=functions)


def read_gcno(path: Path | str) -> Gcno:
    path = Path(path)
    return parse_gcno(path.read_bytes(), str(path))
