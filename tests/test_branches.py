"""Branch records (kpgo.branches, the plugin's branch_* arguments) without a kernel: guest programs of known control
flow under user-mode QEMU with the plugin recording the user side, the exact counts they must give, the bounds, the
three outputs read by the real tools (perf2bolt and llvm-profgen 19), and bad records files refused in one line."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from tests.conftest import assert_one_line_error, kpgo

from kpgo import branches, sim
from kpgo.errors import KpgoError, UserError

DATA = Path(__file__).resolve().parent / "data"
PROBE = DATA / "branch_probe.c"
FREESTANDING = DATA / "branch_freestanding.c"
PERF2BOLT = Path("/usr/lib/llvm-19/bin/perf2bolt")  # not /usr/bin/perf2bolt-19, which runs as llvm-bolt (DESIGN.md)
PROFGEN = "llvm-profgen-19"
KERNEL_BASE = 0xFFFFFFFF81000000
USER_BASE = 0x400000


def one_line(e: KpgoError) -> str:
    text = str(e)
    assert "\n" not in text and "Traceback" not in text
    return text


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """branch_probe, static, with DWARF (llvm-profgen finds functions through it); no sibling calls, so each call
    in the chain stays a call."""
    if shutil.which("qemu-x86_64") is None:
        pytest.fail("user-mode QEMU (qemu-x86_64) is missing: `make setup` installs qemu-user")
    exe = tmp_path_factory.mktemp("probe") / "branch_probe"
    subprocess.run(["gcc", "-O2", "-g", "-static", "-fno-optimize-sibling-calls", "-Wall", "-o", exe, PROBE], check=True)
    return exe


def record(exe: Path, out: Path, *args: str, **opts: object) -> tuple[branches.Records, dict]:
    """Run `exe args` under qemu-x86_64 with the plugin recording the user side: its records and its one window."""
    lib = sim.build_plugin()
    config = sim.BranchConfig(side="user", build_id=branches.build_id_of(exe), **opts)  # type: ignore[arg-type]
    report = out.with_suffix(".json")
    plugin = f"{lib},out={report},{config.plugin_arg(out)}"
    subprocess.run(["qemu-x86_64", "-plugin", plugin, exe, *args], check=True, capture_output=True, timeout=300)
    (window,) = sim.read_windows(report)
    return branches.read_records(out, config.build_id), window


def names(records: branches.Records, fns: branches.Functions, col: int) -> list[str]:
    return [fns.names[i] if i >= 0 else "?" for i in fns.index(records.edges[:, col]).tolist()]


@pytest.mark.parametrize("n", [1, 2, 1000, 100_000])
def test_loop_gives_its_back_edge_only(probe: Path, tmp_path: Path, n: int) -> None:
    rec, window = record(probe, tmp_path / "loop.rec", "loop", str(n))
    if n == 1:
        assert len(rec.edges) == 0 and rec.branches == 0
        return
    (edge,) = rec.edges.tolist()
    assert edge[2] == n - 1 and edge[3] == branches.Kind.COND and edge[1] < edge[0]  # backwards, taken N - 1 times
    assert rec.branches == n - 1 == window["user"]["taken_branches"]
    # The loop's body as a range: from the back edge's target to the branch, each iteration after the first one's
    # (the window's first range has no branch before it to start from).
    assert rec.ranges.tolist() == ([[edge[1], edge[0], n - 2]] if n > 2 else [])
    assert (rec.windows, rec.open_window, rec.side, rec.lost_edges, rec.lost_ranges) == (1, False, "user", 0, 0)


def test_call_chain_gives_exact_call_edges(probe: Path, tmp_path: Path) -> None:
    n = 5000
    rec, window = record(probe, tmp_path / "calls.rec", "calls", str(n))
    fns = branches.Functions(probe)
    src, dst = names(rec, fns, 0), names(rec, fns, 1)
    kinds = [branches.Kind(k) for k in rec.edges[:, 3].tolist()]
    got = {(s, d, k.name): c for s, d, k, c in zip(src, dst, kinds, rec.edges[:, 2].tolist())}
    assert got == {
        ("calls", "chain_a", "CALL"): n, ("chain_a", "chain_b", "CALL"): n, ("chain_b", "chain_c", "CALL"): n,
        ("chain_c", "chain_b", "RET"): n, ("chain_b", "chain_a", "RET"): n, ("chain_a", "calls", "RET"): n,
        ("calls", "calls", "COND"): n - 1,  # the driver loop's back edge
    }
    assert rec.branches == 7 * n - 1 == window["user"]["taken_branches"] == int(rec.edges[:, 2].sum())
    graph = branches.call_graph(rec, fns)
    assert [(e.caller, e.callee, e.calls, e.tail_calls) for e in graph] == [
        ("calls", "chain_a", n, 0), ("chain_a", "chain_b", n, 0), ("chain_b", "chain_c", n, 0)]
    out = tmp_path / "callgraph.tsv"
    branches.write_call_graph(graph, out)
    assert branches.read_call_graph(out) == graph
    # Every branch's source and every range lies in the probe's functions.
    assert branches.in_functions_share(rec, fns) == 1.0
    assert (fns.index(rec.ranges[:, 0]) == fns.index(rec.ranges[:, 1])).all()


def test_calls_through_a_retpoline_are_recorded_as_the_calls_they_stand_for(probe: Path, tmp_path: Path) -> None:
    """A kernel built with retpolines calls `__x86_indirect_thunk_*` where its source calls a pointer, and returns
    through `__x86_return_thunk`. With the thunks' ranges (from the symbol table), each call through the thunk is one
    call edge from the call site to the target, each return through the return thunk one ret: what a CPU needing no
    thunk runs. Without them the call graph would name the thunk as the only callee."""
    n = 4000
    thunks = branches.thunk_ranges(probe)
    assert [t[0] for t in thunks] == ["thunk", "return_thunk"]
    rec, window = record(probe, tmp_path / "thunks.rec", "thunks", str(n), thunks=tuple(thunks))
    fns = branches.Functions(probe)
    src, dst = names(rec, fns, 0), names(rec, fns, 1)
    kinds = [branches.Kind(k).name for k in rec.edges[:, 3].tolist()]
    got: dict[tuple[str, str, str], int] = {}
    for key in zip(src, dst, kinds, rec.edges[:, 2].tolist()):
        got[key[:3]] = got.get(key[:3], 0) + key[3]
    assert got == {
        ("thunk_calls", "target_a", "CALL"): 3 * n // 4, ("thunk_calls", "target_b", "CALL"): n // 4,
        ("target_a", "thunk_calls", "RET"): 3 * n // 4, ("target_b", "thunk_calls", "RET"): n // 4,
        ("thunk_calls", "thunk_calls", "COND"): 3 * n // 4 + n - 1,  # to target_a's call, and the loop's back edge
    }
    # The calls come from the call instruction (to the thunk, in the binary) and reach the targets' entries.
    calls = rec.edges[rec.edges[:, 3] == branches.Kind.CALL]
    assert fns.is_entry(calls[:, 1]).all()
    # The CPU took 4 more branches per call, inside the thunks; no range or sampled branch starts or ends there.
    assert window["user"]["taken_branches"] == rec.branches + 4 * n
    inside = [(lo <= rec.ranges[:, :2]) & (rec.ranges[:, :2] < hi) for _, lo, hi in thunks]
    assert not np.any(inside)
    assert [(e.caller, e.callee, e.calls) for e in branches.call_graph(rec, fns)] == [
        ("thunk_calls", "target_a", 3 * n // 4), ("thunk_calls", "target_b", n // 4)]
    plain, _ = record(probe, tmp_path / "plain.rec", "thunks", str(n))
    assert [e.callee for e in branches.call_graph(plain, fns) if e.caller == "thunk_calls"] == ["__x86_indirect_thunk_array"]


def test_many_edges(probe: Path, tmp_path: Path) -> None:
    """More distinct edges than the plugin's first index holds (it doubles as they come): each still exact."""
    n = 3
    rec, window = record(probe, tmp_path / "many.rec", "many", str(n))
    counts = rec.edges[:, 2].tolist()
    assert len(counts) == 5001 and counts.count(n) == 5000 and counts.count(n - 1) == 1
    assert rec.branches == 5000 * n + n - 1 == window["user"]["taken_branches"]
    assert (rec.edges[:, 1] - rec.edges[:, 0] == 3).sum() == 5000  # jmp (2 bytes) over a nop (1)


