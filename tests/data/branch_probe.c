/*
 * branch_probe MODE N: guest programs of known control flow between kpgosim's window markers, for the branch
 * records (tests/test_branches.py). Each run opens and closes exactly one window. Recorded (user side):
 *   loop N      a loop of one block, N iterations: its back edge N - 1 times, nothing else
 *   calls N     chain_a -> chain_b -> chain_c, N times from the driver loop: each call edge exactly N times
 *               (and each ret N times; the driver's back edge N - 1 times)
 *   straight N  4 KiB of straight-line code (several TCG blocks, all fall-throughs): no taken branch at all
 *   hot N       hot_fn called N times, cold_fn once every 1000 calls: the sampled profile names hot_fn
 *   many N      5000 distinct jumps (each over a nop), swept N times: 5000 edges of N each, and the sweep's back
 *               edge N - 1 times (more keys than the plugin's first index holds: it grows)
 *   thunks N    N indirect calls through a retpoline built as x86 kernels build them (`call
 *               __x86_indirect_thunk_array`, which reaches the target with a ret through __x86_return_thunk), to
 *               target_b when the count left is a multiple of 4, else to target_a; each target returns through the
 *               return thunk (`jmp __x86_return_thunk`)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "branch_hot.h"

static void loop(unsigned long n)
{
    __asm__ __volatile__("nopl 0x6b706701(%%rax)\n\t"
                         "mov %[n], %%rcx\n"
                         "1:\n\t"
                         "add $1, %%rax\n\t"
                         "dec %%rcx\n\t"
                         "jnz 1b\n\t"
                         "nopl 0x6b706702(%%rax)\n\t"
                         :
                         : [n] "r"(n)
                         : "rax", "rcx", "cc", "memory");
}


NOINLINE void chain_c(unsigned long i)
{
    sink += i;
    __asm__ __volatile__("" ::: "memory");  /* no tail call, no merging */
}

NOINLINE void chain_b(unsigned long i)
{
    chain_c(i);
    __asm__ __volatile__("" ::: "memory");
}

NOINLINE void chain_a(unsigned long i)
{
    chain_b(i);
    __asm__ __volatile__("" ::: "memory");
}

NOINLINE void calls(unsigned long n)
{
    OPEN();
    for (unsigned long i = 0; i < n; i++) {
        chain_a(i);
    }
    CLOSE();
}

static void straight(void)
{
    __asm__ __volatile__("nopl 0x6b706701(%%rax)\n\t"
                         ".rept 1024\n\t"
                         "add $1, %%rax\n\t" /* 4 bytes */
                         ".endr\n\t"
                         "nopl 0x6b706702(%%rax)\n\t"
                         :
                         :
                         : "rax", "cc", "memory");
}

static void many(unsigned long n)
{
    __asm__ __volatile__("nopl 0x6b706701(%%rax)\n\t"
                         "mov %[n], %%rcx\n"
                         "1:\n\t"
                         ".rept 5000\n\t"
                         "jmp 2f\n\t"
                         "nop\n"
                         "2:\n\t"
                         ".endr\n\t"
                         "dec %%rcx\n\t"
                         "jnz 1b\n\t"
                         "nopl 0x6b706702(%%rax)\n\t"
                         :
                         : [n] "r"(n)
                         : "rcx", "cc", "memory");
}

/* thunk_calls(n): the thunks mode, all of it in assembly (a call from inline assembly would clobber the red zone). */
void thunk_calls(unsigned long n);
__asm__(".text\n"
        ".p2align 5\n"
        ".globl __x86_indirect_thunk_array\n"
        ".type __x86_indirect_thunk_array, @function\n"
        "__x86_indirect_thunk_array:\n\t"
        "call 1f\n\t"
        "int3\n"
        "1:\n\t"
        "mov %rax, (%rsp)\n\t"
        "jmp __x86_return_thunk\n"
        ".size __x86_indirect_thunk_array, .-__x86_indirect_thunk_array\n"
        ".p2align 5\n"
        ".globl __x86_return_thunk\n"
        ".type __x86_return_thunk, @function\n"
        "__x86_return_thunk:\n\t"
        "ret\n\t"
        "int3\n"
        ".size __x86_return_thunk, .-__x86_return_thunk\n"
        ".p2align 4\n"
        ".type target_a, @function\n"
        "target_a:\n\t"
        "add $1, %rdx\n\t"
        "jmp __x86_return_thunk\n"
        ".size target_a, .-target_a\n"
        ".p2align 4\n"
        ".type target_b, @function\n"
        "target_b:\n\t"
        "add $2, %rdx\n\t"
        "jmp __x86_return_thunk\n"
        ".size target_b, .-target_b\n"
        ".p2align 4\n"
        ".globl thunk_calls\n"
        ".type thunk_calls, @function\n"
        "thunk_calls:\n\t"
        "nopl 0x6b706701(%rax)\n\t"
        "mov %rdi, %rcx\n"
        "2:\n\t"
        "lea target_a(%rip), %rax\n\t"
        "test $3, %rcx\n\t"
        "jnz 3f\n\t"
        "lea target_b(%rip), %rax\n"
        "3:\n\t"
        "call __x86_indirect_thunk_array\n\t"
        "dec %rcx\n\t"
        "jnz 2b\n\t"
        "nopl 0x6b706702(%rax)\n\t"
        "ret\n"
        ".size thunk_calls, .-thunk_calls\n");

NOINLINE void hot(unsigned long n)
{
    HOT_CALLS(n);
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: branch_probe loop|calls|straight|hot|many|thunks N\n");
        return 2;
    }
    unsigned long n = strtoul(argv[2], NULL, 0);
    if (!strcmp(argv[1], "loop")) {
        loop(n);
    } else if (!strcmp(argv[1], "calls")) {
        calls(n);
    } else if (!strcmp(argv[1], "straight")) {
        straight();
    } else if (!strcmp(argv[1], "many")) {
        many(n);
    } else if (!strcmp(argv[1], "thunks")) {
        thunk_calls(n);
    } else if (!strcmp(argv[1], "hot")) {
        hot(n);
    } else {
        fprintf(stderr, "branch_probe: unknown mode %s\n", argv[1]);
        return 2;
    }
    return 0;
}
