"""Bad input across every command, as a table: each case is the real command line in a child process, and each must
give exactly one `kpgo: error:` line naming the problem and the next step (the " — " hint), the expected non-zero
exit status, no traceback, every input byte-identical afterwards, no output (nor a half-written temporary sibling)
left behind, and no long step started.

"No long step" is checked, not assumed: every case runs with a PATH whose `make`, `vng` and `qemu-system-x86_64` are
tripwires that log their call and fail, so a case that would configure or compile a kernel, or boot a guest, before
finding its problem fails here (test_tripwire_catches_a_long_step shows that it does). The inputs are real: .gcda
and .gcno files from GCC (tests/gcov_fixtures.py), damaged the way files get damaged; kernel trees, builds and run
directories are small stand-ins with the files kpgo reads before any long step.

Set KPGO_MATRIX_LOG=FILE to get one JSON line per case (argv and error line) for docs/RELIABILITY.md."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from conftest import CliResult, assert_one_line_error, kpgo
from gcov_fixtures import build_program, kernelize_tree, require_gcc
from kpgo.workloads import GUEST_BUILTIN

DATA = Path(__file__).parent / "data"
TRIPWIRED = ("make", "vng", "qemu-system-x86_64")  # kernel configure and compile; guest boots
TAG_FUNCTION, TAG_ARCS, TAG_SUMMARY = 0x01000000, 0x01A10000, 0xA1000000
KERNEL_VERSION = "6.12.0"  # of the stand-in kernel tree, and of the profiles "collected" on it


# -- the world: every input of every case, made once -----------------------------------------------------------


@dataclass
class World:
    root: Path
    gcc_build: Path  # a real --coverage build: sources, objects, .gcno
    m0: Path  # libgcov-written profiles of it (object summary present), two workloads
    m1: Path
    k0: Path  # m0 as the kernel writes it (no summary)
    o2: Path  # a profile of another build of the same sources (-O2: other stamps and checksums)
    other_version: bytes  # a gcov version word kpgo reads but this GCC does not (e.g. B31* beside GCC 12)
    linux: Path  # stand-in kernel tree: the files kpgo reads before make
    instr: Path  # stand-in instrumented build (build.json, .config, bzImage that is never booted)
    run: Path  # a finished run directory (tests/data/report/tiny-cross-sim)
    ro: Path  # a directory nothing can be written in
    cache: Path  # KPGO_CACHE of every case (outside root: kpgo may create its cache directories on the way)
    trip: Path  # tripwire programs

    def p(self, name: str) -> Path:
        """A damaged or special profile made by the fixture."""
        return self.root / "p" / name

    def env(self, tmp: Path) -> dict[str, str]:
        venv_bin = os.path.dirname(sys.executable)  # kpgo puts its venv's bin on PATH unless it is there: keep it behind the tripwires
        return {"PATH": os.pathsep.join([str(self.trip), venv_bin, os.environ.get("PATH", "")]),
                "KPGO_TRIPWIRE": str(tmp / "tripwire.log"), "KPGO_ACCEL": "tcg", "KPGO_CACHE": str(self.cache)}


def _layout(w: np.ndarray) -> tuple[int, int]:
    """(header words, length units per word) from the version word: GCC >= 12 counts bytes and has a checksum."""
    major = (((int(w[1]) >> 24) & 0xFF) - ord("A")) * 10 + ((int(w[1]) >> 16) & 0xFF) - ord("0")
    return (4, 4) if major >= 12 else (3, 1)


def _record(w: np.ndarray, tag: int) -> int:
    """Position of the first record with `tag`, following the record chain."""
    hw, unit = _layout(w)
    pos = hw
    while pos + 1 < len(w):
        if int(w[pos]) == tag:
            return pos
        pos += 2 + int(w[pos + 1]) // unit
    raise AssertionError(f"no record 0x{tag:08x}")


def _edit(path: Path, fn: Callable[[np.ndarray], np.ndarray]) -> None:
    w = np.frombuffer(path.read_bytes(), dtype="<u4").copy()
    path.write_bytes(np.asarray(fn(w), dtype="<u4").tobytes())


def _copy(src: Path, dst: Path, info: dict | None = None) -> Path:
    shutil.copytree(src, dst)
    if info is not None:
        (dst / "profile.json").write_text(json.dumps(info))
    return dst


def _version(w: np.ndarray, word: bytes) -> np.ndarray:
    w[1] = int.from_bytes(word, "big")
    return w


def _set_counter(value: int) -> Callable[[np.ndarray], np.ndarray]:
    def fn(w: np.ndarray) -> np.ndarray:
        a = _record(w, TAG_ARCS) + 2
        w[a], w[a + 1] = value & 0xFFFFFFFF, value >> 32
        return w
    return fn


def _half_counter(w: np.ndarray) -> np.ndarray:
    a = _record(w, TAG_ARCS)
    w[a + 1] -= 4 if _layout(w)[1] == 4 else 1  # one word less: the record ends inside a counter
    return w


def _short_summary(w: np.ndarray) -> np.ndarray:
    hw, unit = _layout(w)
    return np.concatenate([w[:hw], np.array([TAG_SUMMARY, unit, 5], dtype=np.uint32), w[hw:]])


def _make_profiles(w: World) -> None:
    """Damaged and special profiles, each a copy of a real one with one defect."""
    base = w.root / "p"
    base.mkdir()
    gcda = "main.gcda"

    def damaged(name: str, fn: Callable[[np.ndarray], np.ndarray] | None = None, data: Callable[[bytes], bytes] | None = None,
                src: Path = w.k0, info: dict | None = None) -> Path:
        d = _copy(src, base / name, info)
        if fn is not None:
            _edit(d / gcda, fn)
        if data is not None:
            (d / gcda).write_bytes(data((d / gcda).read_bytes()))
        return d

    damaged("cut-mid-word", data=lambda b: b[:-6])
    damaged("cut-record", data=lambda b: b[:-8])
    damaged("cut-header", data=lambda b: b[:10])
    damaged("empty-file", data=lambda b: b"")
    damaged("text", data=lambda b: b"this is not a coverage file, just named like one\n")
    damaged("gcno", data=lambda b: (w.gcc_build / "main.gcno").read_bytes())
    damaged("gcc8", lambda x: _version(x, b"A81*"))
    damaged("gcc15", lambda x: _version(x, b"B51*"))
    damaged("version-junk", lambda x: _version(x, b"\x00\x01\x02\x03"))

    def long_len(x: np.ndarray) -> np.ndarray:
        x[_record(x, TAG_FUNCTION) + 1] = 0x7FFFFFF0
        return x

    def negative_len(x: np.ndarray) -> np.ndarray:
        x[_record(x, TAG_FUNCTION) + 1] = 0xFFFFFFF0
        return x

    def odd_bytes(x: np.ndarray) -> np.ndarray:
        x[_record(x, TAG_ARCS) + 1] += 1
        return x

    damaged("length-past-end", long_len)
    damaged("negative-length", negative_len)
    damaged("length-odd-bytes", odd_bytes)
    damaged("half-counter", _half_counter)
    damaged("short-summary", _short_summary)
    damaged("count-2p63", _set_counter(1 << 63))
    damaged("count-2p62", _set_counter(1 << 62))
    damaged("count-2p62-b", _set_counter(1 << 62))
    damaged("mixed-versions", lambda x: _version(x, w.other_version))
    damaged("other-gcc", lambda x: _version(x, w.other_version))
    for f in (base / "other-gcc").rglob("*.gcda"):
        _edit(f, lambda x: _version(x, w.other_version))
    (base / "empty").mkdir()
    _copy(w.m0, base / "bad-json")
    (base / "bad-json" / "profile.json").write_text("{not json")
    # What `kpgo collect --workload redis,micro -o DIR` writes: two profiles in one directory.
    (base / "two-profiles").mkdir()
    _copy(w.m0, base / "two-profiles" / "redis", {"config_name": "tiny"})
    _copy(w.m1, base / "two-profiles" / "micro", {"config_name": "tiny"})

    # Profiles for `kpgo build --variant optimized` on the stand-in tree: each fine but for one thing.
    meta = {"kind": "kernel-gcov-profile", "config_name": "tiny", "kernel_release": KERNEL_VERSION, "build_key": "k"}
    _copy(w.m0, base / "fit", meta)
    _copy(w.k0, base / "raw", meta)
    _copy(w.m0, base / "server-config", meta | {"config_name": "server"})
    _copy(w.m0, base / "other-kernel", meta | {"kernel_release": "6.1.0"})
    damaged("fit-other-gcc", lambda x: _version(x, w.other_version), src=w.m0, info=meta)
    for f in (base / "fit-other-gcc").rglob("*.gcda"):
        _edit(f, lambda x: _version(x, w.other_version))
    damaged("fit-mixed-versions", lambda x: _version(x, w.other_version), src=w.m0, info=meta)
    damaged("fit-cut", data=lambda b: b[:-8], src=w.m0, info=meta)
    damaged("fit-count-2p63", _set_counter(1 << 63), src=w.m0, info=meta)


def _make_trees(w: World) -> None:
    """A stand-in kernel tree (what kpgo reads before make), trees that are not kernels, configs and fragments."""
    major, minor, sub = KERNEL_VERSION.split(".")
    (w.linux / "arch" / "x86").mkdir(parents=True)
    (w.linux / "Makefile").write_text(f"VERSION = {major}\nPATCHLEVEL = {minor}\nSUBLEVEL = {sub}\nEXTRAVERSION =\n")
    (w.linux / "Kconfig").write_text('config GCOV_KERNEL\n\tbool "gcov"\nmenuconfig NET\n\tbool "net"\n')
    (w.linux / "arch" / "x86" / "Makefile").write_text("")
    (w.linux / "arch" / "x86" / "Kconfig").write_text("config X86_64\n\tdef_bool y\n")
    t = w.root / "trees"
    shutil.copytree(w.linux, t / "no-x86")
    shutil.rmtree(t / "no-x86" / "arch" / "x86")
    (t / "no-x86" / "arch" / "arm64").mkdir()
    shutil.copytree(w.linux, t / "no-version")
    (t / "no-version" / "Makefile").write_text("all:\n\techo not a kernel makefile\n")
    (t / "linux-9.9.tar.xz").write_bytes(b"\xfd7zXZ\x00 truncated")
    cfg = w.root / "cfg"
    cfg.mkdir()
    (cfg / "net.config").write_text("CONFIG_NET=y\n# CONFIG_GCOV_KERNEL is not set\n")
    (cfg / "typo.config").write_text("CONFIG_NETT=y\n")
    (cfg / "spaces.config").write_text("CONFIG_NET = y\n")
    (cfg / "comments.config").write_text("# only a comment\n\n")
    (cfg / "arm64.config").write_text("CONFIG_ARM64=y\nCONFIG_NET=y\n")
    (cfg / "results.json").write_text('{"schema": 2}\n')


def _make_builds_and_runs(w: World) -> None:
    """Stand-in kernel builds (what bench and collect read before a boot) and run directories."""
    for name, gcov in (("instr", True), ("vanilla", False)):
        d = w.root / "builds" / name
        (d / "arch" / "x86" / "boot").mkdir(parents=True)
        (d / "arch" / "x86" / "boot" / "bzImage").write_bytes(b"never booted: the tripwires stop any boot\n")
        guest = "".join(f"CONFIG_{o}=y\n" for o in GUEST_BUILTIN)  # what kpgo's guest needs of any kernel
        (d / ".config").write_text(guest + ("CONFIG_GCOV_KERNEL=y\n" if gcov else "CONFIG_NET=y\n"))
        (d / "build.json").write_text(json.dumps({
            "ok": True, "gcov": gcov, "key": f"stand-in-{name}", "build_dir": str(d), "kernel_release": KERNEL_VERSION,
            "variant": "instrumented" if gcov else "vanilla", "config_name": "tiny", "config_hash": "0", "gcc": "0"}))
    (w.root / "builds" / "not-built").mkdir()
    (w.root / "builds" / "not-built" / "notes.txt").write_text("a directory, not a kpgo build\n")
    shutil.copytree(DATA / "report" / "tiny-cross-sim", w.run)
    runs = w.root / "runs"
    (runs / "schema1" / "bench").mkdir(parents=True)
    (runs / "schema1" / "bench" / "results.json").write_text('{"schema": 1, "workloads": {}}\n')
    (runs / "bad-json" / "bench").mkdir(parents=True)
    (runs / "bad-json" / "bench" / "results.json").write_text("{truncated")
    (runs / "not-object").mkdir()
    (runs / "not-object" / "run.json").write_text("[1, 2]\n")
    (w.root / "a-file.txt").write_text("a file where a directory is expected\n")


def _no_9p(w: World, t: Path) -> Path:
    """A copy of the stand-in instrumented build whose 9p is a module."""
    d = t / "no-9p"
    shutil.copytree(w.root / "builds" / "instr", d)
    (d / ".config").write_text((d / ".config").read_text().replace("CONFIG_9P_FS=y", "CONFIG_9P_FS=m"))
    return d


def _special(path: Path, kind: str) -> Path:
    """A FIFO, a device (a link to /dev/zero: endless), a socket or a directory where kpgo expects a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "socket":
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(str(path))  # the socket file stays after the socket is closed
    else:
        path.mkdir()
    return path


