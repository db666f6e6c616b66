"""Function order (issue 35 part 3, kpgo.kernel.order, docs/LAYOUT.md): C3 on hand-made call graphs with a known
answer; the placement mechanics on a small ELF built here with gcc -ffunction-sections, `ld -r` (as the kernel makes
vmlinux.o) and GNU ld with the globs of kpgo's kernel patch and the fragment kpgo writes (the order shows in the
linked addresses, and the check from the binary says so, or says what is wrong); the patch on the real 6.12 source;
bad input (a call graph naming no function of its kernel, malformed files) -> one-line errors, before any build.
The kernel test (a tiny kernel built with an order, checked, booted with a workload) is in test_order_vm.py."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import assert_one_line_error, kpgo
from kpgo import branches, variants
from kpgo.errors import InfraError, UserError
from kpgo.kernel import codesize, kbuild, order, source
from kpgo.kernel.order import Node, c3, hot_names

needs_toolchain = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("ld") and shutil.which("objdump")), reason="needs gcc and binutils")


def nodes(**spec: tuple[int, float]) -> dict[str, Node]:
    return {n: Node(n, size, weight) for n, (size, weight) in spec.items()}


# ---- C3 ----

def test_the_hot_chain_comes_first_in_call_order() -> None:
    """A -> B hot, B -> C hot, D cold: A, B, C in one cluster, caller before callee, D after."""
    g = nodes(A=(100, 1000), B=(100, 900), C=(100, 800), D=(100, 5))
    clusters = c3(g, [("A", "B", 900), ("B", "C", 800), ("A", "D", 5)])
    assert clusters[0] == ["A", "B", "C", "D"] or clusters[0][:3] == ["A", "B", "C"]
    flat = [n for c in clusters for n in c]
    assert flat[:3] == ["A", "B", "C"] and flat[-1] == "D"


def test_a_callee_hotter_than_its_caller_still_follows_it() -> None:
    """C3 appends the callee's cluster to its most likely caller's, whichever is hotter."""
    g = nodes(top=(64, 10), leaf=(64, 5000), other=(64, 20))
    clusters = c3(g, [("other", "leaf", 1), ("top", "leaf", 10)])
    assert ["top", "leaf"] in clusters and ["other"] in clusters


def test_the_page_limit_splits_clusters() -> None:
    """Three 1.5 KiB functions in a chain: two fit a 4 KiB page, the third starts a cluster of its own."""
    g = nodes(A=(1536, 300), B=(1536, 200), C=(1536, 100))
    edges = [("A", "B", 200), ("B", "C", 100)]
    assert c3(g, edges) == [["A", "B"], ["C"]]
    assert c3(g, edges, page=8192) == [["A", "B", "C"]]
    assert c3(g, edges, page=2048) == [["A"], ["B"], ["C"]]


def test_clusters_are_sorted_by_density() -> None:
    """Two unrelated chains: the denser one (weight per byte) first, though the other weighs more in all."""
    g = nodes(big=(2000, 1000), big2=(2000, 900), small=(100, 300), small2=(100, 200))
    clusters = c3(g, [("big", "big2", 900), ("small", "small2", 200)])
    assert clusters == [["small", "small2"], ["big", "big2"]]


def test_a_hot_callee_is_not_diluted_behind_a_large_cold_caller() -> None:
    """Merging would make the cluster more than 8 times less dense than the callee alone: C3 keeps them apart."""
    g = nodes(cold=(3900, 10), hot=(64, 6400))
    assert c3(g, [("cold", "hot", 10)]) == [["hot"], ["cold"]]
    assert c3(g, [("cold", "hot", 10)], density_drop=1e9) == [["cold", "hot"]]


def test_the_most_likely_caller_wins_and_self_calls_and_strangers_are_ignored() -> None:
    g = nodes(a=(64, 50), b=(64, 60), f=(64, 100))
    clusters = c3(g, [("a", "f", 3), ("b", "f", 7), ("f", "f", 1000), ("nobody", "f", 10**6), ("a", "f", 2)])
    assert ["b", "f"] in clusters  # b -> f (7) beats a -> f (3 + 2 = 5); the self call and the unknown caller count for nothing


def test_same_input_same_order() -> None:
    g = nodes(**{f"f{i}": (64, 10.0) for i in range(20)})
    edges = [(f"f{i}", f"f{(i * 7) % 20}", 3) for i in range(20)]
    assert c3(g, edges) == c3(dict(reversed(list(g.items()))), list(reversed(edges)))


def test_hot_names_hold_the_share() -> None:
    w = {"a": 50.0, "b": 30.0, "c": 15.0, "d": 5.0, "e": 0.0}
    assert hot_names(w, 0.5) == ["a"]
    assert hot_names(w, 0.8) == ["a", "b"]
    assert hot_names(w, 0.81) == ["a", "b", "c"]
    assert hot_names(w, 1.0) == ["a", "b", "c", "d"]


# ---- the placement on a small ELF ----

PROG_A = """
__attribute__((section(".head.text"))) int head_entry(int x) { return x + 42; }
static __attribute__((noinline)) int helper(int x) { return x * 3 + 1; }
int alpha(int x) { return helper(x) + 1; }
int beta(int x) { return alpha(x) * 2; }
int unknown_nmi_error(int x) { return x - 7; }
int unlikely_path(int x) { return x + 9; }
int u(int x) { return x ^ 5; }
int hotplug(int x) { return x ^ 6; }
__attribute__((cold)) int coldfn(int x) { return x / 3; }
int gamma_(int x) { return beta(x) - 1; }
__attribute__((cold, noinline)) int oops(int x) { return x * 77; }
int split(int x) { if (__builtin_expect(x == 1234, 0)) { x = oops(x) + oops(x + 1); } return x + 1; }  /* split.cold */
"""
PROG_B = """
static __attribute__((noinline)) int helper(int x) { return x * 5 + 2; }
int delta(int x) { return helper(x) + 4; }
int _start(void) { return delta(1); }
"""


def kpgo_text_functions() -> str:
    """The glob list KPGO_TEXT_FUNCTIONS of kpgo's kernel patch, as the kernel's linker script gets it."""
    added = [ln[1:] for ln in order.PATCH.read_text().splitlines() if ln.startswith("+") and not ln.startswith("+++")]
    start = next(i for i, ln in enumerate(added) if ln.startswith("#define KPGO_TEXT_FUNCTIONS"))
    body = []
    for ln in added[start + 1:]:
        body.append(ln.rstrip("\\").strip())
        if not ln.endswith("\\"):
            break
    return " ".join(body)


def link(tmp: Path, fragment: str | None) -> tuple[Path, Path]:
    """vmlinux.o and vmlinux of the small program: the main text as kpgo's patched linker script makes it."""
    (tmp / "a.c").write_text(PROG_A)
    (tmp / "b.c").write_text(PROG_B)
    for src in ("a", "b"):
        subprocess.run(["gcc", "-O2", "-fno-inline", "-fno-pic", "-ffunction-sections", "-c", f"{src}.c"], cwd=tmp, check=True)
    rel = tmp / "vmlinux.o"
    subprocess.run(["ld", "-r", "-o", rel, "a.o", "b.o"], cwd=tmp, check=True)  # merges same-named sections, as Kbuild's vmlinux.o
    include = ""
    if fragment is not None:
        (tmp / order.FRAGMENT).write_text(fragment)
        include = f'INCLUDE "{tmp / order.FRAGMENT}"'
    script = tmp / "vmlinux.lds"
    script.write_text(f"""SECTIONS {{
  . = 0x400000;
  .text : {{ _stext = .; KEEP(*(.head.text)) . = ALIGN(16); {include} *(.text)
            *(.text.hot .text.hot.*) *(.text {kpgo_text_functions()}) *(.text.unlikely .text.unlikely.*) *(.text.unknown .text.unknown.*) }}
  .data : {{ *(.data) *(.bss) *(.got) *(.got.plt) *(.igot.plt) *(.iplt) *(.rela.*) }}
  /DISCARD/ : {{ *(.comment) *(.note.*) *(.eh_frame) }}
}}
""")
    out = tmp / "vmlinux"
    # orphans are errors, as under CONFIG_WERROR: every function section must be placed by the script
    subprocess.run(["ld", "-T", script, "--orphan-handling=error", "-o", out, rel], cwd=tmp, check=True)
    return rel, out