def test_straight_line_code_gives_no_records(probe: Path, tmp_path: Path) -> None:
    rec, window = record(probe, tmp_path / "straight.rec", "straight", "1")
    assert window["user"]["blocks"] >= 2 and window["user"]["insns"] == 1025  # several blocks, all fall-throughs
    assert (len(rec.edges), len(rec.ranges), len(rec.stacks), rec.branches, rec.samples) == (0, 0, 0, 0, 0)


def test_sampled_stacks(probe: Path, tmp_path: Path) -> None:
    """Stacks of at most 32 branches, newest first, one every `period` recorded branches; on the hot loop their
    per-function counts rank the functions as the exact edges do."""
    period = 64
    rec, _ = record(probe, tmp_path / "hot.rec", "hot", "100000", period=period)
    assert rec.samples == rec.branches // period == sum(s.count for s in rec.stacks)
    assert all(len(s.branches) == branches.DEPTH for s in rec.stacks)  # the ring is full long before the first sample
    # Newest first: each entry's target starts the straight run that the next newer entry's branch ends.
    for st in rec.stacks:
        older_to, newer_from = st.branches[1:, 1], st.branches[:-1, 0]
        assert (older_to <= newer_from).all()
    fns = branches.Functions(probe)
    m = branches.sampling_match(rec, fns)
    assert m["functions"] == 3 and m["spearman"] == 1.0 and m["hot1pct_overlap"] == 1.0 and m["cosine"] > 0.99
    exact = branches.function_branches(rec, fns)
    assert fns.names[int(np.argmax(exact))] == "hot_fn"