def _make_bad_files(w: World) -> None:
    """Every kind of file kpgo reads, given as a special file, binary garbage, a cut file or JSON of the wrong shape."""
    f = w.root / "f"
    garbage = bytes(range(128, 256)) * 2
    meta = {"kind": "kernel-gcov-profile", "config_name": "tiny", "kernel_release": KERNEL_VERSION, "build_key": "k"}
    for name, kind in (("gcda-fifo", "fifo"), ("gcda-device", "device"), ("gcda-socket", "socket")):
        _special(_copy(w.m0, f / name) / "kernel" / "extra.gcda", kind)
    for name, kind in (("pj-fifo", "fifo"), ("pj-dir", "dir")):
        _special(_copy(w.m0, f / name) / "profile.json", kind)
    (_copy(w.m0, f / "pj-binary") / "profile.json").write_bytes(garbage)
    _copy(w.m0, f / "pj-config-list", meta | {"config_name": ["tiny"]})
    _copy(w.m0, f / "pj-merged-text", {"merged": {"inputs": "m0,m1"}})
    for name, kind in (("gcno-fifo", "fifo"), ("gcno-device", "device")):
        shutil.copytree(w.gcc_build, f / name)
        _special(f / name / "main.gcno", kind)
    # builds: build.json and the kernel image
    good = json.loads((w.instr / "build.json").read_text())
    for name, data in (("bj-binary", garbage), ("bj-key-number", json.dumps(good | {"key": 5}).encode()),
                       ("bj-list", b"[1, 2]\n"), ("bj-cut", json.dumps(good).encode()[:40]), ("no-image", None), ("image-fifo", None)):
        d = f / "builds" / name
        shutil.copytree(w.instr, d)
        if data is not None:
            (d / "build.json").write_bytes(data)
    shutil.copytree(w.instr, f / "builds" / "bj-fifo")
    _special(f / "builds" / "bj-fifo" / "build.json", "fifo")
    (f / "builds" / "no-image" / "arch" / "x86" / "boot" / "bzImage").unlink()
    _special(f / "builds" / "image-fifo" / "arch" / "x86" / "boot" / "bzImage", "fifo")
    # run directories: run.json and bench/results.json
    runs = f / "runs"
    results = json.loads((w.run / "bench" / "results.json").read_text())
    run_json = json.loads((w.run / "run.json").read_text())
    wl = next(iter(results["workloads"]))
    row_text = json.loads(json.dumps(results))
    row_text["workloads"][wl]["summary"][0]["mean"] = "fast"
    kernels_list = results | {"kernels": ["vanilla"]}
    request_number = json.loads(json.dumps(run_json))
    request_number.setdefault("request", {})["workload"] = 5
    for name, rel, data in (("run-binary", "run.json", garbage), ("run-workloads-list", "run.json", json.dumps(run_json | {"workloads": [1]}).encode()),
                            ("run-cut", "run.json", json.dumps(run_json).encode()[:100]),
                            ("run-request-number", "run.json", json.dumps(request_number).encode()),
                            ("results-row-text", "bench/results.json", json.dumps(row_text).encode()),
                            ("results-kernels-list", "bench/results.json", json.dumps(kernels_list).encode()),
                            ("run-fifo", "run.json", None), ("results-device", "bench/results.json", None), ("results-dir", "bench/results.json", None)):
        shutil.copytree(w.run, runs / name)
        if data is not None:
            (runs / name / rel).write_bytes(data)
    _special(runs / "run-fifo" / "run.json", "fifo")
    _special(runs / "results-device" / "bench" / "results.json", "device")
    _special(runs / "results-dir" / "bench" / "results.json", "dir")
    # variant files, configs, call graphs
    _special(f / "variant-fifo.toml", "fifo")
    (f / "variant-binary.toml").write_bytes(garbage)
    _special(f / "variant-dir.toml", "dir")
    (f / "variant-deep.toml").write_text("flags = " + "[" * 100_000 + "\n")
    _special(f / "fragment-fifo.config", "fifo")
    (f / "fragment-binary.config").write_bytes(garbage)
    _special(f / "config-dir.config", "dir")
    _special(f / "callgraph-fifo.tsv", "fifo")
    (f / "branches").mkdir()
    (f / "branches" / "callgraph.tsv").write_text("caller\tcallee\tcalls\ttail_calls\n")
    _special(f / "branches" / "profile.json", "fifo")