def addresses(elf: Path) -> list[tuple[int, str]]:
    return sorted((f.address, f.name) for f in codesize.symbols(elf).functions)


@needs_toolchain
def test_the_order_shows_in_the_linked_addresses(tmp_path: Path) -> None:
    wanted = ["gamma_", "helper", "alpha", "split.cold", "delta"]
    rel, out = link(tmp_path, order.fragment_text(wanted, "test"))
    got = [n for _, n in addresses(out)]
    assert got[0] == "head_entry"  # the head text stays first
    # both static helpers (one section in vmlinux.o) together, where the order names them; a cold part that ran too
    assert got[1:7] == ["gamma_", "helper", "helper", "alpha", "split.cold", "delta"]
    # the rest in link order, the names that look like .text.unlikely/.unknown in the main text, the cold functions last
    assert set(got[7:-2]) == {"beta", "unknown_nmi_error", "unlikely_path", "u", "hotplug", "split", "_start"}
    assert set(got[-2:]) == {"coldfn", "oops"}
    found = order.verify(rel, out, ["gamma_", "helper", "alpha", "nosuch", "split.cold", "delta"])
    assert found["ok"] and found["placeable"] == 5 and found["placed_in_order"] == 5 and found["inversions"] == 0
    assert found["not_placeable"] == ["nosuch"] and found["intruders"] == 0 and found["start_offset"] <= found["head_text"] + order.HEAD_SLACK


