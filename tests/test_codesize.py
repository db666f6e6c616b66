"""Code size from function symbols (kpgo.kernel.codesize): on a small ELF linked here with gcc the way the kernel
links vmlinux (functions of known size in .text, .text.hot and .text.unlikely input sections, an init section,
aliases, weak code and weak data, a .text section padded past its last function like the kernel's 2 MiB
alignment), each number against `nm -S` and `readelf -S` read independently; the report's code size table on the
recorded run of tests/data/report; and, VM-marked, build.json of the session's tiny vanilla kernel."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from kpgo.kernel import codesize, kbuild

DATA = Path(__file__).parent / "data" / "report"
PAD = 0x10000  # the test ELF's .text alignment (the kernel's is 2 MiB)

# Functions of known size (asm: .skip makes the size exact), with the cases the rule must get right.
ASM = r"""
    .section .text.hot.hotfn, "ax", @progbits
    .globl hotfn
    .type hotfn, @function
hotfn: .skip 48, 0x90
    .size hotfn, 48

    .section .text.asm, "ax", @progbits
    .globl f1
    .type f1, @function
f1: .skip 100, 0x90
    .size f1, 100
    .globl f1_alias                   /* an alias: same address, counted once */
    .type f1_alias, @function
    .set f1_alias, f1
    .size f1_alias, 100
    .balign 64                        /* a gap: the span covers it, the functions' size does not */
    .type f2, @function               /* local: nm type t */
f2: .skip 37, 0x90
    .size f2, 37
stub: .skip 8, 0x90                   /* an asm label without a size: not a function */
    .weak wf                          /* a weak function: nm type W, in a code section */
    .type wf, @function
wf: .skip 24, 0x90
    .size wf, 24

    .section .text.unlikely.coldfn, "ax", @progbits
    .type coldfn, @function
coldfn: .skip 20, 0x90
    .size coldfn, 20

    .section .entry.untrain, "ax", @progbits  /* like srso_alias_untrain_ret (SRSO kernels): on the 2 MiB boundary */
    .type untrain, @function                 /* the entry text starts at, past the padding: not in the span */
untrain: .skip 10, 0x90
    .size untrain, 10

    .section .entry.text, "ax", @progbits    /* the entry text (__entry_text_start): not in the span either */
    .globl entry_asm
    .type entry_asm, @function
entry_asm: .skip 30, 0x90
    .size entry_asm, 30

    .section .init.text, "ax", @progbits  /* code outside .text: counted in the functions, not in the span */
    .globl init_fn
    .type init_fn, @function
init_fn: .skip 50, 0x90
    .size init_fn, 50

    .section .data, "aw", @progbits
    .weak wdata                       /* weak data with a size: nm type W too, but not code */
wdata: .skip 16
    .size wdata, 16
    .globl obj
    .type obj, @object
obj: .skip 32
    .size obj, 32
