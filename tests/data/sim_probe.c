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
 *   indirect N  N >= 1: N iterations of an indirect call (call *%rax) to a ret, a direct call to a
 *               ret and an indirect jump (jmp *%rax); a loop of one block closed by jmp *%rax, N
 *               iterations; N of an indirect jump across a page boundary (see indirect_probe):
 *               17*N + 9; taken 9*N - 2; indirect branches 4*N (direct calls and rets are none);
 *               every other mode executes no indirect branch in its window
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

/* A function of its own (calls in inline asm would overwrite the caller's red zone), in three
 * loops of N iterations. Per iteration of the first: 9 instructions (mov, call*, ret, call, ret,
 * mov, jmp*, dec, jnz), 6 taken branches (every transfer; the last jnz falls through), 2 indirect
 * (call*, jmp*); of the second, a loop of one block (account()'s same-segment path): 4, 1 taken
 * (its back edge; the last jump goes to its fall-through, 7f), 1 indirect; of the third: 4 (mov,
 * jmp*, dec, jnz), 2 taken (the last jnz falls through), 1 indirect: a jmp* whose ModRM byte ends
 * a page and whose displacement starts the next, so QEMU's translator sees it twice (the
 * page-crossing phantom, docs/SIM.md) and it must be counted once. Before the first loop: the
 * open marker, mov, lea, lea; between the first and the second: mov, lea, lea; between the
 * second and the third: mov, jmp (taken). */
void indirect_probe(unsigned long n);
extern const char indirect_cross[];
__asm__(".pushsection .text\n"
        ".p2align 12\n"
        ".fill 4091, 1, 0xcc\n" /* int3, never run: puts the jmp* below across a page boundary */
        ".globl indirect_cross\n"
        "indirect_cross:\n\t"
        "mov %r8, %rax\n\t"                  /* 3 bytes: page offsets 4091-4093 */
        ".byte 0xff, 0xa0, 0, 0, 0, 0\n\t"   /* jmp *0x0(%rax), disp32: ff a0 | 00 00 00 00 */
        "ud2\n"
        "indirect_back:\n\t"
        "dec %rcx\n\t"
        "jnz indirect_cross\n\t"
        "nopl 0x6b706702(%rax)\n\t" /* close */
        "ret\n"
        ".globl indirect_probe\n"
        ".type indirect_probe, @function\n"
        "indirect_probe:\n\t"
        "lea indirect_back(%rip), %rax\n\t"  /* the third loop's target, in memory (before the window) */
        "lea indirect_slot(%rip), %r8\n\t"
        "mov %rax, (%r8)\n\t"
        "nopl 0x6b706701(%rax)\n\t" /* open */
        "mov %rdi, %rcx\n\t"
        "lea 3f(%rip), %rdx\n\t"
        "lea 4f(%rip), %rsi\n"
        "1:\n\t"
        "mov %rdx, %rax\n\t"
        "call *%rax\n\t"
        "call 5f\n\t"
        "mov %rsi, %rax\n\t"
        "jmp *%rax\n\t"
        "ud2\n" /* not reached: the jump's fall-through, so the jump is a taken branch */
        "4:\n\t"
        "dec %rcx\n\t"
        "jnz 1b\n\t"
        "mov %rdi, %rcx\n\t"
        "lea 6f(%rip), %rdx\n\t"
        "lea 7f(%rip), %rsi\n"
        "6:\n\t"
        "mov %rdx, %rax\n\t"
        "dec %rcx\n\t"
        "cmovz %rsi, %rax\n\t"
        "jmp *%rax\n"
        "7:\n\t"
        "mov %rdi, %rcx\n\t"
        "jmp indirect_cross\n"
        "3:\n\t"
        "ret\n"
        "5:\n\t"
        "ret\n"
        ".size indirect_probe, .-indirect_probe\n"
        ".popsection\n"
        ".pushsection .bss\n"
        ".p2align 3\n"
        "indirect_slot:\n\t"
        ".quad 0\n"
        ".popsection");

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
    for (const volatile char *p = indirect_cross; p < indirect_cross + 2 * 4096; p += 4096) {
        (void)*p;
    }
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: sim_probe loop|syscalls|bigcode|straight|rep|empty|indirect N\n");
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
    } else if (!strcmp(argv[1], "indirect") && n >= 1) {
        indirect_probe(n);
    } else {
        fprintf(stderr, "sim_probe: unknown mode %s\n", argv[1]);
        return 2;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    printf("sim_probe %s %lu guest_seconds=%.4f\n", argv[1], n,
           (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9);
    return 0;
}