@needs_toolchain
def test_the_check_fails_when_the_binary_does_not_follow_the_order(tmp_path: Path) -> None:
    (tmp_path / "none").mkdir()
    rel, out = link(tmp_path / "none", None)  # linked without the fragment: link order
    found = order.verify(rel, out, ["delta", "alpha", "gamma_"])
    assert not found["ok"] and found["inversions"] > 0
    (tmp_path / "partial").mkdir()
    rel, out = link(tmp_path / "partial", order.fragment_text(["delta", "gamma_"]))
    found = order.verify(rel, out, ["delta", "alpha", "gamma_"])  # alpha was not in the fragment: it lies elsewhere
    assert not found["ok"] and found["inversions"] == 1
    with pytest.raises(InfraError, match="not applied: of 3 ordered functions with a section of their own, 1 out of order"):
        order.enforce(found, tmp_path)


@needs_toolchain
def test_hot_text_counts_pages_and_span(tmp_path: Path) -> None:
    _, out = link(tmp_path, order.fragment_text(["gamma_", "alpha"]))
    h = order.hot_text(out, {"gamma_": 60.0, "alpha": 30.0, "coldfn": 10.0}, 0.9)
    assert h["functions"] == 2 and h["pages_4k"] == 1 and h["pages_2m"] == 1 and h["missing"] == 0
    fns = {f.name: f for f in codesize.symbols(out).functions}
    assert h["span"] == fns["alpha"].end - fns["gamma_"].address and h["bytes"] == fns["alpha"].size + fns["gamma_"].size
    cold = order.hot_text(out, {"gamma_": 60.0, "coldfn": 40.0}, 1.0)  # the cold function lies after the whole main text
    assert cold["span"] == fns["coldfn"].end - fns["gamma_"].address > h["span"]
    h = order.hot_text(out, {"gamma_": 60.0, "gone": 40.0}, 1.0)
    assert h["missing"] == 1 and h["missing_weight_share"] == pytest.approx(0.4)


def test_the_fragment_keeps_one_line_per_function() -> None:
    text = order.fragment_text(["a", "b.constprop.0", "c.cold", "d.part.0.cold.1"], "x")
    assert text.splitlines()[1:] == ["*(.text.a .text.hot.a)", "*(.text.b.constprop.0 .text.hot.b.constprop.0)",
                                     "*(.text.unlikely.c)", "*(.text.unlikely.d.part.0)"]


# ---- the patch on the real source ----

