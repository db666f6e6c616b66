/*
 * A freestanding program (no libc, code model "large": no address is encoded in fewer than 64 bits) that calls
 * hot_fn N times and cold_fn once every 1000 calls between kpgosim's window markers. tests/test_branches.py links
 * it twice, at a user address to run under qemu-x86_64 and at the kernel's (0xffffffff81000000, with a `_text`
 * symbol, as vmlinux has): the two differ by a constant offset, so the user run's branch records, shifted, are
 * the records of the kernel-linked file, a vmlinux-like ELF to check the kernel form of the outputs with.
 */
#include "branch_hot.h"

__asm__(".text\n"
        ".globl _text\n"
        "_text:\n");

NOINLINE void run(unsigned long n)
{
    HOT_CALLS(n);
}

void _start(void)
{
    run(100000);
    __asm__ __volatile__("mov $60, %%eax\n\t"
                         "xor %%edi, %%edi\n\t"
                         "syscall" ::: "memory");
    __builtin_unreachable();
}
