"""The .gcda reader/writer against files the real GCC writes at test time (gcov-dump is the oracle)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gcov_fixtures import GccBuild, Profiles, gcc_build, gcda_files, profiles, value_profile  # noqa: F401
from kpgo.errors import UserError
from kpgo.gcov.gcda import (
    ARCS,
    TAG_FUNCTION,
    TAG_OBJECT_SUMMARY,
    Gcda,
    GcovFormatError,
    counter_tag,
    gcov_version_prefix,
    layout_for_version,
    parse_gcda,
    version_text,
    walk_gcda,
)

_REC = re.compile(r"^\s*([0-9a-f]{8}):\s*(-?\d+):(\w+)(.*)$")
_VALS = re.compile(r"^\s*\d+:((?:\s+-?\d+)+)\s*$")


def gcov_dump(path: Path) -> list[dict]:
    """Records as gcov-dump -l prints them: tag, length, kind word, function ids, counter values."""
    out = subprocess.run(["gcov-dump", "-l", str(path)], check=True, capture_output=True, text=True).stdout
    recs: list[dict] = []
    for line in out.splitlines():
        body = line.split(":", 1)[1] if line.startswith(str(path)) else line
        m = _REC.match(body)
        if m:
            rec = {"tag": int(m.group(1), 16), "length": int(m.group(2)), "what": m.group(3), "rest": m.group(4),
                   "values": []}
            recs.append(rec)
            continue
        m = _VALS.match(body)
        if m and recs:
            recs[-1]["values"].extend(int(x) for x in m.group(1).split())
    return recs


def our_records(g: Gcda) -> list[dict]:
    recs = []
    for i, tag in enumerate(g.tags.tolist()):
        raw = int(g.lengths[i])
        length = (1 << 32) - raw if raw >= 1 << 31 else raw
        payload = g.payload[g.offsets[i]: g.offsets[i + 1]]
        recs.append({"tag": tag, "length": length, "payload": payload, "negative": raw >= 1 << 31})
    return recs


def all_real_files(profiles: Profiles, value_profile: Path) -> list[Path]:
    files = []
    for root in (profiles.mode0, profiles.mode1, profiles.mode2, profiles.k0, value_profile):
        files += [root / p for p in gcda_files(root)]
    return files


def test_parser_agrees_with_gcov_dump(profiles: Profiles, value_profile: Path) -> None:
    for path in all_real_files(profiles, value_profile):
        g = parse_gcda(path.read_bytes(), str(path))
        dump = gcov_dump(path)
        ours = our_records(g)
        assert [(r["tag"], r["length"]) for r in ours] == [(r["tag"], r["length"]) for r in dump], path
        for o, d in zip(ours, dump):
            if d["tag"] == TAG_FUNCTION and d["length"]:
                ident = int(re.search(r"ident=(\d+)", d["rest"]).group(1))
                assert int(o["payload"][0]) == ident
            if d["what"] == "COUNTERS":
                if o["negative"]:
                    assert not any(d["values"])
                else:
                    w = o["payload"]
                    vals = (w[0::2].astype(np.uint64) | (w[1::2].astype(np.uint64) << 32)).astype(np.int64)
                    assert vals.tolist() == d["values"], path
            if d["tag"] == TAG_OBJECT_SUMMARY:
                runs = int(re.search(r"runs=(\d+)", d["rest"]).group(1))
                sum_max = int(re.search(r"sum_max=(\d+)", d["rest"]).group(1))
                assert g.summary is not None and (g.summary.runs, g.summary.sum_max) == (runs, sum_max)


def test_round_trip_is_byte_identical(profiles: Profiles, value_profile: Path) -> None:
    files = all_real_files(profiles, value_profile)
    assert len(files) >= 12
    saw_negative = False
    for path in files:
        data = path.read_bytes()
        g = parse_gcda(data, str(path))
        saw_negative |= bool((g.lengths >= 1 << 31).any())
        assert g.to_bytes() == data, path
        # Changing nothing through the counter and summary paths changes nothing either.
        assert g.with_counters(ARCS, g.counters(ARCS)).to_bytes() == data
        if g.summary is not None:
            assert g.with_summary(g.summary.runs, g.summary.sum_max).to_bytes() == data
    assert saw_negative, "GCC 12 libgcov should have written a negative-length (all-zero) counter record"


def test_parse_equals_walk(profiles: Profiles, value_profile: Path) -> None:
    """parse_gcda takes a kernel-shaped file through the whole-profile check and walks the others: one model."""
    for path in all_real_files(profiles, value_profile):
        data = path.read_bytes()
        a, b = parse_gcda(data, str(path)), walk_gcda(data, str(path))
        assert (a.layout, a.byteorder, a.version, a.stamp, a.checksum) == (b.layout, b.byteorder, b.version, b.stamp,
                                                                            b.checksum)
        for f in ("tags", "lengths", "offsets", "payload", "trailer"):
            x, y = getattr(a, f), getattr(b, f)
            assert x.dtype == y.dtype and np.array_equal(x, y), (path, f)


def test_counters_of_negative_records_are_zeros(profiles: Profiles) -> None:
    for rel in gcda_files(profiles.mode0):
        g = parse_gcda((profiles.mode0 / rel).read_bytes(), str(rel))
        fn_total = sum(len(f.counters.get(ARCS, [])) for f in g.functions())
        assert g.counter_count(ARCS) == fn_total == len(g.counters(ARCS))


def test_kernel_shape_has_no_summary_and_fix_makes_gcc_use_it(profiles: Profiles, tmp_path: Path) -> None:
    from kpgo.gcov.profile import fix_profile, profile_stats

    st0 = profile_stats(profiles.k0)
    assert st0["with_summary"] == 0 and st0["gcov_version"] == version_text(parse_gcda(
        (profiles.k0 / "main.gcda").read_bytes(), "x").version)
    for rel in gcda_files(profiles.k0):
        g = parse_gcda((profiles.k0 / rel).read_bytes(), str(rel))
        assert g.checksum == 0 and set(g.tags.tolist()) <= {TAG_FUNCTION, counter_tag(ARCS)}
    before = {p: (profiles.k0 / p).read_bytes() for p in gcda_files(profiles.k0)}
    res = fix_profile(profiles.k0, tmp_path / "fixed", runs=1)
    assert {p: (profiles.k0 / p).read_bytes() for p in gcda_files(profiles.k0)} == before  # input untouched
    st1 = profile_stats(tmp_path / "fixed")
    assert st1["with_summary"] == st1["files"] == st0["files"]
    assert res["sum_max"] == st0["arcs_max"] == st1["arcs_max"]
    assert st1["arcs_sum"] == st0["arcs_sum"]
    # GCC gives up on the kernel-shaped file and uses the fixed one.
    assert "giving up" in profile_use_dump(profiles.build, profiles.k0, tmp_path / "b0")
    dump = profile_use_dump(profiles.build, tmp_path / "fixed", tmp_path / "b1")
    assert "giving up" not in dump and "Profile info is missing" not in dump
    assert "count:" in dump


def profile_use_dump(build: GccBuild, profile: Path, work: Path) -> str:
    """Compile kernel/sched.c with -fprofile-use against `profile` (same flags as the instrumented build)."""
    shutil.copytree(build.root, work, ignore=shutil.ignore_patterns("*.gcda", "*.o", "prog"))
    for rel in gcda_files(profile):
        shutil.copyfile(profile / rel, work / rel)
    subprocess.run(["gcc", "-O1", "-fprofile-use", "-fdump-ipa-profile", "-Wno-missing-profile", "-c",
                    "kernel/sched.c", "-o", "kernel/sched.o"], cwd=work, check=True, capture_output=True)
    return "".join(p.read_text() for p in work.rglob("*.profile"))


def test_fix_copies_profile_json_and_refuses_existing_output(profiles: Profiles, tmp_path: Path) -> None:
    import json

    from kpgo.gcov.profile import fix_profile

    src = tmp_path / "src"
    shutil.copytree(profiles.k1, src)
    (src / "profile.json").write_text(json.dumps({"workload": "redis"}))
    res = fix_profile(src, tmp_path / "out", runs=3)
    man = json.loads((tmp_path / "out" / "profile.json").read_text())
    assert man["workload"] == "redis" and man["fixed"]["runs"] == 3 and man["fixed"]["sum_max"] == res["sum_max"]
    with pytest.raises(UserError, match="already exists"):
        fix_profile(src, tmp_path / "out")
    for rel in gcda_files(tmp_path / "out"):
        assert parse_gcda((tmp_path / "out" / rel).read_bytes(), "x").summary.runs == 3


def test_fix_leaves_out_the_gcov_code_of_an_older_profile(profiles: Profiles, tmp_path: Path) -> None:
    """A profile collected before `kpgo collect` left out kernel/gcov: fix drops those files, and their counters (here
    the largest of the profile, as the snapshot's were for nginx) do not set sum_max."""
    import json

    from kpgo.gcov.profile import fix_profile, profile_stats

    src = tmp_path / "src"
    shutil.copytree(profiles.k1, src)
    (src / "kernel" / "gcov").mkdir()
    g = parse_gcda((profiles.k1 / "kernel" / "sched.gcda").read_bytes(), "x")
    big = g.with_counters(ARCS, g.counters(ARCS) * 1000 + 1)
    (src / "kernel" / "gcov" / "base.gcda").write_bytes(big.to_bytes())
    res = fix_profile(src, tmp_path / "out")
    assert res["left_out"] == ["kernel/gcov/base.gcda"] and not (tmp_path / "out" / "kernel" / "gcov").exists()
    assert res["sum_max"] == profile_stats(profiles.k1)["arcs_max"] < int(big.counters(ARCS).max())
    assert json.loads((tmp_path / "out" / "profile.json").read_text())["fixed"]["left_out"] == ["kernel/gcov/base.gcda"]
    assert (src / "kernel" / "gcov" / "base.gcda").read_bytes() == big.to_bytes()  # the input as it was


# -- bad inputs: one-line UserError naming the file ------------------------------------------------------------

@pytest.fixture()
def good(profiles: Profiles) -> bytes:
    return (profiles.k0 / "kernel" / "sched.gcda").read_bytes()


def _err(data: bytes) -> str:
    with pytest.raises(GcovFormatError) as ei:
        parse_gcda(data, "dir/x.gcda")
    msg = str(ei.value)
    assert "\n" not in msg and msg.startswith("dir/x.gcda: ")
    assert isinstance(ei.value, UserError)
    return msg


def test_bad_inputs(good: bytes) -> None:
    assert "empty" in _err(b"")
    assert "truncated" in _err(good[:10])
    assert "magic" in _err(b"xxxx" + good[4:])
    assert ".gcno" in _err(b"oncg" + good[4:])
    assert "unsupported gcov version 'B52*' (GCC 15)" in _err(good[:4] + b"*25B" + good[8:])
    assert "unsupported gcov version 'A84*' (GCC 8)" in _err(good[:4] + b"*48A" + good[8:])
    assert "multiple of 4" in _err(good[:-3])
    assert "runs past the end" in _err(good[:-8])
    # A record length pointing far past the end.
    bad = bytearray(good)
    bad[20:24] = (10_000).to_bytes(4, "little")
    assert "runs past the end" in _err(bytes(bad))


def record_ends(data: bytes) -> list[int]:
    """Where a kernel-written .gcda of GCC >= 12 can end whole, walked here from the format (not by the reader): after
    its 16-byte header (magic, version, stamp, checksum), and after each record (tag, length in bytes, payload)."""
    ends = [16]
    while ends[-1] < len(data):
        length = int.from_bytes(data[ends[-1] + 4: ends[-1] + 8], "little")
        ends.append(ends[-1] + 8 + length)
    assert ends[-1] == len(data)
    return ends


def test_truncation_never_crashes(good: bytes) -> None:
    """Every prefix of a real file either reads as the records it holds whole (a cut between two records: the same
    bytes back) or is refused with the reader's one-line error naming the file (a cut inside the header or a record);
    never another exception, and never a cut record read as whole."""
    assert parse_gcda(good, "t.gcda").layout.byte_lengths  # the layout record_ends walks (the fixtures' GCC is >= 12)
    whole = set(record_ends(good))
    assert len(whole) > 5  # the file has records to cut between
    refused = []
    for n in range(len(good)):
        try:
            g = parse_gcda(good[:n], "t.gcda")
        except GcovFormatError as e:
            assert str(e).startswith("t.gcda: ") and "\n" not in str(e), str(e)
            refused.append(n)
            continue
        assert n in whole, f"a file cut inside a record ({n} of {len(good)} bytes) was read as whole"
        assert g.to_bytes() == good[:n]
    assert sorted(set(range(len(good))) - set(refused)) == sorted(whole - {len(good)})


def test_cli_error_is_one_line(tmp_path: Path, good: bytes, capsys: pytest.CaptureFixture[str]) -> None:
    from test_profile_cli import kpgo

    (tmp_path / "p" / "a").mkdir(parents=True)
    (tmp_path / "p" / "a" / "x.gcda").write_bytes(good[:-8])
    rc = kpgo(["profile", "stats", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "a/x.gcda" in err and "Traceback" not in err


# -- other layouts (GCC 9-11: word lengths, no checksum; big-endian) -------------------------------------------

def _version_word(major: int, minor: int = 1) -> int:
    s = f"{chr(ord('A') + major // 10)}{major % 10}{minor}*"
    return int.from_bytes(s.encode(), "big")


def synth(major: int, order: str = "<", functions: list[list[int]] | None = None, summary: bool = False) -> bytes:
    """A file in the layout of GCC `major`, written from the format rules (not by our writer)."""
    unit = 4 if major >= 12 else 1
    words = [0x67636461, _version_word(major), 0x12345678]
    if major >= 12:
        words.append(0xDEADBEEF)
    if summary:
        words += [TAG_OBJECT_SUMMARY, 2 * unit, 1, 77]
    for i, counts in enumerate([[1, 2, 3], [0], [1 << 40]] if functions is None else functions):
        words += [TAG_FUNCTION, 3 * unit, 1000 + i, 0xAAAA0000 + i, 0xBBBB0000 + i]
        words += [counter_tag(ARCS), 2 * len(counts) * unit]
        for c in counts:
            words += [c & 0xFFFFFFFF, c >> 32]
    return np.array(words, dtype=order + "u4").tobytes()


@pytest.mark.parametrize("major", [9, 10, 11, 12, 13, 14])
@pytest.mark.parametrize("order", ["<", ">"])
def test_layouts(major: int, order: str) -> None:
    data = synth(major, order)
    g = parse_gcda(data, "s.gcda")
    assert g.layout.major == major and g.byteorder == order
    assert g.layout.byte_lengths == (major >= 12) and (g.checksum is not None) == (major >= 12)
    assert g.counters(ARCS).tolist() == [1, 2, 3, 0, 1 << 40]
    assert g.to_bytes() == data
    fixed = g.with_summary(1, 1 << 40)
    g2 = parse_gcda(fixed.to_bytes(), "s.gcda")
    assert g2.summary is not None and g2.summary.runs == 1 and g2.summary.sum_max == 0xFFFFFFFF
    # Summary as that GCC writes it: tag, length 2 words (8 bytes from GCC 12), runs, sum_max.
    expect = synth(major, order, summary=True)
    assert parse_gcda(expect, "e").without_summary().with_summary(1, 77).to_bytes() == expect


def test_gcov_version_prefix() -> None:
    assert gcov_version_prefix("12.2.0") == "B22" and gcov_version_prefix("9.5.0") == "A95"
    assert gcov_version_prefix("14.1") == "B41" and gcov_version_prefix("unknown") == ""
    assert version_text(_version_word(12, 2)).startswith(gcov_version_prefix("12.2.0"))


def test_layout_table() -> None:
    assert layout_for_version(_version_word(9), "x").counter_kinds[3] == "single"
    assert layout_for_version(_version_word(10), "x").counter_kinds[3] == "topn"
    assert layout_for_version(_version_word(14), "x").counter_kinds[-1] == "conditions"
    with pytest.raises(GcovFormatError):
        layout_for_version(0x01020304, "x")


# -- property: any well-formed file round-trips exactly ---------------------------------------------------------

_counts = st.lists(st.integers(min_value=0, max_value=(1 << 64) - 1), min_size=0, max_size=6)


@settings(max_examples=150, deadline=None)
@given(major=st.integers(min_value=9, max_value=14), order=st.sampled_from(["<", ">"]),
       functions=st.lists(_counts, min_size=0, max_size=5), summary=st.booleans())
def test_round_trip_property(major: int, order: str, functions: list[list[int]], summary: bool) -> None:
    data = synth(major, order, functions, summary)
    g = parse_gcda(data, "h.gcda")
    assert g.to_bytes() == data
    assert g.counters(ARCS).tolist() == [c for f in functions for c in f]
    assert [len(f.counters[ARCS]) for f in g.functions()] == [len(f) for f in functions]


@settings(max_examples=100, deadline=None)
@given(cut=st.integers(min_value=0, max_value=200), junk=st.binary(max_size=12))
def test_garbage_gives_format_error(cut: int, junk: bytes) -> None:
    data = synth(12)[:cut] + junk
    try:
        g = parse_gcda(data, "j.gcda")
    except GcovFormatError as e:
        assert str(e).startswith("j.gcda: ") and "\n" not in str(e), str(e)
        return
    assert g.to_bytes() == data