@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("KPGO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.skipif(not source.DEFAULT_TARBALL.exists(), reason="needs linux-source-6.12 (make setup)")
def test_patch_applies_to_a_copy_and_leaves_the_source(cache: Path) -> None:
    import os

    real = source.resolve(None) if not os.environ.get("KPGO_TEST_SOURCE") else source.resolve(Path(os.environ["KPGO_TEST_SOURCE"]))
    files = source.patch_files(order.PATCH)
    assert set(files) == {"Makefile", "arch/x86/kernel/Makefile", "arch/x86/kernel/vmlinux.lds.S", "include/asm-generic/vmlinux.lds.h"}
    before = {rel: (real.path / rel).read_bytes() for rel in files}
    patched = order.patched(real)
    assert patched.path.parent == cache / "src" and patched.ident != real.ident and patched.version == real.version
    assert "KPGO_ORDERED_TEXT(KPGO_FUNCTION_ORDER)" in (patched.path / "arch/x86/kernel/vmlinux.lds.S").read_text()
    assert order.MAKE_VAR in (patched.path / "arch/x86/kernel/Makefile").read_text()
    for rel, data in before.items():
        assert (real.path / rel).read_bytes() == data != (patched.path / rel).read_bytes()
    assert order.patched(real) == patched


def test_a_tree_the_patch_does_not_fit_is_refused_with_the_hunk(cache: Path, tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "arch/x86/kernel").mkdir(parents=True)
    (tree / "include/asm-generic").mkdir(parents=True)
    (tree / "Makefile").write_text("VERSION = 5\nPATCHLEVEL = 4\n")
    (tree / "arch/x86/kernel/Makefile").write_text("obj-y += foo.o\n")
    (tree / "arch/x86/kernel/vmlinux.lds.S").write_text("SECTIONS { }\n")
    (tree / "include/asm-generic/vmlinux.lds.h").write_text("/* another kernel */\n")
    with pytest.raises(UserError) as e:
        order.patched(source.KernelSource(tree, "5.4.0", "foreign"))
    assert "text-sections patch does not apply" in e.value.message and "FAILED" in e.value.message and "\n" not in e.value.message


# ---- inputs and bad input ----

@pytest.fixture(scope="module")
def small_elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("elf")
    (d / "p.c").write_text("int f1(int x) { return x + 1; }\nint f2(int x) { return f1(x) * 2; }\nvoid _start(void) { for (;;) f2(3); }\n")
    subprocess.run(["gcc", "-O1", "-nostdlib", "-static", "-ffunction-sections", "-Wl,--build-id", "-o", d / "p", d / "p.c"], check=True)
    return d / "p"


def profile_dir(tmp: Path, elf: Path, graph: str, **manifest: object) -> Path:
    d = tmp / "prof"
    d.mkdir(exist_ok=True)
    (d / branches.CALL_GRAPH_FILE).write_text(graph)
    fields = {"kind": branches.PROFILE_KIND, "vmlinux": str(elf), "build_id": branches.build_id_of(elf), **manifest}
    (d / "profile.json").write_text(json.dumps(fields))
    return d


HEADER = branches.CALL_GRAPH_HEADER + "\n"


@needs_toolchain
def test_a_good_call_graph_gives_a_plan_without_records(tmp_path: Path, small_elf: Path) -> None:
    d = profile_dir(tmp_path, small_elf, HEADER + "_start\tf2\t100\t0\nf2\tf1\t100\t0\n")
    p = order.plan(order.recording(d))
    assert p.order == ("_start", "f2", "f1") and p.stats["weights"] == "calls" and p.stats["clusters"] == 1
    assert order.recording(d / branches.CALL_GRAPH_FILE).graph == d / branches.CALL_GRAPH_FILE
    hot = order.recorded_hot_text(d)
    assert set(hot) == {"0.9", "0.99"} and hot["0.99"]["functions"] == 3 and hot["0.99"]["pages_4k"] >= 1
    assert "3 functions" in order.hot_text_line("0.99", hot["0.99"])
    key = order.input_digest(order.recording(d))
    (d / branches.CALL_GRAPH_FILE).write_text(HEADER + "_start\tf2\t101\t0\nf2\tf1\t100\t0\n")
    assert order.input_digest(order.recording(d)) != key  # the build key follows the call graph's bytes


BAD = [
    ("names no function", HEADER + "nosuch\tnothere\t5\t0\n", {}, "names no function of"),
    ("no header", "a\tb\t1\t0\n", {}, "not a kpgo call graph"),
    ("bad columns", HEADER + "f2\tf1\tmany\t0\n", {}, ":2: not CALLER"),
    ("empty", HEADER, {}, "holds no calls"),
    ("binary", None, {}, "callgraph.tsv: not text"),
    ("other kernel", HEADER + "f2\tf1\t1\t0\n", {"build_id": "00" * 20}, "is not the kernel the call graph"),
    ("kernel gone", HEADER + "f2\tf1\t1\t0\n", {"vmlinux": "/nonexistent/vmlinux", "build_dir": "/nonexistent"}, "is gone"),
    ("not a branch profile", HEADER + "f2\tf1\t1\t0\n", {"kind": "gcov"}, "is not a branch profile"),
]


@needs_toolchain
@pytest.mark.parametrize(("what", "graph", "manifest", "needle"), BAD, ids=[b[0] for b in BAD])
def test_bad_call_graphs_are_one_line_errors_before_any_build(tmp_path: Path, small_elf: Path, what: str, graph: str | None,
                                                             manifest: dict, needle: str) -> None:
    d = profile_dir(tmp_path, small_elf, graph or "", **manifest)
    if graph is None:
        (d / branches.CALL_GRAPH_FILE).write_bytes(b"\xff\xfe\x00binary\x80" * 10)
    res = kpgo("build", "--base", "tiny", "--variant", "order", "--call-graph", d, "-o", tmp_path / "b", "--dry-run")
    assert_one_line_error(res, 1, needle)
    assert not (tmp_path / "b").exists()


@needs_toolchain
def test_a_call_graph_without_its_manifest_or_for_the_wrong_variant(tmp_path: Path, small_elf: Path) -> None:
    lone = tmp_path / "lone.tsv"
    lone.write_text(HEADER + "f2\tf1\t1\t0\n")
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "order", "--call-graph", lone, "--dry-run"), 1, "has no profile.json beside it")
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "order", "--call-graph", tmp_path / "nope", "--dry-run"), 1, "not found")
    assert_one_line_error(kpgo("build", "--base", "tiny", "--variant", "order", "--dry-run"), 1, "none was given")
    d = profile_dir(tmp_path, small_elf, HEADER + "f2\tf1\t1\t0\n")
    assert_one_line_error(kpgo("build", "--base", "tiny", "--call-graph", d, "--dry-run"), 1, "--call-graph is only for")
    with pytest.raises(UserError, match="has a blank, quote"):
        order.check_out(tmp_path / "my builds" / "order")