"""
ASM_FUNCS = {"hotfn": 48, "f1": 100, "f2": 37, "wf": 24, "coldfn": 20, "untrain": 10, "entry_asm": 30, "init_fn": 50}

C = r"""
__attribute__((noinline)) int add(int a, int b) { return a + b; }
__attribute__((noinline, cold)) int rare(int x) { return x * 3 + 1; }
__attribute__((noinline, hot)) int often(int x) { return add(x, x) ^ 0x55; }
__attribute__((weak, noinline)) int hook(int x) { return x - 1; }
static __attribute__((noinline)) int helper(int x) { return x << 2; }
int entry(int x) { return often(x) + rare(x) + hook(x) + helper(x); }
"""

# Like the kernel's (arch/x86/kernel/vmlinux.lds.S, with the SRSO mitigation): _stext at the start of .text, hot
# code first, then the rest; at the next 2 MiB boundary srso_alias_untrain_ret and the entry text; the section
# padded at the end.
LDS = f"""
SECTIONS {{
  . = 0x400000;
  .text : {{
    _stext = .;
    *(.text.hot .text.hot.*)
    *(.text .text.*)
    . = ALIGN({codesize.ENTRY_ALIGN:#x});
    *(.entry.untrain)
    . = ALIGN(16);
    __entry_text_start = .;
    *(.entry.text)
    . = ALIGN({PAD:#x});
    _etext = .;
  }}
  .init.text : {{ *(.init.text) }}
  .data : {{ *(.data .data.*) }}
  .bss : {{ *(.bss .bss.*) }}
  /DISCARD/ : {{ *(.note*) *(.eh_frame*) *(.comment) }}
}}
"""


@pytest.fixture(scope="module")
def elf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("codesize")
    (d / "f.S").write_text(ASM)
    (d / "c.c").write_text(C)
    (d / "link.lds").write_text(LDS)
    out = d / "vmlinux"
    subprocess.run(["gcc", "-O2", "-ffunction-sections", "-fno-pie", "-no-pie", "-nostdlib", "-static",
                    "-fno-asynchronous-unwind-tables", "-Wl,-T," + str(d / "link.lds"), "-Wl,-e,entry",
                    "-o", out, d / "f.S", d / "c.c"], check=True, capture_output=True, text=True)
    return out


def readelf_sections(path: Path) -> dict[str, tuple[int, int, str]]:
    """Section name -> (address, size, flags), from `readelf -S -W` (independent of codesize's ELF reader; section 0,
    the null section, has no name and is left out)."""
    out = subprocess.run(["readelf", "-S", "-W", str(path)], check=True, capture_output=True, text=True).stdout
    secs = {}
    for m in re.finditer(r"^\s*\[\s*[1-9]\d*\]\s+(\S+)\s+\S+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([0-9a-f]+)\s+[0-9a-f]+\s+([A-Za-z]*)\s+\d",
                         out, re.M):
        secs[m.group(1)] = (int(m.group(2), 16), int(m.group(3), 16), m.group(4))
    return secs


def nm_functions(path: Path) -> list[tuple[str, str, int, int]]:
    """(name, type, address, size) of the function symbols, from `nm -S` read here: t/T with a size, and W/w
    with a size inside a section readelf marks executable (AX)."""
    code = [(a, a + s) for a, s, fl in readelf_sections(path).values() if "A" in fl and "X" in fl]
    out = subprocess.run(["nm", "-S", "--defined-only", str(path)], check=True, capture_output=True, text=True).stdout
    funcs = []
    for line in out.splitlines():
        p = line.split()
        if len(p) != 4:
            continue
        addr, size = int(p[0], 16), int(p[1], 16)
        if size and (p[2] in "tT" or (p[2] in "wW" and any(lo <= addr < hi for lo, hi in code))):
            funcs.append((p[3], p[2], addr, size))
    return funcs


def nm_symbol(path: Path, name: str) -> int:
    out = subprocess.run(["nm", str(path)], check=True, capture_output=True, text=True).stdout
    return next(int(p[0], 16) for p in (ln.split() for ln in out.splitlines()) if p[-1] == name)


def nm_stext(path: Path) -> int:
    return nm_symbol(path, "_stext")


def test_functions_size_and_span(elf: Path) -> None:
    funcs = nm_functions(elf)
    by_name = {n: s for n, _, _, s in funcs}
    for name, size in ASM_FUNCS.items():
        assert by_name[name] == size, name
    assert {"add", "rare", "often", "hook", "helper", "entry"} <= set(by_name)
    assert "wdata" not in by_name and "obj" not in by_name and "stub" not in by_name
    # each address once: the alias adds nothing
    per_addr: dict[int, int] = {}
    for _, _, a, s in funcs:
        per_addr[a] = max(per_addr.get(a, 0), s)
    assert sum(per_addr.values()) == sum(s for *_, s in funcs) - ASM_FUNCS["f1"]

    got = codesize.measure(elf)
    assert got["functions_size"] == sum(per_addr.values())
    assert got["functions"] == len(per_addr)

    secs = readelf_sections(elf)
    t_addr, t_size, _ = secs[".text"]
    # the compiled code ends before the 2 MiB boundary that srso_alias_untrain_ret's stand-in sits on, 16 bytes
    # before the entry text
    boundary = nm_symbol(elf, "untrain")
    assert boundary % (2 << 20) == 0 and nm_symbol(elf, "__entry_text_start") == boundary + 16
    compiled = [(a, s) for _, _, a, s in funcs if t_addr <= a < boundary]
    span = max(a + s for a, s in compiled) - nm_stext(elf)
    assert got["text_span"] == span
    assert got["vmlinux_text"] == t_size and t_size % PAD == 0
    assert span < boundary - nm_stext(elf) - 1_000_000  # the padding up to the boundary is not code
    # the span covers the gaps between functions but not init_fn (outside .text) nor what lies past the boundary
    assert sum(s for _, s in compiled) - ASM_FUNCS["f1"] <= span
    assert got["functions_size"] - ASM_FUNCS["init_fn"] - ASM_FUNCS["untrain"] - ASM_FUNCS["entry_asm"] <= span

    # the module's own view agrees: the section headers it reads, the symbols it keeps
    mine = {s.name: s for s in codesize.sections(elf)}
    for name, (addr, size, flags) in secs.items():
        assert (mine[name].address, mine[name].size) == (addr, size), name
        assert mine[name].executable == ("A" in flags and "X" in flags), name
    syms = codesize.symbols(elf)
    assert sorted((f.name, f.kind, f.address, f.size) for f in syms.functions) == sorted(funcs)
    assert syms.stext == nm_stext(elf)


def test_build_sizes_and_lazy_completion(elf: Path, tmp_path: Path) -> None:
    out = tmp_path / "build"
    (out / "arch" / "x86" / "boot").mkdir(parents=True)
    shutil.copyfile(elf, out / "vmlinux")
    (out / "arch" / "x86" / "boot" / "bzImage").write_bytes(b"\0" * 12345)
    sizes = kbuild.text_sizes(out)
    want = codesize.measure(elf)
    assert {k: sizes[k] for k in want} == want
    assert sizes["bzimage"] == 12345
    assert sizes["objects"] == 0 and sizes["objects_text"] == 0  # no vmlinux.a here
    # a build.json written before these keys existed: completed from the vmlinux, the recorded keys kept
    old = {"vmlinux_text": 999, "objects_text": 7, "text_hot": 1, "text_unlikely": 2, "objects": 3}
    done = codesize.complete(out, old)
    assert done == old | {k: sizes[k] for k in ("functions_size", "functions", "text_span", "bzimage", "version")}
    assert codesize.complete(tmp_path / "gone", old) == old  # nothing to measure: left missing ("–")
    # a text_span recorded under the first rule (up to srso_alias_untrain_ret, across the padding) is measured again;
    # one recorded under this rule is kept
    first_rule = {k: sizes[k] for k in codesize.VMLINUX_KEYS} | {"text_span": 2 << 20}
    assert codesize.complete(out, first_rule) == first_rule | {"text_span": sizes["text_span"], "version": codesize.SIZES_VERSION}
    assert codesize.complete(tmp_path / "gone", first_rule) == first_rule  # nothing to measure it on: kept, still old
    assert codesize.complete(out, sizes) == sizes
    # the report's per-function sizes come from the same symbols
    from kpgo.report import profiles

    per_name = profiles.text_sizes(elf)
    assert per_name["f1"].size == 100 and per_name["f1_alias"].size == 100
    assert per_name["wf"].size == 24 and "wdata" not in per_name


def copy_recorded(tmp_path: Path) -> Path:
    """The recorded tiny run, with an empty builds/LABEL for each build: the report then does not look at the
    build directories the bench recorded (they may exist on this machine)."""
    run_dir = tmp_path / "run"
    shutil.copytree(DATA / "tiny-cross-sim", run_dir)
    for label in json.loads((run_dir / "run.json").read_text())["builds"]:
        (run_dir / "builds" / label).mkdir(parents=True)
    return run_dir


HEADER = ("| build | functions | text span | objects' .text\\* | .text.hot | .text.unlikely | bzImage | "
          ".text section (padded) | functions vs vanilla |")
GOLDEN = [  # tests/data/report/tiny-cross-sim/run.json has no functions_size, text_span, bzimage: '–'
    "| vanilla | – | – | 4,467,796 | 0 | 65 | – | 8,388,608 | – |",
    "| instrumented | – | – | 6,901,534 | 0 | 53 | – | 10,485,760 | – |",
    "| optimized-micro | – | – | 3,791,079 | 342,247 | 3,230,336 | – | 6,291,456 | – |",
    "| optimized-redis | – | – | 3,694,036 | 164,114 | 3,327,144 | – | 6,291,456 | – |",
]


def code_size_table(run_dir: Path) -> tuple[dict, list[str]]:
    from kpgo import report as rep

    out = run_dir / "report"
    rep.write(rep.generate(run_dir, out), out)
    doc = json.loads((out / "report.json").read_text())
    md = (out / "report.md").read_text().splitlines()
    i = md.index(HEADER)
    assert set(md[i + 1].strip("|")) <= set("-:|")
    return doc["sections"]["code_size"]["data"], md[i + 2 : i + 2 + len(GOLDEN)]


def test_report_code_size_from_recorded_run(tmp_path: Path) -> None:
    run_dir = copy_recorded(tmp_path)
    data, rows = code_size_table(run_dir)
    assert rows == GOLDEN
    md = (run_dir / "report" / "report.md").read_text()
    assert "padded" in md and "from _stext to the end of the last function" in md and "nm -S" in md
    assert "| vmlinux .text |" not in md  # the padded section is never shown unlabelled
    assert data["builds"]["vanilla"]["sizes"]["objects_text"] == 4467796


def test_report_measures_old_build_from_its_vmlinux(tmp_path: Path, elf: Path) -> None:
    run_dir = copy_recorded(tmp_path)
    shutil.copyfile(elf, run_dir / "builds" / "vanilla" / "vmlinux")
    data, rows = code_size_table(run_dir)
    got = codesize.measure(elf)
    assert rows[0] == (f"| vanilla | {got['functions_size']:,} | {got['text_span']:,} | 4,467,796 | 0 | 65 | – | "
                       "8,388,608 | 1.000 |")  # the recorded padded size is kept
    assert rows[1:] == GOLDEN[1:]
    assert data["builds"]["vanilla"]["sizes"]["functions_size"] == got["functions_size"]


# -- the session's tiny kernel (VM tests) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_vanilla(request: pytest.FixtureRequest, test_dir: Path) -> Path:
    """The build directory of the tiny vanilla kernel that tests/conftest.py's tiny_run builds (as
    tests/test_sim_vm.py's tiny_kernel finds it)."""
    out = test_dir / "run-tiny" / "builds" / "vanilla"
    info = out / "build.json"
    if not (info.is_file() and json.loads(info.read_text()).get("ok")):
        request.getfixturevalue("tiny_run")
    return out


@pytest.mark.vm
def test_tiny_kernel_build_json(tiny_vanilla: Path) -> None:
    vmlinux = tiny_vanilla / "vmlinux"
    recorded = json.loads((tiny_vanilla / "build.json").read_text())["sizes"]
    # a build made before kpgo recorded these keys is completed the way every consumer completes it
    sizes = codesize.complete(tiny_vanilla, recorded)
    funcs = nm_functions(vmlinux)
    per_addr: dict[int, int] = {}
    for _, _, a, s in funcs:
        per_addr[a] = max(per_addr.get(a, 0), s)
    assert sizes["functions_size"] == sum(per_addr.values())
    t_addr, t_size, _ = readelf_sections(vmlinux)[".text"]
    assert sizes["vmlinux_text"] == t_size and t_size % (2 << 20) == 0  # the padded section
    # The compiled code ends below the entry text, which the linker script starts at the next 2 MiB boundary.
    entry = nm_symbol(vmlinux, "__entry_text_start")
    assert entry % (2 << 20) == 0
    ends = [a + s for _, _, a, s in funcs if t_addr <= a < entry]
    assert sizes["text_span"] == max(ends) - nm_stext(vmlinux) <= entry - nm_stext(vmlinux) < t_size
    assert sizes["bzimage"] == (tiny_vanilla / "arch" / "x86" / "boot" / "bzImage").stat().st_size
