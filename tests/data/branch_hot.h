/*
 * What branch_probe.c's `hot` mode and branch_freestanding.c run between kpgosim's window markers: hot_fn called N
 * times, cold_fn once every 1000 calls, so a sampled profile names hot_fn (tests/test_branches.py, tests/test_afdo.py).
 */
#define OPEN() __asm__ __volatile__("nopl 0x6b706701(%%rax)" ::: "memory")
#define CLOSE() __asm__ __volatile__("nopl 0x6b706702(%%rax)" ::: "memory")
#define NOINLINE __attribute__((noinline, noclone, used))

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

/* The body of the caller (branch_probe's hot, branch_freestanding's run): one window around the calls. */
#define HOT_CALLS(n)                                  \
    do {                                              \
        unsigned long acc = 0;                        \
        OPEN();                                       \
        for (unsigned long i = 0; i < (n); i++) {     \
            acc += hot_fn(i);                         \
            if (i % 1000 == 0) {                      \
                acc += cold_fn(i);                    \
            }                                         \
        }                                             \
        CLOSE();                                      \
        sink = acc;                                   \
    } while (0)
