#!/bin/sh
# kpgo's compiler for kernel builds (make CC="sh reuse-cc.sh"): reuse unchanged objects through ccache.
#   KPGO_REUSE=zero  only objects whose installed .gcda kpgo marked all-zero (X.kpgo-zero beside X.o) do,
#                    without the -fdump-* options: ccache refuses dump options, and the proof reads dumps of
#                    objects with a non-zero profile only, which are always compiled here, with their dump
# Anything else: plain gcc. ccache hashes the .gcda beside the object under -fprofile-use (docs/ARCHITECTURE.md).
# KPGO_CC: the variant's GCC when it is not the plain gcc (e.g. gcc-11; kpgo.kernel.kbuild._make_vars).
cc=${KPGO_CC:-gcc}
out=
prev=
incbin=
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  case $a in *.c|*.S) [ "$prev" != "-o" ] && grep -qs '\.incbin' "$a" && incbin=1 ;; esac
  prev=$a
done
# A source that pulls a file in with .incbin (the compressed kernel in arch/x86/boot/compressed/piggy.S, the config in
# kernel/configs.c, the initramfs) is always compiled: ccache's depend mode does not see that file, and gave a bzImage
# the kernel of an earlier build (tests/test_reuse.py).
[ -n "$incbin" ] && exec "$cc" "$@"
# ccache (4.7) refuses -fprofile-partial-training as an unknown -fprofile option, so such a compile goes through
# KPGO_PT_CC, a compiler that adds the flag itself (its name and `-v` output give ccache another key: kbuild).
if [ "${KPGO_REUSE:-}" = zero ] && [ -n "$out" ] && [ -e "${out%.o}.kpgo-zero" ]; then
  pt=
  for a in "$@"; do
    shift
    case $a in -fdump-*) ;; -fprofile-partial-training) pt=1 ;; *) set -- "$@" "$a" ;; esac
  done
  if [ -z "$pt" ]; then exec ccache "$cc" "$@"; fi
  if [ -n "${KPGO_PT_CC:-}" ]; then CCACHE_COMPILERCHECK='%compiler% -v' exec ccache "$KPGO_PT_CC" "$@"; fi
  exec "$cc" -fprofile-partial-training "$@"
fi
[ "${KPGO_REUSE:-}" = all ] && exec ccache "$cc" "$@"
exec "$cc" "$@"
