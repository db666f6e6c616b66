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
for a in "$@"; do
  [ "$prev" = "-o" ] && out=$a
  prev=$a
done
if [ "${KPGO_REUSE:-}" = zero ] && [ -n "$out" ] && [ -e "${out%.o}.kpgo-zero" ]; then
  for a in "$@"; do
    shift
    case $a in -fdump-*) ;; *) set -- "$@" "$a" ;; esac
  done
  exec ccache "$cc" "$@"
fi
[ "${KPGO_REUSE:-}" = all ] && exec ccache "$cc" "$@"
exec "$cc" "$@"
