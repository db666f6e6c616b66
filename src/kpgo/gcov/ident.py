"""How GCC names a function in its profile, and re-keying a profile for the same tree at another path.

GCC's -fprofile-use (coverage.cc) looks each function's counters up by its ident and checks its checksums. The ident
of a function visible outside its object is a hash of its assembler name; that of any other function (static, a
static inline from a header) hashes the path of its source file as the compiler was given it, its name and the
object's base name (the -o path without ".o", relative to where GCC compiles: Kbuild's O= directory). The line
checksum hashes its first line, that path and its name. The hash is CRC-32 (polynomial 0x04c11db7, most significant
bit first, the string's terminating NUL included); an ident keeps 31 bits and is never 0.

An indirect-call value counter holds its callees' idents. So the same tree at another path (a patched copy of the
source, another release unpacked beside it) gives every static function another ident: GCC finds no profile for it,
says so only under -Wmissing-profile (which the kernel build silences), compiles it as code that never ran, and
cannot promote a call to it. kpgo re-keys the profile instead: the hash recomputed from the instrumented build's
.gcno (name, path, line) with the new root, each ident checked first against the one GCC wrote, so a compiler that
hashes otherwise is refused rather than guessed at. Checked on every function of the server
kernel's .gcno files (52,348: 18,099 visible outside their object, 34,249 not); docs/PROFILES.md.

API
    profile_id(name, source, aux, public) -> int
    line_checksum(line, source, name) -> int
    kind(fn, aux) -> "public" | "static" | None          which rule gave fn its ident (None: neither)
    rekey(notes, aux, old_root, new_root) -> Ids         old ident -> (new ident, new line checksum)
    build_source(build_dir) -> str | None                the tree a kpgo build compiled
    profile_rekey(profile, source) -> Rekey | None       what a profile needs to be found compiling the tree at source
    Rekeyer(rekey, rels).apply(g, rel) -> (Gcda, n)     one .gcda of it re-keyed (n: functions whose ident changed)
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from kpgo import inputs
from kpgo.errors import UserError
from kpgo.gcov.gcda import Gcda
from kpgo.gcov.gcno import Gcno, GcnoFunction, read_gcno
from kpgo.gcov.profile import origins, read_profile_json
from kpgo.records import BUILD_SHAPE

_POLY = 0x04C11DB7


def _table() -> list[int]:
    out = []
    for byte in range(256):
        c = byte << 24
        for _ in range(8):
            c = ((c << 1) ^ _POLY) if c & 0x80000000 else c << 1
            c &= 0xFFFFFFFF
        out.append(c)
    return out


_TABLE = _table()


def crc_string(crc: int, text: str) -> int:
    """GCC's crc32_string: text's bytes and its NUL, most significant bit first."""
    for b in text.encode() + b"\0":
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _TABLE[((crc >> 24) ^ b) & 0xFF]
    return crc


def _ident(crc: int) -> int:
    crc &= 0x7FFFFFFF
    return crc or 1


def profile_id(name: str, source: str, aux: str, public: bool) -> int:
    """The ident GCC gives a function: by name alone when it is visible outside its object."""
    if public:
        return _ident(crc_string(0, name))
    return _ident(crc_string(crc_string(crc_string(0, source), name), aux))


def line_checksum(line: int, source: str, name: str) -> int:
    return crc_string(crc_string(line, source), name)


def kind(fn: GcnoFunction, aux: str) -> str | None:
    """"public" or "static": the rule that reproduces fn's ident; None when neither does (or the .gcno lacks what
    the hash needs). GCC's hash zeroes the random part of C++ anonymous-namespace names ("_GLOBAL__N_"), which C
    never has: such a name is left unexplained rather than imitated."""
    if fn.name is None or fn.source is None or "_GLOBAL__" in fn.name or "_GLOBAL__" in fn.source:
        return None
    if profile_id(fn.name, "", "", True) == fn.ident:
        return "public"
    if profile_id(fn.name, fn.source, aux, False) == fn.ident:
        return "static"
    return None


@dataclass
class Ids:
    ids: dict[int, tuple[int, int]] = field(default_factory=dict)  # old ident -> (ident, line checksum) under the new root
    static: int = 0  # functions whose ident changes
    unexplained: list[str] = field(default_factory=list)  # functions under the old root neither rule reproduces


def rekey(notes: Gcno, aux: str, old_root: str, new_root: str) -> Ids:
    """Each function of notes as GCC names it when the tree at old_root is compiled from new_root instead (aux: the
    object's base name, which does not change). Functions outside old_root (generated files in the O= directory)
    keep their ident and checksum."""
    out = Ids()
    old, new = old_root.rstrip("/") + "/", new_root.rstrip("/") + "/"
    for fn in notes.functions:
        if fn.source is None or not fn.source.startswith(old):
            continue
        how = kind(fn, aux)
        if how is None:
            out.unexplained.append(fn.name or f"#{fn.ident}")
            continue
        assert fn.name is not None
        source = new + fn.source[len(old):]
        ident = fn.ident if how == "public" else profile_id(fn.name, source, aux, False)
        out.static += ident != fn.ident
        out.ids[fn.ident] = (ident, line_checksum(fn.start_line, source, fn.name))
    return out


@dataclass(frozen=True)
class Rekey:
    """A profile whose instrumented build compiled the tree at another path than the build that uses it."""
    build: Path  # the instrumented build: its .gcno name each function and its source path
    old_root: str
    new_root: str


def build_source(build_dir: Path) -> str | None:
    """The tree a kpgo build compiled (its build.json's `source`, resolved); None when build.json is absent, unusable
    or does not say."""
    try:
        rec = inputs.read_json(Path(build_dir) / "build.json", "", BUILD_SHAPE, missing_ok=True)
    except UserError:
        return None
    return str(Path(rec["source"]).resolve()) if isinstance(rec, dict) and isinstance(rec.get("source"), str) else None


def profile_rekey(profile: Path, source: Path) -> Rekey | None:
    """The re-keying a profile needs for GCC compiling the tree at `source` to find it; None when its instrumented
    build compiled the same path, or its records do not say which (its build gone or made before build.json named
    its source: the profile is used as it is, and kpgo's proof reports the weight GCC did not find)."""
    new_root = str(Path(source).resolve())
    found: set[tuple[str, str]] = set()
    for origin in origins(read_profile_json(profile)):
        build_dir = origin.get("build_dir")
        if isinstance(build_dir, str) and (root := build_source(Path(build_dir))) is not None:
            found.add((build_dir, root))
    roots = {root for _b, root in found}
    if len(roots) > 1:
        raise UserError(f"profile {profile} merges collections of kernels compiled from different trees ({', '.join(sorted(roots))})",
                        "merge the profiles of one instrumented build")
    if not found or roots == {new_root}:
        return None
    build_dir, old_root = sorted(found)[0]
    return Rekey(Path(build_dir), old_root, new_root)


class Rekeyer:
    """The re-keying of a profile's files (rels, relative to the profile) under rk: each file's idents and line
    checksums, and the profile ids its indirect-call counters hold (a callee's ident: a static callee in any object
    of the profile changes too). Reads each file's .gcno from the instrumented build once, refusing what it cannot
    re-key."""

    def __init__(self, rk: Rekey, rels: list[Path]) -> None:
        self.rk = rk
        self.files: dict[str, Ids] = {}
        self.callees: dict[int, int] = {}
        for rel in rels:
            stem = str(rel)[: -len(".gcda")]
            notes_path = rk.build / (stem + ".gcno")
            if not notes_path.is_file():
                raise UserError(f"the profile's instrumented build {rk.build} has no {stem}.gcno, which kpgo needs to re-key the profile "
                                f"for a tree at another path ({rk.old_root} -> {rk.new_root})",
                                "keep the instrumented build the profile was collected on, or build from the tree it compiled")
            got = rekey(read_gcno(notes_path), stem, rk.old_root, rk.new_root)
            if got.unexplained:
                raise UserError(f"{notes_path}: GCC's ident of {len(got.unexplained)} functions (e.g. {got.unexplained[0]}) is not the hash "
                                f"kpgo recomputes, so the profile cannot be re-keyed for the tree at {rk.new_root}",
                                f"build from the tree the profile's kernel compiled ({rk.old_root})")
            self.files[stem] = got
            self.callees.update((old, new) for old, (new, _lcs) in got.ids.items() if old != new)

    def apply(self, g: Gcda, rel: Path) -> tuple[Gcda, int]:
        """g (the profile's file rel) as GCC compiling from rk.new_root looks it up; and how many functions changed."""
        got = self.files[str(rel)[: -len(".gcda")]]
        out = g.with_function_ids(got.ids)
        for k in g.counter_kinds_present():
            if g.layout.kind_name(k) == "indirect_call" and self.callees:
                sites = out.sites(k)
                values = np.array([self.callees.get(int(v), int(v)) for v in sites.values.tolist()], dtype=np.uint64)
                out = out.with_sites(k, replace(sites, values=values))
        return out, got.static
