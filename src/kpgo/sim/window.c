/*
 * kpgo-window open|close: open or close kpgosim's counting window from a shell or the guest agent.
 *
 * Built static and without libc (-nostdlib): what runs between the marker and the process's
 * end is counted in the window, so the program does nothing but execute the marker and exit
 * (a few dozen user instructions; exec/exit in the kernel remain). The markers are plain NOPs
 * without the plugin, so the program is harmless anywhere on x86-64.
 */

static long sys3(long nr, long a, long b, long c)
{
    long ret;
    __asm__ __volatile__("syscall" : "=a"(ret) : "a"(nr), "D"(a), "S"(b), "d"(c) : "rcx", "r11", "memory");
    return ret;
}

static __attribute__((noreturn)) void sys_exit(int code)
{
    for (;;) {
        sys3(231 /* exit_group */, code, 0, 0);
    }
}

static int same(const char *a, const char *b)
{
    while (*a && *a == *b) {
        a++, b++;
    }
    return *a == *b;
}

/* Entered from _start with the initial stack: argc, argv[0], argv[1], ... */
__attribute__((noreturn, used)) void window_main(long *sp)
{
    long argc = sp[0];
    char **argv = (char **)(sp + 1);
    if (argc == 2 && same(argv[1], "open")) {
        __asm__ __volatile__("nopl 0x6b706701(%%rax)" ::: "memory");
        sys_exit(0);
    }
    if (argc == 2 && same(argv[1], "close")) {
        __asm__ __volatile__("nopl 0x6b706702(%%rax)" ::: "memory");
        sys_exit(0);
    }
    static const char usage[] = "usage: kpgo-window open|close\n";
    sys3(1 /* write */, 2, (long)usage, sizeof(usage) - 1);
    sys_exit(2);
}

__asm__(".globl _start\n"
        "_start:\n"
        "  xor %ebp, %ebp\n"
        "  mov %rsp, %rdi\n"
        "  and $-16, %rsp\n"
        "  call window_main\n");
