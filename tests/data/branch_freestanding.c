/*
 * A freestanding program (no libc, code model "large": no address is encoded in fewer than 64 bits) that calls
 * hot_fn N times and cold_fn once every 1000 calls between kpgosim's window markers. tests/test_branches.py links
 * it twice, at a user address to run under qemu-x86_64 and at the kernel's (0xffffffff81000000, with a `_text`
 * symbol, as vmlinux has): the two differ by a constant offset, so the user run's branch records, shifted, are
 * the records of the kernel-linked file, a vmlinux-like ELF to check the kernel form of the outputs with.
 */
#define NOINLINE __attribute__((noinline, noclone, used))

__asm__(".text\n"
        ".globl _text\n"
        "_text:\n");

volatile unsigned long sink;

NOINLINE unsigned long hot_fn(unsigned long x)
{
    unsigned long acc = x;
    for (int k = 0; k < 16; k++) {
        acc = acc * 6364136223846793005UL + (acc >> 7);
        __asm__ __volatile__("" : "+r"(acc));
    }
    return acc;
}

NOINLINE unsigned long cold_fn(unsigned long x)
{
    return x ^ (x >> 3);
}

NOINLINE void run(unsigned long n)
{
    unsigned long acc = 0;
    __asm__ __volatile__("nopl 0x6b706701(%%rax)" ::: "memory");
    for (unsigned long i = 0; i < n; i++) {
        acc += hot_fn(i);
        if (i % 1000 == 0) {
            acc += cold_fn(i);
        }
    }
    __asm__ __volatile__("nopl 0x6b706702(%%rax)" ::: "memory");
    sink = acc;
}

void _start(void)
{
    run(100000);
    __asm__ __volatile__("mov $60, %%eax\n\t"
                         "xor %%edi, %%edi\n\t"
                         "syscall" ::: "memory");
    __builtin_unreachable();
}
