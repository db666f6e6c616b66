/*
 * sim_probe MODE N: guest programs with a known instruction footprint between kpgosim's window
 * markers (tests/test_sim_vm.py, benchmarks/bench_sim.py). Each run opens and closes exactly one
 * window. Counted user instructions (the open marker is counted, the close marker is not):
 *   loop N      4 per iteration, tiny code:              4*N + 2
 *   syscalls N  raw getppid syscalls (kernel-heavy):     4*N + 2 user (mov eax; syscall; dec; jnz)
 *   bigcode N   64 KiB of straight-line code, N sweeps:  16386*N + 2, every L1i line of it missing
 *               in a 32 KiB LRU cache (a cyclic sweep of twice the capacity)
 * Prints "sim_probe MODE N guest_seconds=S" (guest clock around the window) on stdout.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define OPEN "nopl 0x6b706701(%%rax)\n\t"
#define CLOSE "nopl 0x6b706702(%%rax)\n\t"

static void loop(unsigned long n)
{
    unsigned long a = 0, b = 0;
    __asm__ __volatile__(OPEN
                         "mov %[n], %%rcx\n"
                         "1:\n\t"
                         "add $1, %[a]\n\t"
                         "add $3, %[b]\n\t"
                         "dec %%rcx\n\t"
                         "jnz 1b\n\t" CLOSE
                         : [a] "+r"(a), [b] "+r"(b)
                         : [n] "r"(n)
                         : "rcx", "cc", "memory");
}

static void syscalls(unsigned long n)
{
    __asm__ __volatile__(OPEN
                         "mov %[n], %%r12\n"
                         "1:\n\t"
                         "mov $110, %%eax\n\t" /* getppid */
                         "syscall\n\t"
                         "dec %%r12\n\t"
                         "jnz 1b\n\t" CLOSE
                         :
                         : [n] "r"(n)
                         : "rax", "rcx", "r11", "r12", "cc", "memory");
}

static void bigcode(unsigned long n)
{
    unsigned long a = 0;
    /* Aligned so that no instruction crosses a page (one that does is counted twice when an
     * interrupt lands between its two blocks; docs/SIM.md): the 2-byte NOP before the window
     * puts the 10 bytes of marker + mov on a 4-byte boundary; padding inside would be counted. */
    __asm__ __volatile__(".p2align 2\n\t"
                         "xchg %%ax, %%ax\n\t" OPEN
                         "mov %[n], %%rcx\n"
                         "1:\n\t"
                         ".globl bigcode_start\n"
                         "bigcode_start:\n\t"
                         ".rept 16384\n\t"
                         "add $1, %[a]\n\t" /* 4 bytes (48 83 c0 01): 64 KiB in all */
                         ".endr\n\t"
                         "dec %%rcx\n\t"
                         "jnz 1b\n\t" CLOSE
                         : [a] "+a"(a)
                         : [n] "r"(n)
                         : "rcx", "cc", "memory");
}

extern const char bigcode_start[];

/* Map every page of the big code before the window: a page fault on an instruction fetch would
 * put a kernel handler between two blocks of it (and, with the fault, count one instruction
 * twice; docs/SIM.md). */
static void touch_bigcode(void)
{
    for (const volatile char *p = bigcode_start; p < bigcode_start + 16384 * 4 + 4096; p += 4096) {
        (void)*p;
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: sim_probe loop|syscalls|bigcode N\n");
        return 2;
    }
    unsigned long n = strtoul(argv[2], 0, 0);
    /* Let the parent shell return from fork() and block in wait() first: the window is
     * system-wide, and its few hundred user instructions would land in it. */
    struct timespec pause = { 0, 50 * 1000 * 1000 };
    nanosleep(&pause, 0);
    touch_bigcode();
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!strcmp(argv[1], "loop")) {
        loop(n);
    } else if (!strcmp(argv[1], "syscalls")) {
        syscalls(n);
    } else if (!strcmp(argv[1], "bigcode")) {
        bigcode(n);
    } else {
        fprintf(stderr, "sim_probe: unknown mode %s\n", argv[1]);
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("sim_probe %s %lu guest_seconds=%.4f\n", argv[1], n,
           (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