def test_bounds_keep_known_keys_exact(probe: Path, tmp_path: Path) -> None:
    """At its bound a table stores no new key: their executions are counted as lost, the keys it holds stay exact."""
    n = 2000
    rec, _ = record(probe, tmp_path / "calls.rec", "calls", str(n), entries=2, stacks=1, period=10)
    assert len(rec.edges) == 2 and len(rec.ranges) == 2 and len(rec.stacks) == 1
    assert int(rec.edges[:, 2].sum()) + rec.lost_edges == rec.branches == 7 * n - 1
    assert set(rec.edges[:, 2].tolist()) <= {n, n - 1}
    assert rec.lost_samples == rec.samples - rec.stacks[0].count > 0
    assert (rec.entries_bound, rec.stacks_bound) == (2, 1)


def test_report_unchanged_by_recording(probe: Path, tmp_path: Path) -> None:
    """The counters' report is the same with branch recording on and off (format, keys, counts)."""
    lib = sim.build_plugin()
    reports = []
    for on in (False, True):
        report = tmp_path / f"r{on}.json"
        plugin = f"{lib},out={report}" + (f",branches={tmp_path / 'x.rec'},branch_side=user" if on else "")
        subprocess.run(["qemu-x86_64", "-plugin", plugin, probe, "calls", "300"], check=True, capture_output=True, timeout=120)
        data = json.loads(report.read_text())
        for w in data["windows"]:
            w.pop("seconds")
        reports.append(data)
    assert reports[0] == reports[1] and reports[0]["format"] == sim.REPORT_FORMAT


