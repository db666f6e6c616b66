"""Code size of a linked kernel, exactly: from the function symbols of vmlinux (`nm -S`), not from the size of
its .text section, which the x86-64 linker script pads to a 2 MiB boundary (a vanilla tiny kernel: 10,485,760
bytes of section for about 8.5 MB of code).

This is kpgo's one parser of `nm -S`: the build sizes (kbuild.text_sizes, build.json) and the report's
per-function sizes (report.profiles.text_sizes) both read `symbols()`.

What counts as a function (see `symbols`):
- nm types t/T with a size: symbols in a code section (nm gives t/T only to SHF_EXECINSTR sections), i.e. the
  C functions, GCC's clones and split-off parts (.isra, .constprop, .part, .cold) and the assembly routines
  declared with SYM_FUNC_START/END (those have a size too). Objtool's __pfx_ symbols (the 16 bytes of call
  padding in front of each function when CONFIG_CALL_PADDING is set) are t symbols with a size and count: they
  are bytes the build emits for every function. Functions in .init.text count as well: they are compiled (and
  profiled) like the rest, only freed after boot.
- nm types W/w (weak) with a size whose address lies in an executable section: `__weak` functions. nm gives
  W/w whatever the section, so the address tells weak functions from weak data.
- Not counted: symbols without a size (asm labels such as _stext, entry points declared without .size),
  data (d/D/b/B/r/R), absolute symbols.
Aliases (SYM_FUNC_ALIAS, memcpy/__memcpy) share an address: each address is counted once, with the largest
size given there."""

from __future__ import annotations

import functools
import struct
from dataclasses import dataclass
from pathlib import Path

from kpgo import proc
from kpgo.errors import InfraError

SHF_ALLOC = 0x2
SHF_EXECINSTR = 0x4
TEXT = ".text"
STEXT = "_stext"
# The x86-64 linker script starts the entry text (syscall/interrupt entry, kept apart for page-table isolation) at
# the next 2 MiB boundary after the compiled code (ALIGN_ENTRY_TEXT_BEGIN), and with the SRSO mitigation puts
# srso_alias_untrain_ret on that boundary, just before __entry_text_start: text_span ends below the boundary, so
# that the padding is not counted.
ENTRY_TEXT = "__entry_text_start"
ENTRY_ALIGN = 2 << 20
NM_KEYS = ("functions_size", "functions", "text_span", "vmlinux_text")  # what measure() gives
VMLINUX_KEYS = (*NM_KEYS, "bzimage")  # what a build's vmlinux and bzImage give (vmlinux_sizes)
# The sizes' rule, recorded with them ("version"): before 2, text_span ran up to srso_alias_untrain_ret on the
# SRSO kernels (the server config), i.e. across the padding, so complete() measures such a record's span again.
SIZES_VERSION = 2


@dataclass(frozen=True)
class Section:
    name: str
    address: int
    size: int
    executable: bool  # allocated and executable: code in the loaded image

    def holds(self, address: int) -> bool:
        return self.address <= address < self.address + self.size


@dataclass(frozen=True)
class Function:
    name: str
    address: int
    size: int
    kind: str  # nm's type letter: t, T, w or W

    @property
    def end(self) -> int:
        return self.address + self.size


@dataclass(frozen=True)
class Symbols:
    functions: tuple[Function, ...]  # every function symbol (aliases included), in nm's (address) order
    sections: tuple[Section, ...]
    stext: int | None  # address of _stext, when defined
    entry_text: int | None = None  # address of __entry_text_start, when defined

    def section(self, name: str) -> Section | None:
        return next((s for s in self.sections if s.name == name), None)