def _make_tripwires(trip: Path) -> None:
    trip.mkdir()
    for name in TRIPWIRED:
        (trip / name).write_text('#!/bin/sh\necho "$0 $*" >> "${KPGO_TRIPWIRE:?}"\nexit 97\n')
        (trip / name).chmod(0o755)


def _make_read_only(d: Path) -> None:
    """A directory nothing can be created in, for root too (the immutable attribute), else by its mode."""
    d.mkdir()
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(d)], check=True)
    else:
        d.chmod(0o555)
    probe = d / "probe"
    try:
        probe.mkdir()
    except OSError:
        return
    probe.rmdir()
    pytest.fail(f"cannot make a read-only directory here ({d})")


def _release_read_only(d: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(d)], check=False)
    d.chmod(0o755)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    require_gcc()
    root = tmp_path_factory.mktemp("bad-input-world")
    b = build_program(root / "gcc-build")
    m0 = b.profile(root / "m0", 0, 1000)
    m1 = b.profile(root / "m1", 1, 3000)
    b.clear_gcda()
    b2 = build_program(root / "gcc-build-O2", opt="-O2")
    o2 = b2.profile(root / "o2", 0, 100)
    b2.clear_gcda()
    native = np.frombuffer((m0 / "main.gcda").read_bytes()[4:8], dtype="<u4")[0]
    major = (((int(native) >> 24) & 0xFF) - ord("A")) * 10 + ((int(native) >> 16) & 0xFF) - ord("0")
    w = World(root=root, gcc_build=b.root, m0=m0, m1=m1, k0=kernelize_tree(m0, root / "k0"), o2=o2,
              other_version=b"B31*" if major != 13 else b"B41*", linux=root / "linux", instr=root / "builds" / "instr",
              run=root / "run", ro=root / "ro", cache=tmp_path_factory.mktemp("cache"), trip=tmp_path_factory.mktemp("tripwires") / "bin")
    _make_profiles(w)
    _make_trees(w)
    _make_builds_and_runs(w)
    _make_bad_files(w)
    _make_tripwires(w.trip)
    _make_read_only(w.ro)
    yield w
    _release_read_only(w.ro)


def tree_digest(root: Path) -> str:
    """Names and bytes of everything under root (a new, changed or removed file or directory changes it)."""
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        if p.is_file() and not p.is_symlink():
            h.update(p.read_bytes())
    return h.hexdigest()


# -- the cases -------------------------------------------------------------------------------------------------

Argv = Callable[[World, Path], list]  # (world, this case's empty output directory) -> arguments after `kpgo`
Outs = Callable[[World, Path], list]  # paths that must not exist afterwards


@dataclass(frozen=True)
class Case:
    id: str
    category: str  # profiles | options | trees | outputs
    what: str  # what is wrong, for docs/RELIABILITY.md
    argv: Argv
    code: int
    needles: tuple[str, ...]
    outs: Outs = lambda w, t: [t / "out"]
    env: Callable[[World, Path], dict[str, str]] | None = None  # extra environment


def C(id: str, category: str, what: str, argv: Argv, code: int, *needles: str, outs: Outs | None = None,
      env: Callable[[World, Path], dict[str, str]] | None = None) -> Case:
    return Case(id, category, what, argv, code, needles, outs or (lambda w, t: [t / "out"]), env)


def fix(name: str, *more: str) -> Argv:
    return lambda w, t: ["profile", "fix", w.p(name), "-o", t / "out", *more]


def stats(name: str) -> Argv:
    return lambda w, t: ["profile", "stats", w.p(name)]


def merge_with_m0(name: str, *more: str) -> Argv:
    return lambda w, t: ["profile", "merge", w.m0, w.p(name), "-o", t / "out", *more]


def build_opt(profile: str, *more: str) -> Argv:
    return lambda w, t: ["build", "--source", w.linux, "--base", "tiny", "--variant", "optimized", "--profile", w.p(profile),
                         "-o", t / "out", *more]


def build(*more: str | Callable[[World], Path]) -> Argv:
    return lambda w, t: ["build", "--source", w.linux, "-o", t / "out", *[m(w) if callable(m) else m for m in more]]


def bench(*more: str) -> Argv:
    return lambda w, t: ["bench", "--kernel", f"vanilla={w.instr}", "-o", t / "out", *more]


def collect(*more: str) -> Argv:
    return lambda w, t: ["collect", w.instr, "-o", t / "out", *more]


def sensitivity(*more: str) -> Argv:
    return lambda w, t: ["study", "sensitivity", w.run, "--workload", "redis", *more]


def bad(name: str) -> Callable[[World], Path]:
    return lambda w: w.root / "f" / name


def on_file(*argv: str | Callable[[World], Path]) -> Argv:
    return lambda w, t: [a(w) if callable(a) else a.replace("T/", f"{t}/") for a in argv]


def cfg(name: str) -> Callable[[World], Path]:
    return lambda w: w.root / "cfg" / name


NONE: Outs = lambda w, t: []  # noqa: E731 (commands with no output path; the world digest covers the rest)