def test_outputs_accepted_by_perf2bolt_and_profgen(probe: Path, tmp_path: Path) -> None:
    """The pre-aggregated profile through perf2bolt -pa, the perf-script stacks through llvm-profgen (user-mode ELF,
    non-kernel mmap form): both read it, and the sample profile names the hot function."""
    rec, _ = record(probe, tmp_path / "hot.rec", "hot", "100000", period=64)
    pa = tmp_path / "bolt.preagg"
    info = branches.write_bolt(rec, pa)
    text = pa.read_text()
    assert info["lines"] == len(rec.edges) + len(rec.ranges) and re.fullmatch(r"((B [0-9a-f]+ [0-9a-f]+ \d+ 0|F [0-9a-f]+ [0-9a-f]+ \d+)\n)+", text)
    fdata = tmp_path / "hot.fdata"
    res = subprocess.run([PERF2BOLT, "-pa", "-p", pa, "-o", fdata, probe], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"read {info['lines']} aggregated LBR entries" in res.stdout
    assert "traces mismatching disassembled function contents: 0 " in res.stdout
    assert re.search(r"^1 hot [0-9a-f]+ 1 hot_fn 0 0 100000$", fdata.read_text(), re.M), fdata.read_text()  # the call edge

    script = tmp_path / "perf.script"
    branches.write_perf_script(rec, probe, script)
    head = script.read_text().splitlines()
    assert head[0].startswith("PERF_RECORD_MMAP2 ") and head[0].endswith(f"r-xp {probe}")
    stack = next(ln for ln in head[1:] if not ln.isdigit())  # a repeat count has a line of its own
    assert re.fullmatch(r"[0-9a-f]+( 0x[0-9a-f]+/0x[0-9a-f]+/P/-/-/0){32}", stack)  # leading IP without 0x
    prof = tmp_path / "prof.txt"
    res = subprocess.run([PROFGEN, f"--perfscript={script}", f"--binary={probe}", f"--output={prof}", "--format=text"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert _hottest(prof) == "hot_fn", prof.read_text()[:500]


def _hottest(prof: Path) -> str:
    """The function with the largest total sample count in a text sample profile (lines `name:total:head`)."""
    tops = [(int(m[2]), m[1]) for m in re.finditer(r"^(\S+):(\d+):(\d+)$", prof.read_text(), re.M)]
    return max(tops)[1]


def test_kernel_form_on_a_vmlinux_like_elf(tmp_path: Path) -> None:
    """The kernel form of the perf-script output (`[kernel.kallsyms]_text` at _text) read by llvm-profgen --kernel
    with a vmlinux-like ELF: the freestanding probe linked at 0xffffffff81000000 (it cannot run in user mode), fed
    the records of the same code linked at a user address and run, shifted by the constant difference."""
    flags = ["gcc", "-O2", "-g", "-static", "-nostdlib", "-ffreestanding", "-fno-pie", "-no-pie", "-mcmodel=large",
             "-fno-stack-protector", "-fcf-protection=none", "-Wl,--build-id"]
    user, kernel = tmp_path / "probe-user", tmp_path / "vmlinux"
    subprocess.run([*flags, f"-Wl,-Ttext-segment={USER_BASE:#x}", "-o", user, FREESTANDING], check=True)
    subprocess.run([*flags, f"-Wl,-Ttext-segment={KERNEL_BASE:#x}", "-o", kernel, FREESTANDING], check=True)
    ufns, kfns = branches.Functions(user), branches.Functions(kernel)
    off = KERNEL_BASE - USER_BASE
    assert ufns.names == kfns.names and ((kfns.starts - ufns.starts) == np.uint64(off)).all()
    rec, _ = record(user, tmp_path / "user.rec", period=64)
    shift = np.uint64(off)
    edges, ranges = rec.edges.copy(), rec.ranges.copy()
    edges[:, :2] += shift
    ranges[:, :2] += shift
    krec = dataclasses.replace(rec, side="kernel", edges=edges, ranges=ranges,
                               stacks=tuple(branches.Stack(s.count, s.branches + shift) for s in rec.stacks))
    assert branches.in_functions_share(krec, kfns) == 1.0
    assert [(e.caller, e.callee, e.calls) for e in branches.call_graph(krec, kfns)] == [("run", "hot_fn", 100000), ("run", "cold_fn", 100)]
    script = tmp_path / "perf.script"
    branches.write_perf_script(krec, kernel, script)
    mmap = script.read_text().splitlines()[0]
    assert mmap.startswith(f"PERF_RECORD_MMAP2 -1/0: [{int(kfns.starts[0]):#x}(") and mmap.endswith(" r-xp [kernel.kallsyms]_text")
    prof = tmp_path / "prof.txt"
    res = subprocess.run([PROFGEN, "--kernel", f"--perfscript={script}", f"--binary={kernel}", f"--output={prof}", "--format=text"],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    assert _hottest(prof) == "hot_fn"


# ---- bad input ----

@pytest.fixture(scope="module")
def good_records(probe: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("records") / "calls.rec"
    record(probe, out, "calls", "100", period=16)
    return out


def test_records_of_another_binary_are_refused_first(good_records: Path, probe: Path, tmp_path: Path) -> None:
    other = "ab" * 20
    with pytest.raises(UserError) as e:
        branches.read_records(good_records, other)
    text = one_line(e.value)
    assert f"belong to the binary with build id {branches.build_id_of(probe)}, not {other}" in text
    # Checked before the rest of the file: a cut file for another binary is refused for its build id.
    cut = tmp_path / "cut.rec"
    cut.write_bytes(good_records.read_bytes()[:-40])
    with pytest.raises(UserError) as e:
        branches.read_records(cut, other)
    assert "belong to the binary with build id" in one_line(e.value)


@pytest.mark.parametrize("keep", [0, 7, 100, 300, -1, -16])
def test_truncated_records_are_one_line(good_records: Path, tmp_path: Path, keep: int) -> None:
    data = good_records.read_bytes()
    cut = tmp_path / "cut.rec"
    cut.write_bytes(data[:keep])
    with pytest.raises(UserError) as e:
        branches.read_records(cut)
    assert "truncated" in one_line(e.value) or "not a kpgo branch records file" in one_line(e.value)


def test_other_bad_records_are_one_line(good_records: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.rec"
    for content, needle in ((b"hello world" * 40, "not a kpgo branch records file"), (None, "missing.rec: does not exist")):
        if content is not None:
            bad.write_bytes(content)
        with pytest.raises(UserError) as e:
            branches.read_records(bad if content is not None else tmp_path / "missing.rec")
        assert needle in one_line(e.value)
    data = bytearray(good_records.read_bytes())
    data[8] = 9  # format
    bad.write_bytes(bytes(data))
    with pytest.raises(UserError) as e:
        branches.read_records(bad)
    assert "format 9" in one_line(e.value)


def test_branch_config() -> None:
    c = sim.BranchConfig(build_id="0a1b")
    arg = c.plugin_arg(Path("/tmp/x.rec"))
    assert arg == f"branches=/tmp/x.rec,branch_side=kernel,branch_period={sim.BRANCH_PERIOD},branch_entries=1048576,branch_stacks=65536,build_id=0a1b"
    for bad in ({"side": "both"}, {"period": 0}, {"entries": 1 << 29}, {"build_id": "xyz"}, {"build_id": "ABC"}):
        with pytest.raises(UserError):
            sim.BranchConfig(**bad)  # type: ignore[arg-type]
    with pytest.raises(UserError) as e:
        c.plugin_arg(Path("/tmp/a,b/x.rec"))
    assert "comma" in one_line(e.value)
    opts = sim.qemu_opts(sim.SimConfig(), Path("/tmp/sim.json"), c, Path("/tmp/x.rec"))
    assert ",branches=/tmp/x.rec," in opts and "build_id=0a1b" in opts


def test_vng_argv_records_with_nokaslr(tmp_path: Path) -> None:
    """Branch records need the kernel at vmlinux's addresses: a simulated boot has nokaslr."""
    from kpgo import vm

    kernel = tmp_path / "bzImage"
    kernel.write_bytes(b"")
    argv = [str(a) for a in vm.vng_argv(kernel, "true", guest=vm.Guest(), accel="tcg", sim=sim.SimConfig(), report=tmp_path / "s.json",
                                         branches=sim.BranchConfig(), records=tmp_path / "b.rec")]
    assert "nokaslr norandmaps" in argv and any(f"branches={tmp_path / 'b.rec'}" in a for a in argv)


def test_profile_stats_reads_a_branch_profile(good_records: Path, probe: Path, tmp_path: Path) -> None:
    """`kpgo profile stats` on a branch profile directory (as `kpgo collect --branches` writes it): the records read
    again and checked; one-line errors when they are cut or belong to another binary."""
    prof = tmp_path / "prof"
    prof.mkdir()
    shutil.copy(good_records, prof / branches.RECORDS_FILE)
    rec = branches.read_records(prof / branches.RECORDS_FILE)
    outputs = branches.make_outputs(rec, probe, prof)
    manifest = {"kind": branches.PROFILE_KIND, "build_id": rec.build_id, "kernel_release": "test",
                "workload": {"name": "calls", "unit": "ops/s"}, "throughput": 1.0, "window_seconds": 0.1, **outputs}
    (prof / "profile.json").write_text(json.dumps(manifest))
    res = kpgo("profile", "stats", prof)
    assert res.returncode == 0, res.stderr
    assert "branch records" in res.stdout and f"build id {rec.build_id}" in res.stdout and "hot: chain_" in res.stdout
    res = kpgo("profile", "stats", prof, "--json")
    assert json.loads(res.stdout)["records"]["branches"] == rec.branches
    (prof / "profile.json").write_text(json.dumps(dict(manifest, build_id="cd" * 20)))
    assert_one_line_error(kpgo("profile", "stats", prof), 1, "belong to the binary with build id")
    (prof / "profile.json").write_text(json.dumps(manifest))
    (prof / branches.RECORDS_FILE).write_bytes(good_records.read_bytes()[:-3])
    assert_one_line_error(kpgo("profile", "stats", prof), 1, "truncated")


def test_collect_branches_bad_input_is_one_line(tmp_path: Path) -> None:
    """Before any boot: --branch-period without --branches, a directory that holds no build, a build without its vmlinux."""
    assert_one_line_error(kpgo("collect", tmp_path, "--branch-period", "64", "-o", tmp_path / "out"), 1, "--branch-period is for --branches")
    assert_one_line_error(kpgo("collect", tmp_path, "--branches", "--workload", "redis", "-o", tmp_path / "out"), 1, "no complete kpgo build")
    (tmp_path / "build.json").write_text(json.dumps({"ok": True, "kernel_release": "6.12", "key": "k", "variant": "vanilla", "build_dir": str(tmp_path),
                                                     "config_name": "tiny", "config_hash": "0", "gcc": "12.2.0"}))
    (tmp_path / "arch" / "x86" / "boot").mkdir(parents=True)
    (tmp_path / "arch" / "x86" / "boot" / "bzImage").write_bytes(b"a complete build but for its vmlinux")
    assert_one_line_error(kpgo("collect", tmp_path, "--branches", "--workload", "redis", "-o", tmp_path / "out"), 1, "has no vmlinux")
    assert_one_line_error(kpgo("collect", tmp_path, "--branches", "--cluster", "local", "-o", tmp_path / "out"), 1, "not run on a cluster")
    assert not (tmp_path / "out").exists()
