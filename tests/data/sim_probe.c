/*
 * sim_probe MODE N: guest programs with a known instruction footprint between kpgosim's window
 * markers (tests/test_sim_vm.py, benchmarks/bench_sim.py). Each run opens and closes exactly one
 * window. Counted user instructions (the open marker is counted, the close marker is not) and
 * user taken branches (each loop's back edge is taken every iteration but the last):
 *   loop N      4 per iteration, tiny code:              4*N + 2; taken N - 1 (one block)
 *   syscalls N  raw getppid syscalls (kernel-heavy):     4*N + 2 user (mov eax; syscall; dec; jnz);
 *               taken 2*N - 1 (each syscall enters the kernel, each jnz but the last)
 *   bigcode N   64 KiB of straight-line code, N sweeps:  16386*N + 2, every L1i line of it missing
 *               in a 32 KiB LRU cache (a cyclic sweep of twice the capacity); taken N - 1 although
 *               each sweep runs as 32+ blocks (page and block-size limits: fall-throughs)
 *   straight N  80 KiB of straight-line code, N sweeps, its 5-byte instructions crossing page
 *               boundaries (QEMU's page-crossing quirk): 16386*N + 2; taken N - 1
 *   rep N       one rep stosb of N bytes, N <= 1 MiB (TCG: a block per iteration, jumping back
 *               to itself): taken 0
 *   empty N     open and close at once (N ignored): the window's fixed overhead; taken 0
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

static void straight(unsigned long n)
{
    unsigned long a = 0;
    /* 5-byte instructions: 4096 is not a multiple of 5, so most page boundaries fall inside one. */
    __asm__ __volatile__(OPEN
                         "mov %[n], %%rcx\n"
                         "1:\n\t"
                         ".globl straight_start\n"
                         "straight_start:\n\t"
                         ".rept 16384\n\t"
                         "add $0x01020304, %%eax\n\t" /* 5 bytes (05 04 03 02 01): 80 KiB in all */
                         ".endr\n\t"
                         "dec %%rcx\n\t"
                         "jnz 1b\n\t" CLOSE
                         : [a] "+a"(a)
                         : [n] "r"(n)
                         : "rcx", "cc", "memory");
}

#define REP_BYTES (1 << 20)
static char rep_buf[REP_BYTES];

static void rep_stos(unsigned long n)
{
    if (n > REP_BYTES) {
        n = REP_BYTES;
    }
    __asm__ __volatile__(OPEN
                         "mov %[n], %%rcx\n\t"
                         "mov %[buf], %%rdi\n\t"
                         "xor %%eax, %%eax\n\t"
                         "rep stosb\n\t" CLOSE
                         :
                         : [n] "r"(n), [buf] "r"(rep_buf)
                         : "rax", "rcx", "rdi", "cc", "memory");
}

static void empty(void)
{
    __asm__ __volatile__(OPEN CLOSE ::: "memory");
}

extern const char bigcode_start[], straight_start[];

/* Map every page of the big code before the window: a page fault would put a kernel handler
 * between two blocks of it (and, on an instruction fetch, count one instruction twice;
 * docs/SIM.md). */
static void touch_code(void)
{
    for (const volatile char *p = bigcode_start; p < bigcode_start + 16384 * 4 + 4096; p += 4096) {
        (void)*p;
    }
    for (const volatile char *p = straight_start; p < straight_start + 16384 * 5 + 4096; p += 4096) {
        (void)*p;
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: sim_probe loop|syscalls|bigcode|straight|rep|empty N\n");
        return 2;
    }
    unsigned long n = strtoul(argv[2], 0, 0);
    /* Let the parent shell return from fork() and block in wait() first: the window is
     * system-wide, and its few hundred user instructions would land in it. */
    struct timespec pause = { 0, 50 * 1000 * 1000 };
    nanosleep(&pause, 0);
    touch_code();
    if (!strcmp(argv[1], "rep")) {
        memset(rep_buf, 1, sizeof(rep_buf));  /* likewise for the pages rep stosb writes */
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    if (!strcmp(argv[1], "loop")) {
        loop(n);
    } else if (!strcmp(argv[1], "syscalls")) {
        syscalls(n);
    } else if (!strcmp(argv[1], "bigcode")) {
        bigcode(n);
    } else if (!strcmp(argv[1], "straight")) {
        straight(n);
    } else if (!strcmp(argv[1], "rep")) {
        rep_stos(n);
    } else if (!strcmp(argv[1], "empty")) {
        empty();
    } else {
        fprintf(stderr, "sim_probe: unknown mode %s\n", argv[1]);
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("sim_probe %s %lu guest_seconds=%.4f\n", argv[1], n,
           (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