CASES: list[Case] = [
    # ---- profiles: damaged, foreign, of another GCC, impossible, mixed ----
    C("stats-gcda-cut-mid-word", "profiles", "a .gcda cut in the middle of a word", stats("cut-mid-word"), 1,
      "main.gcda", "truncated", "not a multiple of 4", outs=NONE),
    C("fix-gcda-cut-in-record", "profiles", "a .gcda cut inside its last record", fix("cut-record"), 1,
      "main.gcda", "runs past the end of the file"),
    C("merge-gcda-cut-in-record", "profiles", "one merge input has a cut .gcda", merge_with_m0("cut-record"), 1,
      "cut-record/main.gcda", "runs past the end"),
    C("stats-gcda-cut-header", "profiles", "a .gcda of 10 bytes (less than a header)", stats("cut-header"), 1,
      "truncated header (10 bytes)", outs=NONE),
    C("fix-gcda-empty-file", "profiles", "an empty file named .gcda", fix("empty-file"), 1, "main.gcda", "empty file"),
    C("stats-foreign-text-file", "profiles", "a text file named .gcda", stats("text"), 1, "not a .gcda file", outs=NONE),
    C("fix-gcno-named-gcda", "profiles", "a real .gcno (GCC's notes file) named .gcda", fix("gcno"), 1,
      "is a .gcno notes file, not a .gcda data file"),
    C("stats-gcov-version-gcc8", "profiles", "a .gcda of GCC 8 (version word A81*)", stats("gcc8"), 1,
      "unsupported gcov version 'A81*' (GCC 8)", outs=NONE),
    C("fix-gcov-version-gcc15", "profiles", "a .gcda of GCC 15 (B51*)", fix("gcc15"), 1, "unsupported gcov version", "(GCC 15)"),
    C("merge-gcov-version-junk", "profiles", "a .gcda whose version word is not a version", merge_with_m0("version-junk"), 1,
      "unsupported gcov version '0x00010203'"),
    C("stats-record-length-past-end", "profiles", "a record length far past the end of the file", stats("length-past-end"), 1,
      "runs past the end of the file", outs=NONE),
    C("fix-negative-length-function", "profiles", "a FUNCTION record with a negative length", fix("negative-length"), 1,
      "record 0x01000000", "runs past the end"),
    C("stats-length-not-whole-words", "profiles", "a counter record length not a multiple of 4 bytes",
      stats("length-odd-bytes"), 1, "not a multiple of 4 bytes", outs=NONE),
    C("stats-half-a-counter", "profiles", "a counter record holding an odd number of words (half a counter)",
      stats("half-counter"), 1, "impossible count", "each counter takes two", outs=NONE),
    C("fix-summary-one-word", "profiles", "an object summary record of one word", fix("short-summary"), 1,
      "object summary", "holds 1 word,"),
    C("fix-counter-above-2p63", "profiles", "an arc counter of 2^63 (negative to GCC)", fix("count-2p63"), 1,
      "main.gcda", "above 2^63-1", "impossible count"),
    C("merge-counter-above-2p63", "profiles", "a merge input with an arc counter of 2^63", merge_with_m0("count-2p63"), 1,
      "exceeds 2^63-1"),
    C("merge-sum-overflows", "profiles", "two inputs whose counters (2^62 each) sum past 2^63-1",
      lambda w, t: ["profile", "merge", w.p("count-2p62"), w.p("count-2p62-b"), "-o", t / "out"], 1, "main.gcda", "exceeds 2^63-1"),
    C("merge-weights-overflow", "profiles", "real counts times a weight of 10^18", merge_with_m0("fit", "--weights", "1e18,1"), 1,
      "exceeds 2^63-1", "smaller --weights"),
    C("merge-profiles-of-two-builds", "profiles", "profiles of two builds (other stamps)",
      lambda w, t: ["profile", "merge", w.m0, w.o2, "-o", t / "out"], 1, "profiles from different builds"),
    C("merge-two-gcov-versions", "profiles", "merge inputs written by two GCC versions", merge_with_m0("other-gcc"), 1,
      "gcov versions differ"),
    C("fix-mixed-versions-in-one-dir", "profiles", "one profile directory with files of two GCC versions",
      fix("mixed-versions"), 1, "mixes .gcda files of 2 gcov versions"),
    C("stats-two-profiles-in-one-dir", "profiles", "a directory holding two profiles (collect --workload a,b)",
      stats("two-profiles"), 1, "holds 2 profiles (micro, redis)", outs=NONE),
    C("merge-two-profiles-in-one-dir", "profiles", "a merge input holding two profiles", merge_with_m0("two-profiles"), 1,
      "holds 2 profiles", "pass one of them"),
    C("fix-empty-dir", "profiles", "an empty profile directory", fix("empty"), 1, "no .gcda files"),
    C("stats-missing-dir", "profiles", "a profile directory that does not exist", stats("nope"), 1, "does not exist", outs=NONE),
    C("stats-file-not-dir", "profiles", "a .gcda file given as the profile directory",
      lambda w, t: ["profile", "stats", w.m0 / "main.gcda"], 1, "is not a directory", outs=NONE),
    C("fix-bad-profile-json", "profiles", "a profile.json that is not JSON", fix("bad-json"), 1, "profile.json", "not valid JSON"),
    C("check-build-without-gcno", "profiles", "profile check --build of a directory without .gcno",
      lambda w, t: ["profile", "check", w.m0, "--build", w.m1], 1, "holds no .gcno files", outs=NONE),
    C("check-build-missing", "profiles", "profile check --build that does not exist",
      lambda w, t: ["profile", "check", w.m0, "--build", w.root / "nope"], 1, "does not exist", outs=NONE),
    C("compare-profile-of-other-build", "profiles", "compare a profile of another build",
      lambda w, t: ["profile", "compare", w.m0, w.o2, "--build", w.gcc_build], 1, "does not match the build's .gcno", outs=NONE),
    C("compare-one-profile", "profiles", "compare with one profile",
      lambda w, t: ["profile", "compare", w.m0, "--build", w.gcc_build], 1, "two or more profiles", outs=NONE),
    C("build-raw-profile", "profiles", "optimized build from a raw kernel profile (no object summary)", build_opt("raw"), 1,
      "no object summary", "kpgo profile fix"),
    C("build-profile-of-other-config", "profiles", "optimized build from a profile collected on another config",
      build_opt("server-config"), 1, "collected on a server kernel; this build is tiny"),
    C("build-profile-of-other-kernel", "profiles", "optimized build from a profile of another kernel version",
      build_opt("other-kernel"), 1, "collected on kernel 6.1.0", f"the source is {KERNEL_VERSION}"),
    C("build-profile-of-other-gcc", "profiles", "optimized build from a profile written by another GCC version",
      build_opt("fit-other-gcc"), 1, "written by another GCC", "which ignores it"),
    C("build-profile-mixed-versions", "profiles", "optimized build from a profile mixing two GCC versions",
      build_opt("fit-mixed-versions"), 1, "mixes .gcda files of 2 gcov versions"),
    C("build-profile-two-profiles", "profiles", "optimized build from a directory holding two profiles",
      build_opt("two-profiles"), 1, "holds 2 profiles"),
    C("build-profile-without-profile-json", "profiles", "optimized build from a profile without profile.json",
      lambda w, t: ["build", "--source", w.linux, "--base", "tiny", "--variant", "optimized", "--profile", w.m0, "-o", t / "out"], 1,
      "has no profile.json"),
    C("build-profile-damaged", "profiles", "optimized build from a profile with a cut .gcda", build_opt("fit-cut"), 1,
      "main.gcda", "runs past the end"),
    C("build-profile-impossible-count", "profiles", "optimized build from a profile with an arc counter of 2^63",
      build_opt("fit-count-2p63"), 1, "impossible count"),
    C("build-profile-missing", "profiles", "optimized build from a profile directory that does not exist",
      build_opt("nope"), 1, "not found"),

    # ---- options ----
    C("merge-weights-wrong-count", "options", "--weights with 3 values for 2 inputs", merge_with_m0("fit", "--weights", "1,2,3"), 1,
      "--weights has 3 values for 2 profiles"),
    C("merge-weights-not-a-number", "options", "--weights 1,x", merge_with_m0("fit", "--weights", "1,x"), 1, "'x' is not a number"),
    C("merge-weights-negative", "options", "--weights -1,1", merge_with_m0("fit", "--weights=-1,1"), 1, "finite number >= 0"),
    C("merge-weights-all-zero", "options", "--weights 0,0", merge_with_m0("fit", "--weights", "0,0"), 1, "all zero"),
    C("merge-weights-nan", "options", "--weights nan,1", merge_with_m0("fit", "--weights", "nan,1"), 1, "'nan' must be a finite"),
    C("merge-runs-zero", "options", "profile merge --summary-runs 0", merge_with_m0("fit", "--summary-runs", "0"), 1, "--summary-runs", "at least 1"),
    C("merge-runs-too-big", "options", "profile merge --summary-runs 2^32 (used to be taken as 2^32-1)",
      merge_with_m0("fit", "--summary-runs", str(1 << 32)), 1, "--summary-runs 4294967296 is out of range"),
    C("merge-same-input-twice", "options", "the same profile given twice to merge",
      lambda w, t: ["profile", "merge", w.m0, w.m0, "-o", t / "out"], 1, "is given twice", "--weights"),
    C("fix-runs-zero", "options", "profile fix --summary-runs 0", fix("fit", "--summary-runs", "0"), 1, "--summary-runs", "at least 1"),
    C("fix-runs-too-big", "options", "profile fix --summary-runs 2^32", fix("fit", "--summary-runs", str(1 << 32)), 1,
      "--summary-runs 4294967296 is out of range"),
    C("bench-boots-zero", "options", "bench --boots 0", bench("--boots", "0"), 1, "--boots", "at least 1"),
    C("bench-runs-negative", "options", "bench --runs -1", bench("--runs=-1"), 1, "--runs", "at least 1"),
    C("build-jobs-zero", "options", "build -j 0", build("--base", "tiny", "-j", "0"), 1, "-j/--jobs", "at least 1"),
    C("build-jobs-not-a-number", "options", "build -j many", build("--base", "tiny", "-j", "many"), 2, "invalid int value: 'many'"),
    C("run-boots-zero", "options", "run --boots 0 (used to fail only at the bench, after every build)",
      lambda w, t: ["run", "--source", w.linux, "--base", "tiny", "--boots", "0", "--dir", t / "out"], 1, "--boots", "at least 1"),
    C("study-sensitivity-boots-zero", "options", "study sensitivity --boots 0 (used to start the builds first)",
      sensitivity("--vary", "clients=1,50", "--boots", "0"), 1, "--boots", outs=NONE),
    C("collect-cpus-zero", "options", "collect --cpus 0", collect("--cpus", "0"), 1, "--cpus", "at least 1"),
    C("bench-guest-timeout-zero", "options", "bench --guest-timeout 0", bench("--guest-timeout", "0"), 1, "--guest-timeout"),
    C("bench-guest-timeout-nan", "options", "bench --guest-timeout nan (used to reach the boot)", bench("--guest-timeout", "nan"), 1,
      "--guest-timeout", "finite"),
    C("bench-memory-not-a-size", "options", "bench --memory '2G; true' (pasted into vng's shell command)",
      bench("--memory", "2G; true"), 1, "--memory", "not a memory size"),
    C("bench-unknown-workload", "options", "bench --workload nosuch", bench("--workload", "nosuch"), 1, "unknown workload 'nosuch'"),
    C("workloads-list-unknown", "options", "workloads list nosuch", lambda w, t: ["workloads", "list", "nosuch"], 1,
      "unknown workload 'nosuch'", outs=NONE),
    C("workloads-install-unknown", "options", "workloads install nosuch (refused before apt-get)",
      lambda w, t: ["workloads", "install", "redis,nosuch"], 1, "unknown workload 'nosuch'", outs=NONE),
    C("workloads-list-empty", "options", "workloads list , (used to blame --workload)", lambda w, t: ["workloads", "list", ","], 1,
      "the argument ',' names no workload", outs=NONE),
    C("collect-workload-empty", "options", "collect --workload ,", collect("--workload", ","), 1, "--workload ',' names no workload"),
    C("collect-set-without-value", "options", "--set redis.clients (no =VALUE)", collect("--set", "redis.clients"), 1,
      "expected KEY=VALUE"),
    C("collect-set-unknown-key", "options", "--set redis.nosuch=5", collect("--set", "redis.nosuch=5"), 1,
      "nosuch is not a parameter of redis"),
    C("collect-set-empty-int", "options", "--set requests= (an int parameter)", collect("--set", "requests="), 1,
      "takes a value of type int"),
    C("collect-set-workload-not-chosen", "options", "--set nginx.clients=5 with --workload redis", collect("--set", "nginx.clients=5"), 1,
      "workload nginx is not chosen"),
    C("collect-client-unknown", "options", "--client elsewhere", collect("--client", "elsewhere"), 2, "invalid choice: 'elsewhere'"),
    C("bench-sim-opt-not-a-number", "options", "--sim-opt l1i_size=big", bench("--sim-opt", "l1i_size=big"), 1, "not a number"),
    C("bench-sim-opt-unknown-key", "options", "--sim-opt l2_size=1M", bench("--sim-opt", "l2_size=1M"), 1, "with a known KEY"),
    C("bench-sim-opt-not-power-of-two", "options", "--sim-opt l1i_line=48", bench("--sim-opt", "l1i_line=48"), 1,
      "l1i_line=48 is not a power of two"),
    C("bench-sim-opt-with-no-sim", "options", "--sim-opt with --no-sim", bench("--no-sim", "--sim-opt", "l1i_line=64"), 1,
      "--sim-opt given with --no-sim"),
    C("bench-kernel-dir-missing", "options", "--kernel LABEL=a directory that does not exist",
      lambda w, t: ["bench", "--kernel", f"a={w.root / 'nope'}", "-o", t / "out"], 1, "holds no complete kpgo build"),
    C("bench-kernel-not-built", "options", "--kernel LABEL=a directory that is not a build",
      lambda w, t: ["bench", "--kernel", f"a={w.root / 'builds' / 'not-built'}", "-o", t / "out"], 1, "holds no complete kpgo build"),
    C("bench-duplicate-labels", "options", "two --kernel with the same label",
      lambda w, t: ["bench", "--kernel", f"a={w.instr}", "--kernel", f"a={w.root / 'builds' / 'vanilla'}", "-o", t / "out"], 1,
      "labels must be distinct"),
    C("bench-same-kernel-twice", "options", "the same build twice without labels",
      lambda w, t: ["bench", "--kernel", str(w.instr), "--kernel", str(w.instr), "-o", t / "out"], 1, "labels must be distinct"),
    C("compare-duplicate-names", "options", "profile compare --names a,a",
      lambda w, t: ["profile", "compare", w.m0, w.m1, "--build", w.gcc_build, "--names", "a,a"], 1, "label a names two profiles",
      outs=NONE),
    C("compare-names-count", "options", "profile compare --names with one label for two profiles",
      lambda w, t: ["profile", "compare", w.m0, w.m1, "--build", w.gcc_build, "--names", "a"], 1, "--names has 1 labels", outs=NONE),
    C("study-vary-without-values", "options", "study sensitivity --vary clients", sensitivity("--vary", "clients"), 1,
      "expected KEY=V1,V2", outs=NONE),
    C("study-vary-one-value", "options", "study sensitivity --vary clients=1", sensitivity("--vary", "clients=1"), 1,
      "two or more values", outs=NONE),
    C("study-vary-value-twice", "options", "study sensitivity --vary clients=1,1 (used to build, then fail at the bench)",
      sensitivity("--vary", "clients=1,1"), 1, "a value is given twice", outs=NONE),
    C("study-vary-names-collide", "options", "study sensitivity --vary tests=a:b,a/b (one kernel name for both)",
      sensitivity("--vary", "tests=a:b,a/b"), 1, "the same kernel name", outs=NONE),
    C("study-vary-and-set-same-key", "options", "study sensitivity --vary clients=1,2 --set clients=4",
      sensitivity("--vary", "clients=1,2", "--set", "clients=4"), 1, "fixes the parameter", outs=NONE),
    C("study-vary-wrong-type", "options", "study sensitivity --vary clients=a,b", sensitivity("--vary", "clients=a,b"), 1,
      "takes a value of type int", outs=NONE),
    C("study-sensitivity-unknown-workload", "options", "study sensitivity --workload nosuch",
      lambda w, t: ["study", "sensitivity", w.run, "--workload", "nosuch", "--vary", "clients=1,2"], 1, "unknown workload", outs=NONE),
    C("build-partial-training-vanilla", "options", "build --partial-training without --variant optimized",
      build("--base", "tiny", "--partial-training"), 1, "only for --variant optimized"),
    C("build-profile-with-vanilla", "options", "build --profile with --variant vanilla",
      lambda w, t: ["build", "--source", w.linux, "--profile", w.p("fit"), "-o", t / "out"], 1, "--profile is only for --variant optimized"),
    C("build-base-empty", "options", "build --base '' (used to be taken for server, and configured)", build("--base", ""), 1,
      "unknown base config ''"),
    C("build-variant-unknown", "options", "build --variant fast", build("--variant", "fast"), 1, "unknown variant 'fast'", "kpgo variants list"),

    # ---- trees, configs, runs ----
    C("build-source-not-a-kernel", "trees", "--source a directory that is no kernel tree",
      lambda w, t: ["build", "--source", w.gcc_build, "-o", t / "out"], 1, "is not a kernel source tree"),
    C("build-source-without-x86", "trees", "--source a tree without arch/x86",
      lambda w, t: ["build", "--source", w.root / "trees" / "no-x86", "-o", t / "out"], 1, "has no arch/x86"),
    C("build-source-makefile-without-version", "trees", "--source a tree whose Makefile has no VERSION",
      lambda w, t: ["build", "--source", w.root / "trees" / "no-version", "-o", t / "out"], 1, "carries no VERSION/PATCHLEVEL"),
    C("build-source-broken-tarball", "trees", "--source a linux-*.tar.xz that is not an archive",
      lambda w, t: ["build", "--source", w.root / "trees" / "linux-9.9.tar.xz", "-o", t / "out"], 1, "cannot extract",
      outs=lambda w, t: [t / "out", t / "cache" / "src" / "linux-9.9"], env=lambda w, t: {"KPGO_CACHE": str(t / "cache")}),
    C("build-fragment-missing", "trees", "--fragment a file that does not exist", build("--base", "tiny", "--fragment", "nope.config"), 1,
      "config fragment nope.config not found"),
    C("build-config-missing", "trees", "--config a file that does not exist", build("--config", "nope.config"), 1,
      "config file nope.config not found"),
    C("build-fragment-unknown-option", "trees", "a fragment setting an option this kernel does not have (typo)",
      build("--base", "tiny", "--fragment", cfg("typo.config")), 1, "sets CONFIG_NETT, which this kernel", "does not have"),
    C("build-fragment-not-config-syntax", "trees", "a fragment line merge_config.sh would skip ('CONFIG_NET = y')",
      build("--base", "tiny", "--fragment", cfg("spaces.config")), 1, "line 1 is not a config line"),
    C("build-fragment-sets-nothing", "trees", "a fragment with no option", build("--base", "tiny", "--fragment", cfg("comments.config")), 1,
      "sets no CONFIG_ option"),
    C("build-config-other-arch", "trees", "--config of another architecture", build("--config", cfg("arm64.config")), 1,
      "for another architecture (CONFIG_ARM64=y)"),
    C("build-config-not-a-config", "trees", "--config a JSON file", build("--config", cfg("results.json")), 1, "is not a config line"),
    C("build-base-and-config", "trees", "--base and --config together", build("--base", "tiny", "--config", cfg("net.config")), 1,
      "both name the starting config"),
    C("run-unknown-base", "trees", "run --base huge", lambda w, t: ["run", "--source", w.linux, "--base", "huge", "--dir", t / "out"], 1,
      "unknown base config 'huge'"),
    C("run-fragment-missing", "trees", "run --fragment a missing file",
      lambda w, t: ["run", "--source", w.linux, "--fragment", w.root / "nope.config", "--dir", t / "out"], 1, "not found"),
    C("run-config-other-arch", "trees", "run --config of another architecture",
      lambda w, t: ["run", "--source", w.linux, "--config", w.root / "cfg" / "arm64.config", "--dir", t / "out"], 1,
      "for another architecture"),
    C("collect-not-instrumented", "trees", "collect from a build without gcov",
      lambda w, t: ["collect", w.root / "builds" / "vanilla", "-o", t / "out"], 1, "is not instrumented"),
    C("collect-kernel-lacks-option", "trees", "collect postgresql on a kernel without CONFIG_SYSVIPC",
      collect("--workload", "postgresql"), 1, "needs CONFIG_SYSVIPC=y"),
    C("collect-kernel-lacks-9p", "trees", "collect on a kernel whose 9p is a module (Debian's amd64 config as it ships)",
      lambda w, t: ["collect", _no_9p(w, t), "--workload", "redis", "-o", t / "out"], 1, "cannot boot as kpgo's guest",
      "CONFIG_9P_FS=y"),
    C("study-run-dir-missing", "trees", "study universal on a directory that does not exist",
      lambda w, t: ["study", "universal", w.root / "nope"], 1, "holds no finished kpgo run", outs=NONE),
    C("study-share-not-a-run", "trees", "study share on a profile directory", lambda w, t: ["study", "share", w.m0], 1,
      "holds no finished kpgo run", outs=NONE),
    C("report-run-dir-missing", "trees", "report on a directory that does not exist",
      lambda w, t: ["report", w.root / "nope", "-o", t / "out"], 1, "does not exist"),
    C("report-not-a-run", "trees", "report on a profile directory", lambda w, t: ["report", w.m0, "-o", t / "out"], 1,
      "has neither run.json nor bench/results.json"),
    C("report-results-schema-1", "trees", "report on results.json of an older kpgo",
      lambda w, t: ["report", w.root / "runs" / "schema1", "-o", t / "out"], 1, "has schema 1"),
    C("report-results-not-json", "trees", "report on a cut results.json",
      lambda w, t: ["report", w.root / "runs" / "bad-json", "-o", t / "out"], 1, "results.json: not valid JSON"),
    C("report-run-json-not-object", "trees", "report on a run.json holding a list",
      lambda w, t: ["report", w.root / "runs" / "not-object", "-o", t / "out"], 1, "does not hold a JSON object"),
    C("report-compare-missing", "trees", "report --compare a directory that does not exist",
      lambda w, t: ["report", w.run, "-o", t / "out", "--compare", w.root / "nope"], 1, "does not exist"),

    # ---- files kpgo reads, given as a special file, binary garbage, a cut file or JSON of the wrong shape ----
    C("stats-gcda-fifo", "files", "a FIFO named .gcda in a profile (used to hang)", on_file("profile", "stats", bad("gcda-fifo")), 1,
      "extra.gcda: is a FIFO (named pipe), not a regular file", outs=NONE),
    C("fix-gcda-device", "files", "a link to /dev/zero named .gcda (used to read until memory ran out)",
      on_file("profile", "fix", bad("gcda-device"), "-o", "T/out"), 1, "extra.gcda: is a character device"),
    C("merge-gcda-socket", "files", "a socket named .gcda in a merge input (used to say 'No such device or address')",
      lambda w, t: ["profile", "merge", w.m0, w.root / "f" / "gcda-socket", "-o", t / "out"], 1, "extra.gcda: is a socket"),
    C("fix-profile-json-fifo", "files", "profile.json a FIFO (used to hang)", on_file("profile", "fix", bad("pj-fifo"), "-o", "T/out"), 1,
      "profile.json: is a FIFO"),
    C("fix-profile-json-dir", "files", "profile.json a directory (used to say 'not valid JSON ([Errno 21] ...)')",
      on_file("profile", "fix", bad("pj-dir"), "-o", "T/out"), 1, "profile.json: is a directory"),
    C("fix-profile-json-binary", "files", "profile.json binary garbage", on_file("profile", "fix", bad("pj-binary"), "-o", "T/out"), 1,
      "profile.json: not text"),
    C("build-profile-json-wrong-type", "files", "an optimized build's profile.json with config_name a list (used to say 'collected on a ['tiny'] kernel')",
      lambda w, t: ["build", "--source", w.linux, "--base", "tiny", "--variant", "optimized", "--profile", w.root / "f" / "pj-config-list",
                    "-o", t / "out"], 1, "profile.json: config_name is a list, expected a string or null"),
    C("merge-profile-json-wrong-type", "files", "a merge input's profile.json whose merged.inputs is text",
      lambda w, t: ["profile", "merge", w.m1, w.root / "f" / "pj-merged-text", "-o", t / "out"], 1, "merged.inputs is the string"),
    C("check-gcno-fifo", "files", "profile check --build with a FIFO named .gcno (used to hang)",
      lambda w, t: ["profile", "check", w.m0, "--build", w.root / "f" / "gcno-fifo"], 1, "main.gcno: is a FIFO", outs=NONE),
    C("compare-gcno-device", "files", "profile compare --build with a link to /dev/zero named .gcno (used to read until memory ran out)",
      lambda w, t: ["profile", "compare", w.m0, w.m1, "--build", w.root / "f" / "gcno-device"], 1, "main.gcno: is a character device", outs=NONE),
    C("bench-build-json-fifo", "files", "bench of a build whose build.json is a FIFO (used to hang)",
      on_file("bench", "--kernel", lambda w: w.root / "f" / "builds" / "bj-fifo", "-o", "T/out"), 1, "build.json: is a FIFO"),
    C("collect-build-json-binary", "files", "collect from a build whose build.json is binary garbage (used to say 'no build.json')",
      on_file("collect", bad("builds/bj-binary"), "-o", "T/out"), 1, "build.json: not text"),
    C("bench-build-json-wrong-type", "files", "bench of a build whose build.json has a key of the wrong type",
      on_file("bench", "--kernel", bad("builds/bj-key-number"), "-o", "T/out"), 1, "build.json: key is the number 5, expected a string"),
    C("collect-build-json-list", "files", "collect from a build whose build.json holds a list (used to raise AttributeError)",
      on_file("collect", bad("builds/bj-list"), "-o", "T/out"), 1, "build.json: does not hold a JSON object"),
    C("bench-build-json-cut", "files", "bench of a build whose build.json is cut short (used to say 'no complete kpgo build')",
      on_file("bench", "--kernel", bad("builds/bj-cut"), "-o", "T/out"), 1, "build.json: not valid JSON"),
    C("bench-build-without-image", "files", "bench of a build without its kernel image (used to start the bench, each boot failing)",
      on_file("bench", "--kernel", bad("builds/no-image"), "-o", "T/out"), 1, "kernel image arch/x86/boot/bzImage is missing"),
    C("collect-image-fifo", "files", "collect from a build whose kernel image is a FIFO (used to fail at the boot, leaving a .failed-logs directory)",
      on_file("collect", bad("builds/image-fifo"), "-o", "T/out"), 1, "bzImage is a FIFO"),
    C("report-run-json-fifo", "files", "report on a run whose run.json is a FIFO (used to hang)",
      on_file("report", bad("runs/run-fifo"), "-o", "T/out"), 1, "run.json: is a FIFO"),
    C("report-results-device", "files", "report on a run whose results.json is a link to /dev/zero (used to read until memory ran out)",
      on_file("report", bad("runs/results-device"), "-o", "T/out"), 1, "results.json: is a character device"),
    C("report-results-dir", "files", "report on a run whose results.json is a directory (used to say 'cannot read ... Is a directory')",
      on_file("report", bad("runs/results-dir"), "-o", "T/out"), 1, "results.json: is a directory"),
    C("report-run-json-binary", "files", "report on a run.json of binary garbage (used to raise UnicodeDecodeError)",
      on_file("report", bad("runs/run-binary"), "-o", "T/out"), 1, "run.json: not text"),
    C("report-run-json-wrong-type", "files", "report on a run.json whose workloads is a list (used to raise AttributeError)",
      on_file("report", bad("runs/run-workloads-list"), "-o", "T/out"), 1, "run.json: workloads is a list, expected an object"),
    C("report-results-value-wrong-type", "files", "report on results.json with a mean that is text (used to draw a report with it)",
      on_file("report", bad("runs/results-row-text"), "-o", "T/out"), 1, "summary[0].mean is the string 'fast'"),
    C("report-results-kernels-list", "files", "report on results.json whose kernels is a list (used to raise TypeError)",
      on_file("report", bad("runs/results-kernels-list"), "-o", "T/out"), 1, "results.json: kernels is a list"),
    C("study-run-json-fifo", "files", "study share on a run whose run.json is a FIFO (used to hang)",
      on_file("study", "share", bad("runs/run-fifo")), 1, "run.json: is a FIFO", outs=NONE),
    C("study-run-json-cut", "files", "study universal on a run.json cut short", on_file("study", "universal", bad("runs/run-cut")), 1,
      "run.json: not valid JSON", outs=NONE),
    C("study-request-wrong-type", "files", "study sensitivity on a run.json whose request names its workload by a number",
      on_file("study", "sensitivity", bad("runs/run-request-number"), "--workload", "redis", "--vary", "clients=1,2"), 1,
      "request.workload is the number 5", outs=NONE),
    C("build-variant-file-fifo", "files", "build --variant-file a FIFO (used to hang)",
      build("--base", "tiny", "--variant-file", bad("variant-fifo.toml"), "--variant", "mine"), 1, "variant-fifo.toml: is a FIFO"),
    C("build-variant-file-binary", "files", "build --variant-file of binary garbage", build("--base", "tiny", "--variant-file", bad("variant-binary.toml")), 1,
      "variant-binary.toml: not text"),
    C("build-variant-file-dir", "files", "build --variant-file a directory (used to say 'Is a directory')",
      build("--base", "tiny", "--variant-file", bad("variant-dir.toml")), 1, "variant-dir.toml: is a directory"),
    C("build-variant-file-deep", "files", "build --variant-file nested 100,000 deep (used to raise RecursionError)",
      build("--base", "tiny", "--variant-file", bad("variant-deep.toml")), 1, "not valid TOML"),
    C("build-fragment-fifo", "files", "build --fragment a FIFO (used to say 'not found')",
      build("--base", "tiny", "--fragment", bad("fragment-fifo.config")), 1, "fragment-fifo.config: is a FIFO"),
    C("build-fragment-binary", "files", "build --fragment of binary garbage (used to blame its line 1)",
      build("--base", "tiny", "--fragment", bad("fragment-binary.config")), 1, "fragment-binary.config: not text"),
    C("build-config-dir", "files", "build --config a directory (used to say 'not found')", build("--config", bad("config-dir.config")), 1,
      "config-dir.config: is a directory"),
    C("build-call-graph-fifo", "files", "build --call-graph a FIFO (used to say 'not found')",
      build("--base", "tiny", "--variant", "order", "--call-graph", bad("callgraph-fifo.tsv")), 1, "callgraph-fifo.tsv is a FIFO"),
    C("build-call-graph-manifest-fifo", "files", "build --call-graph a directory whose profile.json is a FIFO (used to hang)",
      build("--base", "tiny", "--variant", "order", "--call-graph", bad("branches")), 1, "profile.json: is a FIFO"),

    # ---- outputs ----
    C("fix-output-exists", "outputs", "profile fix -o an existing directory (another profile)",
      lambda w, t: ["profile", "fix", w.k0, "-o", w.m1], 1, "already exists", outs=NONE),
    C("fix-output-is-input", "outputs", "profile fix writing onto its input", lambda w, t: ["profile", "fix", w.k0, "-o", w.k0], 1,
      "is the input", "never writes over its input", outs=NONE),
    C("fix-output-inside-input", "outputs", "profile fix -o inside its input (used to add a profile to the input)",
      lambda w, t: ["profile", "fix", w.k0, "-o", w.k0 / "fixed"], 1, "is inside the input", outs=lambda w, t: [w.k0 / "fixed"]),
    C("fix-output-holds-input", "outputs", "profile fix -o a parent of its input",
      lambda w, t: ["profile", "fix", w.p("fit"), "-o", w.root / "p"], 1, "holds the input", outs=NONE),
    C("merge-output-inside-input", "outputs", "profile merge -o inside an input profile",
      lambda w, t: ["profile", "merge", w.m0, w.m1, "-o", w.m1 / "universal"], 1, "is inside the input",
      outs=lambda w, t: [w.m1 / "universal"]),
    C("merge-output-is-input", "outputs", "profile merge -o one of its inputs",
      lambda w, t: ["profile", "merge", w.m0, w.m1, "-o", w.m0], 1, "is the input", outs=NONE),
    C("fix-output-read-only", "outputs", "profile fix -o in a read-only directory (used to fail with exit 3 after reading)",
      lambda w, t: ["profile", "fix", w.k0, "-o", w.ro / "out"], 1, "cannot be written", "read-only",
      outs=lambda w, t: [w.ro / "out"]),
    C("merge-output-read-only", "outputs", "profile merge -o in a read-only directory",
      lambda w, t: ["profile", "merge", w.m0, w.m1, "-o", w.ro / "out"], 1, "cannot be written", outs=lambda w, t: [w.ro / "out"]),
    C("fix-output-under-a-file", "outputs", "profile fix -o below a regular file",
      lambda w, t: ["profile", "fix", w.k0, "-o", w.root / "a-file.txt" / "out"], 1, "is not a directory", outs=NONE),
    C("collect-output-exists", "outputs", "collect -o an existing directory", lambda w, t: ["collect", w.instr, "-o", w.m0], 1,
      "already exists", outs=NONE),
    C("collect-output-read-only", "outputs", "collect -o in a read-only directory (used to fail with exit 3)",
      lambda w, t: ["collect", w.instr, "-o", w.ro / "p"], 1, "cannot be written", outs=lambda w, t: [w.ro / "p"]),
    C("report-output-is-a-file", "outputs", "report -o an existing file (used to fail with exit 3 after drawing)",
      lambda w, t: ["report", w.run, "-o", w.root / "a-file.txt"], 1, "is a file", outs=NONE),
    C("report-output-read-only", "outputs", "report -o in a read-only directory",
      lambda w, t: ["report", w.run, "-o", w.ro / "report"], 1, "cannot be written", outs=lambda w, t: [w.ro / "report"]),
    C("build-output-is-a-file", "outputs", "build -o an existing file (used to fail with exit 3)",
      lambda w, t: ["build", "--source", w.linux, "--base", "tiny", "-o", w.root / "a-file.txt"], 1, "is a file", outs=NONE),
    C("build-output-inside-profile", "outputs", "optimized build -o inside its profile (used to build into the input)",
      lambda w, t: ["build", "--source", w.linux, "--base", "tiny", "--variant", "optimized", "--profile", w.p("fit"),
                    "-o", w.p("fit") / "build"], 1, "overlap", outs=lambda w, t: [w.p("fit") / "build"]),
    C("build-output-read-only", "outputs", "build -o in a read-only directory",
      lambda w, t: ["build", "--source", w.linux, "--base", "tiny", "-o", w.ro / "build"], 1, "cannot be written",
      outs=lambda w, t: [w.ro / "build"]),
    C("build-output-foreign-dir", "outputs", "build -o a non-empty directory that is not a kpgo build",
      lambda w, t: ["build", "--source", w.linux, "--base", "tiny", "-o", w.root / "builds" / "not-built"], 1,
      "is not a kpgo build directory", outs=NONE),
    C("bench-output-is-a-file", "outputs", "bench -o an existing file (used to exit 3)",
      lambda w, t: ["bench", "--kernel", f"vanilla={w.instr}", "-o", w.root / "a-file.txt"], 1, "is a file", outs=NONE),
    C("bench-output-foreign-dir", "outputs", "bench -o a directory that holds something else (a profile)",
      lambda w, t: ["bench", "--kernel", f"vanilla={w.instr}", "-o", w.p("fit")], 1, "is not a kpgo bench directory", outs=NONE),
    C("bench-output-read-only", "outputs", "bench -o in a read-only directory (used to exit 3)",
      lambda w, t: ["bench", "--kernel", f"vanilla={w.instr}", "-o", w.ro / "bench"], 1, "cannot be written",
      outs=lambda w, t: [w.ro / "bench"]),
    C("run-dir-is-a-file", "outputs", "run --dir an existing file (used to exit 3)",
      lambda w, t: ["run", "--source", w.linux, "--base", "tiny", "--dir", w.root / "a-file.txt"], 1, "is a file", outs=NONE),
    C("run-dir-foreign", "outputs", "run --dir a directory that holds something else (a profile; used to build into it)",
      lambda w, t: ["run", "--source", w.linux, "--base", "tiny", "--dir", w.p("fit")], 1, "is not a kpgo run directory", outs=NONE),
    C("compare-plot-read-only", "outputs", "profile compare --plot into a read-only directory (used to fail after computing)",
      lambda w, t: ["profile", "compare", w.m0, w.m1, "--build", w.gcc_build, "--plot", w.ro / "sim"], 1, "cannot be written",
      "--plot", outs=NONE),
]