def sections(elf: Path) -> list[Section]:
    """The section headers of an ELF file (32 or 64 bit, either byte order), read directly."""
    try:
        with open(elf, "rb") as f:
            ident = f.read(16)
            if len(ident) < 16 or ident[:4] != b"\x7fELF" or ident[4] not in (1, 2) or ident[5] not in (1, 2):
                raise InfraError(f"{elf} is not an ELF file", "pass a linked kernel (vmlinux)")
            e = "<" if ident[5] == 1 else ">"
            if ident[4] == 2:
                ehdr, shdr = struct.Struct(e + "HHIQQQIHHHHHH"), struct.Struct(e + "IIQQQQIIQQ")
            else:
                ehdr, shdr = struct.Struct(e + "HHIIIIIHHHHHH"), struct.Struct(e + "IIIIIIIIII")
            h = ehdr.unpack(f.read(ehdr.size))
            shoff, shnum, shstrndx = h[5], h[11], h[12]
            if shoff == 0:
                return []

            def header(i: int) -> tuple[int, ...]:
                f.seek(shoff + i * shdr.size)
                return shdr.unpack(f.read(shdr.size))

            first = header(0)
            shnum = shnum or first[5]  # more than 0xff00 sections: the count is in section 0's sh_size
            if shstrndx == 0xFFFF:  # SHN_XINDEX: the index is in section 0's sh_link
                shstrndx = first[6]
            heads = [header(i) for i in range(shnum)]
            strtab = heads[shstrndx]
            f.seek(strtab[4])
            names = f.read(strtab[5])
    except OSError as err:
        raise InfraError(f"cannot read {elf}: {err.strerror}") from None
    except (struct.error, IndexError):
        raise InfraError(f"{elf} is a truncated or damaged ELF file", "rebuild it") from None
    out = []
    for sh_name, _type, flags, addr, _off, size, *_ in heads:
        name = names[sh_name : names.find(b"\0", sh_name)].decode(errors="replace")
        out.append(Section(name, addr, size, (flags & (SHF_ALLOC | SHF_EXECINSTR)) == (SHF_ALLOC | SHF_EXECINSTR)))
    return out


def symbols(elf: Path) -> Symbols:
    """The function symbols of `elf` from `nm -S --defined-only` (which ones: the module's docstring), read once
    per file version: the build and the report's sections ask for the same vmlinux more than once."""
    try:
        st = elf.stat()
    except OSError as err:
        raise InfraError(f"cannot read {elf}: {err.strerror}") from None
    return _symbols(str(elf.resolve()), st.st_mtime_ns, st.st_size)


@functools.lru_cache(maxsize=8)
def _symbols(path: str, _mtime: int, _size: int) -> Symbols:
    elf = Path(path)
    secs = tuple(sections(elf))
    code = [s for s in secs if s.executable and s.size]
    out = proc.capture(["nm", "-S", "--defined-only", path], timeout=300)
    funcs: list[Function] = []
    stext = entry = None
    for line in out.splitlines():
        parts = line.split()
        # "ADDRESS SIZE TYPE NAME", or "ADDRESS TYPE NAME" for a symbol without a size (nm prints the size,
        # zero-padded to the address's width, only when there is one)
        if len(parts) == 3 and parts[2] == STEXT:
            stext = int(parts[0], 16)
        if len(parts) >= 3 and parts[-1] == ENTRY_TEXT:
            entry = int(parts[0], 16)
        if len(parts) != 4 or len(parts[1]) != len(parts[0]):
            continue
        try:
            address, size = int(parts[0], 16), int(parts[1], 16)
        except ValueError:
            continue
        kind, name = parts[2], parts[3]
        if name == STEXT:
            stext = address
        if size == 0:
            continue
        if kind in ("t", "T") or (kind in ("w", "W") and any(s.holds(address) for s in code)):
            funcs.append(Function(name, address, size, kind))
    return Symbols(tuple(funcs), secs, stext, entry)


def functions_by_address(syms: Symbols) -> dict[int, int]:
    """Address -> size of the function there (the largest when aliases share the address)."""
    at: dict[int, int] = {}
    for f in syms.functions:
        at[f.address] = max(at.get(f.address, 0), f.size)
    return at