@needs_toolchain
def test_the_dry_run_names_the_patched_copy_and_the_fragment(tmp_path: Path, small_elf: Path) -> None:
    d = profile_dir(tmp_path, small_elf, HEADER + "f2\tf1\t1\t0\n")
    res = kpgo("build", "--base", "tiny", "--variant", "order", "--call-graph", d, "-o", tmp_path / "b", "--dry-run")
    assert res.returncode == 0, res.stderr
    assert "text-sections.patch" in res.stdout and f"{order.MAKE_VAR}={tmp_path / 'b' / order.FRAGMENT}" in res.stdout
    assert "KCFLAGS=-ffunction-sections" in res.stdout


# ---- the variants ----

def test_the_order_variants() -> None:
    o, po = variants.get("order"), variants.get("pgo-order")
    assert o.order and po.order and po.profile and not o.profile and variants.FUNCTION_SECTIONS in o.flags
    assert not variants.get("vanilla").order
    assert "order" not in variants.STUDY_DEFAULTS


@pytest.mark.parametrize(("spec", "needle"), [
    ({"order": True}, "flags need -ffunction-sections"),
    ({"flags": ["-ffunction-sections"]}, "-ffunction-sections without order = true"),
    ({"order": True, "flags": ["-ffunction-sections"], "gcov": True}, "order = true with gcov = true"),
    ({"order": True, "flags": ["-ffunction-sections"], "compiler": "clang-19"}, "order = true with clang"),
    ({"order": "yes"}, "order should be of type bool"),
])
def test_order_variant_files_are_validated(spec: dict, needle: str) -> None:
    base = {"name": "mine", "description": "d", "compiler": "gcc-12", "opt": "O2"}
    problems = variants.validate(base | spec)
    assert any(needle in p for p in problems), problems


def test_the_build_key_holds_the_order(tmp_path: Path, small_elf: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kpgo.kernel import kconfig

    d = profile_dir(tmp_path, small_elf, HEADER + "f2\tf1\t1\t0\n")
    src = source.KernelSource(tmp_path, "6.12.0", "src")
    spec = kconfig.resolve("tiny", None, [])
    monkeypatch.setattr(variants.Compiler, "version", lambda self: "12.2.0")
    req = kbuild.BuildRequest(src, spec, variants.get("order"), tmp_path / "o", call_graph=d)
    key = kbuild.build_key(req)
    (d / branches.CALL_GRAPH_FILE).write_text(HEADER + "f2\tf1\t2\t0\n")
    assert kbuild.build_key(req) != key
    assert kbuild.build_key(kbuild.BuildRequest(src, spec, variants.get("vanilla"), tmp_path / "o")) != key


def test_the_patch_names_the_files_it_changes() -> None:
    text = order.PATCH.read_text()
    assert re.search(r"^\+#define KPGO_TEXT_FUNCTIONS", text, re.M) and "INCLUDE order" in text
    assert kpgo_text_functions().startswith(".text.[0-9a-rtv-zA-Z_]*")