def _leftovers(path: Path) -> list[Path]:
    """path itself and the temporary siblings kpgo writes before renaming (.NAME.*.partial, .NAME.*.tmp: kpgo.atomic)."""
    found = [path] if path.exists() else []
    if path.parent.is_dir():
        found += [p for p in path.parent.iterdir() if p.name.startswith(f".{path.name}.") and p.suffix in (".partial", ".tmp")]
    return found


def _log(case: Case, w: World, t: Path, argv: list, res: CliResult, line: str) -> None:
    log = os.environ.get("KPGO_MATRIX_LOG")
    if not log:
        return

    def short(text: str) -> str:  # paths of this machine's temporary directories -> W/ (inputs) and T/ (outputs)
        return text.replace(str(w.root), "W").replace(str(t), "T")

    with open(log, "a") as f:
        f.write(json.dumps({"id": case.id, "category": case.category, "what": case.what, "code": res.returncode,
                            "argv": short(shlex.join(map(str, argv))), "error": short(line), "seconds": round(res.seconds, 2)}) + "\n")


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_input(case: Case, world: World, tmp_path: Path) -> None:
    argv = case.argv(world, tmp_path)
    outs = case.outs(world, tmp_path)
    before = tree_digest(world.root)
    res = kpgo(*argv, timeout=120, env=world.env(tmp_path) | (case.env(world, tmp_path) if case.env else {}))
    assert_one_line_error(res, case.code, *case.needles)
    line = next(ln for ln in res.stderr.splitlines() if ln.startswith("kpgo: error:"))
    assert " — " in line, f"no next step in: {line}"
    assert not (tmp_path / "tripwire.log").exists(), f"a long step started: {(tmp_path / 'tripwire.log').read_text()}"
    assert tree_digest(world.root) == before, "an input (or another file of the world) changed"
    for out in outs:
        assert not _leftovers(out), f"output left behind: {_leftovers(out)}"
    assert res.seconds < 30
    _log(case, world, tmp_path, argv, res, line)


def test_matrix_size() -> None:
    """The hardening issue asks for at least 60 distinct cases, spread over the four kinds of bad input."""
    assert len({c.id for c in CASES}) == len(CASES) >= 60
    per = {k: sum(c.category == k for c in CASES) for k in ("profiles", "options", "trees", "outputs")}
    assert all(n >= 10 for n in per.values()), per


def test_tripwire_catches_a_long_step(world: World, tmp_path: Path) -> None:
    """The control: a request with nothing wrong gets past every check and reaches make, which the tripwire stops
    and records. So the matrix's "no long step" really would see one (and its checks do not refuse good input)."""
    for argv in (["build", "--source", world.linux, "--base", "tiny", "--fragment", world.root / "cfg" / "net.config", "-o", tmp_path / "b1"],
                 ["build", "--source", world.linux, "--base", "tiny", "--variant", "optimized", "--profile", world.p("fit"), "-o", tmp_path / "b2"]):
        (tmp_path / "tripwire.log").unlink(missing_ok=True)
        res = kpgo(*argv, timeout=120, env=world.env(tmp_path))
        assert_one_line_error(res, 3, "make allnoconfig failed")
        assert "allnoconfig" in (tmp_path / "tripwire.log").read_text()