def measure(elf: Path) -> dict[str, int | None]:
    """Code size of a linked ELF, in bytes:
    - functions_size: the sizes of its function symbols summed, each address once;
    - functions: how many addresses that is;
    - text_span: the part of the .text section the compiled code occupies, from _stext (else the lowest function
      in .text) to the end (address + size) of the last function in .text below the 2 MiB boundary the linker
      script starts the entry text at (ENTRY_ALIGN); not _etext, which the kernel pads like the section;
    - vmlinux_text: the size of the .text section itself, padded (2 MiB on x86-64 kernels): for reference only.
    None for what the file cannot tell: no function symbols (a stripped file), no .text section or no function in it."""
    syms = symbols(elf)
    at = functions_by_address(syms)
    text = syms.section(TEXT)
    span = None
    if text is not None:
        limit = syms.entry_text & -ENTRY_ALIGN if syms.entry_text is not None and text.holds(syms.entry_text) else None
        ends = [f.end for f in syms.functions if text.holds(f.address) and (limit is None or f.address < limit)]
        if ends:
            first = min(f.address for f in syms.functions if text.holds(f.address))
            start = syms.stext if syms.stext is not None and text.holds(syms.stext) else first
            span = max(ends) - min(start, first)
    return {"functions_size": sum(at.values()) if at else None, "functions": len(at) if at else None, "text_span": span,
            "vmlinux_text": text.size if text is not None else None}


def vmlinux_sizes(out: Path) -> dict[str, int | None]:
    """measure() of the build's vmlinux and the size of its bzImage; None for what is not there."""
    vmlinux, bz = out / "vmlinux", out / "arch" / "x86" / "boot" / "bzImage"
    sizes: dict[str, int | None] = dict.fromkeys(VMLINUX_KEYS) | {"version": SIZES_VERSION}
    if vmlinux.is_file():
        sizes |= measure(vmlinux)
    if bz.is_file():
        sizes["bzimage"] = bz.stat().st_size
    return sizes


def complete(out: Path, sizes: dict | None) -> dict:
    """A build's recorded sizes with what a build made before kpgo measured it (functions_size, text_span,
    bzimage) computed now from the build directory `out`, when its vmlinux is still there, and text_span
    measured again when it was recorded under an older rule (SIZES_VERSION); what cannot be computed stays as it
    was (absent: the report shows "–"). Nothing is written: build.json's key and bytes stay."""
    sizes = dict(sizes or {})
    stale = sizes.get("version", 1) < SIZES_VERSION
    if not stale and all(k in sizes for k in VMLINUX_KEYS):
        return sizes
    try:
        now = vmlinux_sizes(out)
    except InfraError:
        return sizes
    fresh = {k: v for k, v in now.items() if k != "version" and v is not None}
    if stale and "text_span" in fresh:
        sizes |= {"text_span": fresh["text_span"], "version": SIZES_VERSION}
    return sizes | {k: v for k, v in fresh.items() if k not in sizes}


def function_sections(elf: Path) -> dict[str, frozenset[str]]:
    """Function name -> the sections that define a function of that name, from `objdump -t` (a relocatable's
    sections are what a linker script places: kpgo.kernel.order reads vmlinux.o's). Names shared by static functions
    of several objects map to every section that holds one."""
    out = proc.capture(["objdump", "-t", str(elf)], timeout=300)
    found: dict[str, set[str]] = {}
    for line in out.splitlines():
        # "ADDRESS FLAGS SECTION<TAB>SIZE [.hidden] NAME"; FLAGS is 7 columns, F in its 7th for a function
        left, tab, right = line.partition("\t")
        head = left.split(" ", 1)
        if not tab or len(head) != 2 or len(head[1]) < 8 or head[1][6] != "F":
            continue
        section, names = left.split()[-1], right.split()
        if len(names) >= 2:
            found.setdefault(names[-1], set()).add(section)
    return {k: frozenset(v) for k, v in found.items()}
