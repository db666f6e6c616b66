/*
 * kpgosim: simulated CPU counters for a guest under QEMU TCG (plugin API v1, QEMU 7.2 and later).
 *
 * Inside windows the guest opens and closes, counts per window, split kernel/user by the guest
 * virtual address of the code (x86-64: upper canonical half = kernel):
 *   - guest instructions executed,
 *   - simulated L1 instruction-cache accesses and misses (set-associative, true LRU),
 *   - simulated instruction-TLB accesses and misses (set-associative, true LRU),
 *   - taken branches: block executions whose successor on the same vCPU does not start at their
 *     fall-through address (counted on the side of the block that branched; see account()),
 *   - indirect branches: executed indirect calls and jumps (opcode ff /2../5, decoded at
 *     translation time; not ret, and not a retpoline's thunk, whose transfer is a ret).
 * Every closed window is one record of the JSON report, which is rewritten atomically (tmp +
 * rename) at each close and at exit. See docs/SIM.md.
 *
 * Speed: the work is done once per translated block (TB): its instruction count, side, fall-through
 * address, whether it ends in an indirect branch and the ordered distinct cache lines and pages it
 * spans are precomputed, so each block execution costs one callback that returns at once outside
 * a window and otherwise compares one address and replays a few LRU accesses.
 *
 * Window markers, plain multi-byte NOPs in any ring and on any x86-64 CPU (plugin or not):
 *   open : nopl 0x6b706701(%rax)   bytes 0f 1f 80 01 67 70 6b
 *   close: nopl 0x6b706702(%rax)   bytes 0f 1f 80 02 67 70 6b
 * QEMU 7.2's plugin API cannot read guest registers, so the markers are recognised by their bytes
 * at translation time and switched by an instruction callback.
 *
 * Arguments (-plugin libkpgosim.so,KEY=VALUE,...):
 *   out=PATH          JSON report (default: printed through qemu_plugin_outs at exit)
 *   l1i_size=BYTES    32768 (k/K, m/M suffixes)   l1i_assoc=N 8   l1i_line=BYTES 64
 *   itlb_entries=N    64    itlb_assoc=N 4    itlb_page=BYTES 4096 (user code)
 *   itlb_kpage=BYTES  2M (kernel code: x86-64 maps kernel text with 2 MiB pages; 4k for 4 KiB)
 * Beside it, the same iTLB with all code on 4 KiB pages is counted as itlb_4k_* (what code layout does
 * to a kernel whose text is not on large pages, with the same accesses).
 *   warm=on|off       off: caches start empty at each window; on: simulated outside windows too
 *   always=on|off     off: on opens one window at start-up (no markers needed)
 * Branch records (off unless branches= is given; the report above is the same either way):
 *   branches=PATH     binary records file (kpgo.branches reads it), rewritten at each close and at exit
 *   branch_side=kernel|user  kernel: the side whose branches are recorded
 *   branch_period=N   one 32-entry branch stack sampled every N recorded taken branches (LBR-like)
 *   branch_entries=N  bound of distinct edges and of distinct ranges per vCPU (each table)
 *   branch_stacks=N   bound of distinct sampled stacks per vCPU
 *   build_id=HEX      the GNU build id of the binary the addresses belong to, copied into the file
 *   thunk=LO-HI       hex addresses [LO, HI) of retpoline thunks; return_thunk=LO-HI of return thunks
 *                     (repeatable, 16 at most): a branch through one is recorded as the branch it
 *                     stands for (enum thunk)
 */
#include <glib.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <qemu-plugin.h>

QEMU_PLUGIN_EXPORT int qemu_plugin_version = QEMU_PLUGIN_VERSION;

#define FORMAT 5
#define SMALL_PAGE_SHIFT 12  /* the second iTLB's pages: 4 KiB */
#define MARK_LEN 7
#define GUEST_PAGE 4096  /* x86 TARGET_PAGE_SIZE: the translator's unit, not the simulated iTLB page */
#define X86_MAX_INSN 15   /* bytes */
#define NO_ADDR UINT64_MAX  /* no such address (no block starts there) */
static const uint8_t mark_prefix[] = { 0x0f, 0x1f, 0x80 };
static const uint8_t mark_suffix[] = { 0x67, 0x70, 0x6b };
enum { OP_NONE = 0, OP_OPEN = 1, OP_CLOSE = 2 };
enum { USER = 0, KERNEL = 1 };

/* ---- configuration ---- */
static struct {
    uint64_t ic_size, ic_assoc, ic_line;
    uint64_t tlb_entries, tlb_assoc, tlb_page, tlb_kpage;
    bool warm, always;
    char *out;
} cfg = { 32768, 8, 64, 64, 4, 4096, 2 << 20, false, false, NULL };

static unsigned ic_sets, ic_line_shift, tlb_sets, tlb_shift[2];

/* ---- precomputed segments ----
 * A segment is a block, or the part of a block from a marker on. Its content (counts, lines,
 * pages) is all an execution needs, so equal contents are interned: retranslating the same code
 * (TB cache flushes, a second vCPU) reuses the segment and memory stays bounded by distinct code. */
struct line_ref { uint64_t tag, off; };          /* off: the set's first way in the cache array */
struct page_ref { uint64_t vtag, htag, off; };    /* off: the set's first way in the TLB array */

struct seg {
    uint32_t n_insns;
    uint16_t n_lines, n_pages;
    uint16_t side, op;
    uint32_t own_sets; /* each line and each page in a set of its own */
    uint32_t self_taken; /* 1 if running this segment again right after itself is a taken branch */
    uint32_t indirect;   /* 1 if its last instruction is an indirect call or jump */
    uint32_t kind;       /* enum bkind of its last instruction (branch records) */
    uint16_t n_small;    /* page_refs of the 4 KiB iTLB, after the pages */
    uint16_t thunk;      /* enum thunk of its first instruction (branch records); also keeps the fields
                          * above free of padding bytes, so equal contents hash equal */
    uint64_t vaddr;    /* of the first instruction */
    uint64_t end;      /* fall-through: the address right after the last instruction */
    uint64_t tail;     /* address of the last instruction: a taken branch's source */
    uint64_t phantom;  /* address of a possibly unexecuted last instruction, or NO_ADDR (see tb_trans) */
    uint64_t rep_at;   /* address of a last rep-prefixed string instruction, or NO_ADDR */
    uint64_t data[];  /* n_lines line_refs, n_pages page_refs, n_small page_refs; no padding, so bytes hash */
};

static inline const struct line_ref *seg_lines(const struct seg *s)
{
    return (const struct line_ref *)s->data;
}

static inline const struct page_ref *seg_pages(const struct seg *s)
{
    return (const struct page_ref *)(seg_lines(s) + s->n_lines);
}

static inline const struct page_ref *seg_small(const struct seg *s)
{
    return seg_pages(s) + s->n_pages;
}

static size_t seg_size(const struct seg *s)
{
    return sizeof(*s) + s->n_lines * sizeof(struct line_ref) + (s->n_pages + s->n_small) * sizeof(struct page_ref);
}

static guint seg_hash(gconstpointer p)
{
    const uint8_t *b = p;
    size_t n = seg_size(p);
    guint h = 2166136261u; /* FNV-1a: translation time only, not the hot path */
    for (size_t i = 0; i < n; i++) {
        h = (h ^ b[i]) * 16777619u;
    }
    return h;
}

static gboolean seg_equal(gconstpointer a, gconstpointer b)
{
    size_t n = seg_size(a);
    return n == seg_size(b) && !memcmp(a, b, n);
}

static GHashTable *segs;  /* interned segments (key = value), guarded by segs_lock */
static GMutex segs_lock;
static uint64_t translations, seg_bytes;

/* ---- per-vCPU state: touched only by its own vCPU thread, so no lock on the hot path ---- */
struct counters {
    uint64_t insns, blocks, ic_acc, ic_miss, tlb_acc, tlb_miss, taken, indirect, small_acc, small_miss;
};

struct tlb_ent { uint64_t v, h; };

struct vcpu {
    uint32_t gen;          /* window generation the counters belong to */
    const struct seg *last;  /* the last segment accounted in this window, NULL at its start */
    struct counters c[2];  /* [USER], [KERNEL] */
    uint64_t *ic;          /* ic_sets * assoc tags, MRU first, 0 = empty */
    struct tlb_ent *tlb;   /* tlb_sets * assoc, MRU first, h == 0 = empty */
    struct tlb_ent *small; /* the same for the 4 KiB iTLB */
    struct recorder *rec;  /* branch records, allocated at this vCPU's first recorded branch */
} __attribute__((aligned(64)));  /* own cache line: no false sharing between vCPU threads */

static struct vcpu *vcpus;
static int n_vcpus;

/* ---- windows: generation odd = open; changed under win_lock only ---- */
static uint32_t window_gen;
static GMutex win_lock;
static uint64_t opens, dup_opens, stray_closes;
static struct timespec t_open;
static GPtrArray *closed_windows;  /* JSON text of each closed window, in order */

/* ---- simulation ----
 * The MRU way is checked inline; the rest of a set (shift towards LRU) is out of line, so the
 * per-block path stays short: the plugin's cost is this path times blocks executed. */
static __attribute__((noinline)) uint64_t ic_lookup_rest(uint64_t *set, unsigned assoc, uint64_t tag)
{
    uint64_t prev = set[0];
    for (unsigned i = 1; i < assoc; i++) {
        uint64_t cur = set[i];
        set[i] = prev;
        if (cur == tag) {
            set[0] = tag;
            return 0;
        }
        prev = cur;
    }
    set[0] = tag;
    return 1;  /* miss */
}

static __attribute__((noinline)) uint64_t tlb_lookup_rest(struct tlb_ent *set, unsigned assoc, uint64_t v, uint64_t h)
{
    struct tlb_ent prev = set[0];
    for (unsigned i = 1; i < assoc; i++) {
        struct tlb_ent cur = set[i];
        set[i] = prev;
        if (cur.v == v && cur.h == h) {
            set[0] = cur;
            return 0;
        }
        prev = cur;
    }
    set[0].v = v;
    set[0].h = h;
    return 1;  /* miss */
}

/* The pages of one execution through one iTLB: its misses. */
static inline uint64_t tlb_walk(struct tlb_ent *tlb, const struct page_ref *p, unsigned n)
{
    uint64_t miss = 0;
    for (unsigned i = 0; i < n; i++) {
        struct tlb_ent *set = tlb + p[i].off;
        if (G_UNLIKELY(set[0].v != p[i].vtag || set[0].h != p[i].htag)) {
            miss += tlb_lookup_rest(set, cfg.tlb_assoc, p[i].vtag, p[i].htag);
        }
    }
    return miss;
}

/* ---- branch records ----
 * Aggregated, not a trace: per vCPU, two tables count taken-branch edges (from, to) and
 * fall-through ranges (start, end: from a branch target to the next taken branch's source), and a
 * third counts distinct 32-entry branch stacks sampled every rec.period recorded branches, as a
 * sampling PMU reads its LBR. Each table is an append-only entry array with an open-addressing
 * index; its bound is fixed at start-up, so memory and the file are bounded. At the bound a new
 * distinct key is not stored and its executions are counted as lost; known keys keep counting.
 * A vCPU thread is the only writer of its tables; the file writer (window close, another thread)
 * reads entries [0, n) after an acquire load of n, so it never sees a half-made entry. */
#define LBR_DEPTH 32
enum bkind { BK_NONE, BK_COND, BK_JUMP, BK_CALL, BK_RET, BK_SYSCALL, BK_SYSRET };
/* Speculation-mitigation thunks (retpolines, return thunks; their address ranges are arguments).
 * A kernel built with them calls `call __x86_indirect_thunk_r11` where the source says an indirect
 * call, and the thunk reaches the target with a ret: recorded as they run, every indirect call would
 * be a call of the thunk and its target a return's. A CPU that needs no retpoline runs `call *%r11`
 * at the same address (the kernel patches the call site at boot), and that is what the records say:
 * a call or jump into a thunk and the branch that leaves it are one branch, from the call site to
 * where the thunk went, of the call's kind; a jump into a return thunk and its ret are the ret. */
enum thunk { TH_NONE, TH_INDIRECT, TH_RETURN };
#define MAX_THUNKS 16
static struct { uint64_t lo, hi; uint16_t kind; } thunks[MAX_THUNKS];
static unsigned n_thunks;

static uint16_t thunk_of(uint64_t addr)
{
    for (unsigned i = 0; i < n_thunks; i++) {
        if (addr >= thunks[i].lo && addr < thunks[i].hi) {
            return thunks[i].kind;
        }
    }
    return TH_NONE;
}
#define REC_FORMAT 1
static const char rec_magic[8] = "KPGOBRN\0", rec_end[8] = "KPGOEND\0";

static struct {
    char *out;
    int side;
    uint64_t period, entries, stacks;
    uint8_t build_id[64];
    size_t build_id_len;
} rec = { NULL, KERNEL, 1024, 1 << 20, 1 << 16, { 0 }, 0 };

struct rec_ent { uint64_t a, b, count, kind; };
struct rec_stack { uint64_t n, br[2 * LBR_DEPTH], count; };  /* br: n (from, to) pairs, newest first */

struct rec_table {
    void *ent;       /* cap entries of `size` bytes, filled in order */
    uint32_t *slot;  /* at most half full, doubled as entries come; 0 = empty, else entry index + 1 */
    uint64_t n, cap, mask, lost;
    size_t size;
    uint64_t (*hash)(const void *entry);  /* of an entry's key, to re-index it */
};

struct recorder {
    struct rec_table edges, ranges, stacks;
    uint64_t from[LBR_DEPTH], to[LBR_DEPTH];  /* the ring of the last recorded branches */
    unsigned pos, depth;                      /* next slot of the ring, valid entries */
    uint64_t until;        /* recorded branches to the next sample */
    uint64_t range_start;  /* target of the last branch into the recorded side, or NO_ADDR */
    uint64_t branches, samples;
    uint64_t via_from;     /* the call or jump into a thunk being run, or NO_ADDR */
    uint32_t via_kind;     /* the kind the branch out of that thunk is recorded with */
};

static bool recording;  /* rec.out given */

static inline uint64_t mix(uint64_t h, uint64_t v)
{
    h = (h ^ v) * 0x9e3779b97f4a7c15ULL;
    return h ^ (h >> 29);
}

static uint64_t pair_hash(const void *entry)
{
    const struct rec_ent *e = entry;
    return mix(mix(0, e->a), e->b);
}

static uint64_t stack_hash(const void *entry)
{
    const struct rec_stack *e = entry;
    uint64_t h = mix(0, e->n);
    for (uint64_t i = 0; i < 2 * e->n; i++) {
        h = mix(h, e->br[i]);
    }
    return h;
}

/* The index starts small and doubles with the entries: it is what every lookup touches at
 * random, so it stays about the size of the keys in use (the host's caches hold it), whatever
 * the bound. Only this vCPU uses the index; the file writer reads the entries alone. */
#define INDEX_START 4096

static void table_init(struct rec_table *t, uint64_t cap, size_t size, uint64_t (*hash)(const void *))
{
    t->ent = g_malloc0_n(cap, size);  /* untouched pages cost no memory: filled in order */
    t->slot = g_new0(uint32_t, INDEX_START);
    t->cap = cap;
    t->mask = INDEX_START - 1;
    t->size = size;
    t->hash = hash;
}

static void table_grow(struct rec_table *t)
{
    uint64_t mask = 2 * t->mask + 1;
    uint32_t *slot = g_new0(uint32_t, mask + 1);
    for (uint64_t k = 0; k < t->n; k++) {
        uint64_t i = t->hash((uint8_t *)t->ent + k * t->size) & mask;
        while (slot[i]) {
            i = (i + 1) & mask;
        }
        slot[i] = k + 1;
    }
    g_free(t->slot);
    t->slot = slot;
    t->mask = mask;
}

static struct recorder *recorder_new(struct vcpu *vc)
{
    struct recorder *r = g_new0(struct recorder, 1);
    table_init(&r->edges, rec.entries, sizeof(struct rec_ent), pair_hash);
    table_init(&r->ranges, rec.entries, sizeof(struct rec_ent), pair_hash);
    table_init(&r->stacks, rec.stacks, sizeof(struct rec_stack), stack_hash);
    r->until = rec.period;
    r->range_start = NO_ADDR;
    r->via_from = NO_ADDR;
    __atomic_store_n(&vc->rec, r, __ATOMIC_RELEASE);  /* the file writer may look now */
    return r;
}

/* The entry for `key` (its first `keylen` bytes, the entry's start), found or appended with the
 * key copied in and the count 0; NULL at the bound (the caller counts it lost). */
static void *table_find(struct rec_table *t, uint64_t hash, const void *key, size_t keylen)
{
    for (uint64_t i = hash & t->mask;; i = (i + 1) & t->mask) {
        uint32_t k = t->slot[i];
        if (k == 0) {
            if (t->n == t->cap) {
                return NULL;
            }
            uint8_t *e = (uint8_t *)t->ent + t->n * t->size;
            memcpy(e, key, keylen);
            t->slot[i] = t->n + 1;
            __atomic_store_n(&t->n, t->n + 1, __ATOMIC_RELEASE);
            if (2 * t->n > t->mask) {
                table_grow(t);
            }
            return e;
        }
        uint8_t *e = (uint8_t *)t->ent + (k - 1) * t->size;
        if (!memcmp(e, key, keylen)) {
            return e;
        }
    }
}

static inline void bump(uint64_t *count)
{
    __atomic_store_n(count, *count + 1, __ATOMIC_RELAXED);  /* read by the file writer */
}

/* Once per recorded branch (twice: edge and range), so the known key's path compares the two
 * words inline; a new key goes through table_find. */
static inline void pair_add(struct rec_table *t, uint64_t a, uint64_t b, uint64_t kind)
{
    uint64_t h = mix(mix(0, a), b);
    struct rec_ent *ent = t->ent;
    for (uint64_t i = h & t->mask;; i = (i + 1) & t->mask) {
        uint32_t k = t->slot[i];
        if (k == 0) {
            break;
        }
        struct rec_ent *e = &ent[k - 1];
        if (e->a == a && e->b == b) {
            bump(&e->count);
            return;
        }
    }
    struct rec_ent key = { a, b, 0, kind };
    struct rec_ent *e = table_find(t, h, &key, 2 * sizeof(uint64_t));
    if (e) {
        e->kind = kind;  /* of the instruction at `a`: part of the value, not the key */
        bump(&e->count);
    } else {
        t->lost++;
    }
}

/* One LBR-like sample: the ring, newest branch first. */
static void sample(struct recorder *r)
{
    struct rec_stack key;
    key.n = r->depth;
    uint64_t h = mix(0, key.n);
    for (unsigned i = 0; i < key.n; i++) {
        unsigned j = (r->pos - 1 - i) & (LBR_DEPTH - 1);
        key.br[2 * i] = r->from[j];
        key.br[2 * i + 1] = r->to[j];
        h = mix(mix(h, r->from[j]), r->to[j]);
    }
    r->samples++;
    struct rec_stack *e = table_find(&r->stacks, h, &key, sizeof(uint64_t) * (1 + 2 * key.n));
    if (e) {
        bump(&e->count);
    } else {
        r->stacks.lost++;
    }
}

/* A taken branch from the end of segment `src` to the start of `dst` on this vCPU. Recorded when
 * either end is on the recorded side: a branch into it (a syscall, an interrupt) starts a
 * fall-through range there, a branch out of it (sysret, iret) ends one. */
static __attribute__((noinline)) void record(struct vcpu *vc, const struct seg *src, const struct seg *dst)
{
    bool out = src->side == rec.side, in = dst->side == rec.side;
    if (!out && !in) {
        return;
    }
    struct recorder *r = vc->rec ? vc->rec : recorder_new(vc);
    uint64_t from = src->tail, to = dst->vaddr;
    uint32_t kind = src->kind;
    if (G_UNLIKELY(src->thunk | dst->thunk)) {
        if (!src->thunk && (kind == BK_CALL || kind == BK_JUMP)) {  /* into a thunk: held until it leaves */
            if (out && r->range_start != NO_ADDR) {
                pair_add(&r->ranges, r->range_start, from, 0);
            }
            r->range_start = NO_ADDR;
            r->via_from = from;
            r->via_kind = dst->thunk == TH_RETURN ? BK_RET : kind;
            return;
        }
        if (r->via_from != NO_ADDR) {
            if (dst->thunk) {
                return;  /* within the thunks */
            }
            if (kind == BK_RET || kind == BK_JUMP || kind == BK_CALL) {  /* out of it: one branch */
                from = r->via_from;
                kind = r->via_kind;
            }
            r->via_from = NO_ADDR;  /* else an interrupt in the thunk: recorded as it is */
        }
    }
    pair_add(&r->edges, from, to, kind);
    if (out && r->range_start != NO_ADDR) {
        pair_add(&r->ranges, r->range_start, from, 0);
    }
    r->range_start = in ? to : NO_ADDR;
    r->from[r->pos] = from;
    r->to[r->pos] = to;
    r->pos = (r->pos + 1) & (LBR_DEPTH - 1);
    r->depth += r->depth < LBR_DEPTH;
    r->branches++;
    if (--r->until == 0) {
        r->until = rec.period;
        sample(r);
    }
}

static void reset_vcpu(struct vcpu *vc, uint32_t gen)
{
    memset(vc->c, 0, sizeof(vc->c));
    if (vc->rec) {
        /* Records add up over windows; what links branches (ring, open range) starts afresh. */
        vc->rec->depth = 0;
        vc->rec->range_start = NO_ADDR;
        vc->rec->via_from = NO_ADDR;
    }
    vc->last = NULL;  /* a window's first block has no predecessor: no branch into it is counted */
    if (!cfg.warm) {
        memset(vc->ic, 0, sizeof(uint64_t) * ic_sets * cfg.ic_assoc);
        memset(vc->tlb, 0, sizeof(struct tlb_ent) * tlb_sets * cfg.tlb_assoc);
        memset(vc->small, 0, sizeof(struct tlb_ent) * tlb_sets * cfg.tlb_assoc);
    }
    vc->gen = gen;
}

/* Taken branches: a block execution is a taken branch when the next block this vCPU runs in the
 * window does not start at its fall-through address (seg.end). It is counted on the side of the
 * block that branched (prev), when the successor shows up. Not taken branches, although the
 * successor starts elsewhere:
 *   - the successor starts at prev's phantom (the page-crossing quirk, tb_trans): prev ended
 *     before its last instruction, so execution fell through to it;
 *   - the successor starts at prev's last instruction, a rep-prefixed string instruction: TCG
 *     runs each iteration as a block that jumps back to it; the CPU runs one instruction.
 * A marker segment starts at its predecessor's end, so it continues its block. A transfer to an
 * interrupt or exception handler (or a syscall) is a taken branch of the interrupted block's
 * side; the return (iret, sysret) one of the kernel's.
 * Indirect branches need no successor: they are decoded, so they are added with the counts (on
 * both paths), and taken back with a phantom that was one. */
static __attribute__((noinline)) void account(unsigned vcpu_index, const struct seg *s, uint32_t g)
{
    struct vcpu *vc = &vcpus[vcpu_index];
    if (G_UNLIKELY((g & 1) && vc->gen != g)) {
        reset_vcpu(vc, g);  /* first block of this vCPU in a new window */
    }
    struct counters *c = &vc->c[s->side];
    const struct seg *prev = vc->last;
    c->insns += s->n_insns;
    c->blocks++;
    c->ic_acc += s->n_lines;
    c->tlb_acc += s->n_pages;
    c->small_acc += s->n_small;
    c->indirect += s->indirect;
    if (prev == s && s->own_sets) {
        /* The same segment again (a loop of one block): its back edge was taken (precomputed),
         * and each of its lines and pages is still the most recent of its set, so every access
         * hits and the LRU order stays as it is. */
        c->taken += s->self_taken;
        if (G_UNLIKELY(recording) && s->self_taken) {
            record(vc, s, s);
        }
        return;
    }
    if (G_LIKELY(prev != NULL)) {
        if (G_UNLIKELY(s->vaddr == prev->phantom)) {
            c->insns--;  /* prev's last instruction runs here instead: a fall-through */
            c->indirect -= prev->indirect;
        } else if (s->vaddr != prev->end && s->vaddr != prev->rep_at) {
            vc->c[prev->side].taken++;
            if (G_UNLIKELY(recording)) {
                record(vc, prev, s);
            }
        }
    }
    vc->last = s;
    const struct line_ref *l = seg_lines(s);
    uint64_t *ic = vc->ic;
    for (unsigned i = 0; i < s->n_lines; i++) {
        uint64_t *set = ic + l[i].off;
        if (G_UNLIKELY(set[0] != l[i].tag)) {
            c->ic_miss += ic_lookup_rest(set, cfg.ic_assoc, l[i].tag);
        }
    }
    c->tlb_miss += tlb_walk(vc->tlb, seg_pages(s), s->n_pages);
    c->small_miss += tlb_walk(vc->small, seg_small(s), s->n_small);
}

/* Outside a window (boot, set-up: most of a guest's life) a block costs this test only. */
static inline void count(unsigned int vcpu_index, const struct seg *s)
{
    uint32_t g = __atomic_load_n(&window_gen, __ATOMIC_RELAXED);
    if ((g & 1) || cfg.warm) {
        account(vcpu_index, s, g);
    }
}

static void tb_exec(unsigned int vcpu_index, void *udata)
{
    count(vcpu_index, udata);
}

/* ---- report ---- */
static void add_counters(struct counters *a, const struct counters *b)
{
    a->insns += b->insns;
    a->blocks += b->blocks;
    a->ic_acc += b->ic_acc;
    a->ic_miss += b->ic_miss;
    a->tlb_acc += b->tlb_acc;
    a->tlb_miss += b->tlb_miss;
    a->taken += b->taken;
    a->indirect += b->indirect;
    a->small_acc += b->small_acc;
    a->small_miss += b->small_miss;
}

static void json_counters(GString *s, const char *name, const struct counters *c)
{
    g_string_append_printf(s,
        "\"%s\": {\"insns\": %" PRIu64 ", \"blocks\": %" PRIu64
        ", \"l1i_accesses\": %" PRIu64 ", \"l1i_misses\": %" PRIu64
        ", \"itlb_accesses\": %" PRIu64 ", \"itlb_misses\": %" PRIu64
        ", \"taken_branches\": %" PRIu64 ", \"indirect_branches\": %" PRIu64
        ", \"itlb_4k_accesses\": %" PRIu64 ", \"itlb_4k_misses\": %" PRIu64 "}",
        name, c->insns, c->blocks, c->ic_acc, c->ic_miss, c->tlb_acc, c->tlb_miss, c->taken, c->indirect,
        c->small_acc, c->small_miss);
}

static double since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (t1.tv_sec - t0->tv_sec) + (t1.tv_nsec - t0->tv_nsec) / 1e9;
}

/* One window's record; called with win_lock held, gen = the window's (odd) generation.
 * A vCPU still finishing a block may add to its counters after the sum: a handful of blocks. */
static char *window_json(uint32_t gen, bool closed)
{
    struct counters tot[2] = { 0 };
    GString *s = g_string_new("");
    g_string_append_printf(s, "{\"index\": %" PRIu64 ", \"closed\": %s, \"seconds\": %.6f, "
                           "\"duplicate_opens\": %" PRIu64 ", \"per_vcpu\": [",
                           opens, closed ? "true" : "false", since(&t_open), dup_opens);
    for (int i = 0; i < n_vcpus; i++) {
        /* A vCPU that ran no block since the window opened holds an older window's counters. */
        struct counters zero[2] = { 0 };
        const struct counters *c = vcpus[i].gen == gen ? vcpus[i].c : zero;
        add_counters(&tot[USER], &c[USER]);
        add_counters(&tot[KERNEL], &c[KERNEL]);
        g_string_append_printf(s, "%s{\"vcpu\": %d, ", i ? ", " : "", i);
        json_counters(s, "user", &c[USER]);
        g_string_append(s, ", ");
        json_counters(s, "kernel", &c[KERNEL]);
        g_string_append(s, "}");
    }
    g_string_append(s, "], ");
    struct counters all = tot[USER];
    add_counters(&all, &tot[KERNEL]);
    json_counters(s, "user", &tot[USER]);
    g_string_append(s, ", ");
    json_counters(s, "kernel", &tot[KERNEL]);
    g_string_append(s, ", ");
    json_counters(s, "total", &all);
    g_string_append_printf(s, ", \"kernel_insn_share\": %.6f}",
                           all.insns ? (double)tot[KERNEL].insns / all.insns : 0.0);
    return g_string_free(s, FALSE);
}

/* The whole report: every closed window, plus one still open at exit. Called with win_lock held. */
static void write_report(const char *open_window)
{
    GString *s = g_string_new("");
    g_string_append_printf(s, "{\"tool\": \"kpgosim\", \"format\": %d,\n", FORMAT);
    g_string_append_printf(s, " \"config\": {\"l1i_size\": %" PRIu64 ", \"l1i_assoc\": %" PRIu64
                           ", \"l1i_line\": %" PRIu64 ", \"itlb_entries\": %" PRIu64
                           ", \"itlb_assoc\": %" PRIu64 ", \"itlb_page\": %" PRIu64
                           ", \"itlb_kpage\": %" PRIu64 ", \"warm\": %s, \"always\": %s, \"vcpus\": %d},\n",
                           cfg.ic_size, cfg.ic_assoc, cfg.ic_line, cfg.tlb_entries, cfg.tlb_assoc,
                           cfg.tlb_page, cfg.tlb_kpage, cfg.warm ? "true" : "false",
                           cfg.always ? "true" : "false", n_vcpus);
    g_string_append(s, " \"windows\": [");
    for (guint i = 0; i < closed_windows->len; i++) {
        g_string_append_printf(s, "%s\n  %s", i ? "," : "", (char *)g_ptr_array_index(closed_windows, i));
    }
    g_string_append_printf(s, "],\n \"open_window\": %s,\n", open_window ? open_window : "null");
    g_mutex_lock(&segs_lock);
    g_string_append_printf(s, " \"stray_closes\": %" PRIu64 ", \"translations\": %" PRIu64
                           ", \"segments\": %u, \"precomputed_bytes\": %" PRIu64 "}\n",
                           stray_closes, translations, g_hash_table_size(segs), seg_bytes);
    g_mutex_unlock(&segs_lock);

    if (!cfg.out) {
        qemu_plugin_outs(s->str);
    } else {
        /* tmp + rename: a reader never sees half a report */
        g_autofree char *tmp = g_strdup_printf("%s.tmp", cfg.out);
        FILE *f = fopen(tmp, "w");
        bool ok = f && fwrite(s->str, 1, s->len, f) == s->len;
        ok = (f && fclose(f) == 0) && ok;
        if (!ok || rename(tmp, cfg.out) != 0) {
            g_autofree char *msg = g_strdup_printf("kpgosim: cannot write %s\n", cfg.out);
            qemu_plugin_outs(msg);
        }
    }
    g_string_free(s, TRUE);
}

/* ---- branch records file ----
 * Little-endian u64 words, after the 8-byte magic: format, side (0 user, 1 kernel), period,
 * depth, vcpus, closed windows, open window (1 if one was open when written), recorded branches,
 * samples, lost edges, lost ranges, lost samples (executions not stored at the bounds), the
 * entries and stacks bounds, then the numbers of edges, ranges and stacks, the build id's length
 * and 64 bytes of build id. Then the edges (from, to, count, kind), the ranges (start, end,
 * count), the stacks (count, n, n (from, to) pairs, newest first), each sorted, and the end
 * magic with the file's length: a truncated file is told from a complete one. */
enum { TABLE_EDGES, TABLE_RANGES, TABLE_STACKS };

static struct rec_table *rec_table_of(struct recorder *r, int which)
{
    return which == TABLE_EDGES ? &r->edges : which == TABLE_RANGES ? &r->ranges : &r->stacks;
}

static int cmp_pair(const void *x, const void *y)
{
    const struct rec_ent *a = x, *b = y;
    if (a->a != b->a) {
        return a->a < b->a ? -1 : 1;
    }
    return a->b < b->b ? -1 : a->b > b->b;
}

static int cmp_stack(const void *x, const void *y)
{
    const struct rec_stack *a = x, *b = y;
    if (a->n != b->n) {
        return a->n < b->n ? -1 : 1;
    }
    for (uint64_t i = 0; i < 2 * a->n; i++) {
        if (a->br[i] != b->br[i]) {
            return a->br[i] < b->br[i] ? -1 : 1;
        }
    }
    return 0;
}

/* One table of every vCPU, equal keys summed, sorted: the file does not depend on which vCPU ran
 * what. Entries are copied up to each table's published n (a vCPU may still be adding). */
static void *merge_table(int which, uint64_t *n_out, uint64_t *lost)
{
    size_t size = which == TABLE_STACKS ? sizeof(struct rec_stack) : sizeof(struct rec_ent);
    uint64_t total = 0, *ns = g_new0(uint64_t, n_vcpus);
    *lost = 0;
    for (int i = 0; i < n_vcpus; i++) {
        struct recorder *r = __atomic_load_n(&vcpus[i].rec, __ATOMIC_ACQUIRE);
        if (r) {
            struct rec_table *t = rec_table_of(r, which);
            ns[i] = __atomic_load_n(&t->n, __ATOMIC_ACQUIRE);
            total += ns[i];
            *lost += __atomic_load_n(&t->lost, __ATOMIC_RELAXED);
        }
    }
    uint8_t *all = g_malloc0_n(total ? total : 1, size), *at = all;
    for (int i = 0; i < n_vcpus; i++) {
        if (ns[i]) {
            struct rec_table *t = rec_table_of(vcpus[i].rec, which);
            memcpy(at, t->ent, ns[i] * size);
            at += ns[i] * size;
        }
    }
    g_free(ns);
    if (which == TABLE_STACKS) {
        struct rec_stack *v = (struct rec_stack *)all;
        uint64_t k = 0;
        qsort(v, total, size, cmp_stack);
        for (uint64_t i = 0; i < total; i++) {
            if (!v[i].count) {
                continue;  /* appended by a vCPU still running, not counted yet (nor its kind set) */
            }
            if (k && !cmp_stack(&v[k - 1], &v[i])) {
                v[k - 1].count += v[i].count;
            } else {
                v[k++] = v[i];
            }
        }
        *n_out = k;
    } else {
        struct rec_ent *v = (struct rec_ent *)all;
        uint64_t k = 0;
        qsort(v, total, size, cmp_pair);
        for (uint64_t i = 0; i < total; i++) {
            if (!v[i].count) {
                continue;  /* appended by a vCPU still running, not counted yet (nor its kind set) */
            }
            if (k && !cmp_pair(&v[k - 1], &v[i])) {
                v[k - 1].count += v[i].count;
            } else {
                v[k++] = v[i];
            }
        }
        *n_out = k;
    }
    return all;
}

static void put64(GByteArray *b, uint64_t v)
{
    g_byte_array_append(b, (const guint8 *)&v, sizeof(v));  /* x86-64 hosts: little-endian */
}

/* The whole records file, rewritten (tmp + rename). Called with win_lock held. */
static void write_records(bool open)
{
    uint64_t n[3], lost[3];
    void *t[3];
    for (int i = 0; i < 3; i++) {
        t[i] = merge_table(i, &n[i], &lost[i]);
    }
    uint64_t branches = 0, samples = 0;
    for (int i = 0; i < n_vcpus; i++) {
        struct recorder *r = __atomic_load_n(&vcpus[i].rec, __ATOMIC_ACQUIRE);
        if (r) {
            branches += __atomic_load_n(&r->branches, __ATOMIC_RELAXED);
            samples += __atomic_load_n(&r->samples, __ATOMIC_RELAXED);
        }
    }
    GByteArray *b = g_byte_array_new();
    g_byte_array_append(b, (const guint8 *)rec_magic, sizeof(rec_magic));
    uint64_t head[] = { REC_FORMAT, rec.side, rec.period, LBR_DEPTH, n_vcpus, closed_windows->len, open,
                        branches, samples, lost[0], lost[1], lost[2], rec.entries, rec.stacks,
                        n[0], n[1], n[2], rec.build_id_len };
    for (size_t i = 0; i < G_N_ELEMENTS(head); i++) {
        put64(b, head[i]);
    }
    g_byte_array_append(b, rec.build_id, sizeof(rec.build_id));
    struct rec_ent *e = t[TABLE_EDGES];
    for (uint64_t i = 0; i < n[TABLE_EDGES]; i++) {
        put64(b, e[i].a), put64(b, e[i].b), put64(b, e[i].count), put64(b, e[i].kind);
    }
    e = t[TABLE_RANGES];
    for (uint64_t i = 0; i < n[TABLE_RANGES]; i++) {
        put64(b, e[i].a), put64(b, e[i].b), put64(b, e[i].count);
    }
    struct rec_stack *st = t[TABLE_STACKS];
    for (uint64_t i = 0; i < n[TABLE_STACKS]; i++) {
        put64(b, st[i].count), put64(b, st[i].n);
        g_byte_array_append(b, (const guint8 *)st[i].br, 2 * st[i].n * sizeof(uint64_t));
    }
    g_byte_array_append(b, (const guint8 *)rec_end, sizeof(rec_end));
    put64(b, b->len + sizeof(uint64_t));
    for (int i = 0; i < 3; i++) {
        g_free(t[i]);
    }
    g_autofree char *tmp = g_strdup_printf("%s.tmp", rec.out);
    FILE *f = fopen(tmp, "wb");
    bool ok = f && fwrite(b->data, 1, b->len, f) == b->len;
    ok = (f && fclose(f) == 0) && ok;
    if (!ok || rename(tmp, rec.out) != 0) {
        g_autofree char *msg = g_strdup_printf("kpgosim: cannot write %s\n", rec.out);
        qemu_plugin_outs(msg);
    }
    g_byte_array_free(b, TRUE);
}

static void window_open(void)
{
    g_mutex_lock(&win_lock);
    if (window_gen & 1) {
        dup_opens++;  /* nested opens are ignored */
    } else {
        opens++;
        dup_opens = 0;
        clock_gettime(CLOCK_MONOTONIC, &t_open);
        __atomic_store_n(&window_gen, window_gen + 1, __ATOMIC_RELEASE);
    }
    g_mutex_unlock(&win_lock);
}

static void window_close(void)
{
    g_mutex_lock(&win_lock);
    if (!(window_gen & 1)) {
        stray_closes++;
    } else {
        uint32_t g = window_gen;
        /* Close first so the other vCPUs stop counting, then sum. */
        __atomic_store_n(&window_gen, g + 1, __ATOMIC_RELEASE);
        g_ptr_array_add(closed_windows, window_json(g, true));
        write_report(NULL);
        if (recording) {
            write_records(false);
        }
    }
    g_mutex_unlock(&win_lock);
}

/* Marker instruction: switch the window, then account the rest of the segment (so the open
 * marker itself is counted and the close marker is not). */
static void mark_exec(unsigned int vcpu_index, void *udata)
{
    const struct seg *s = udata;
    if (s->op == OP_OPEN) {
        window_open();
    } else {
        window_close();
    }
    count(vcpu_index, s);
}

/* ---- translation ---- */
static int marker_op(struct qemu_plugin_insn *insn)
{
    if (qemu_plugin_insn_size(insn) != MARK_LEN) {
        return OP_NONE;
    }
    const uint8_t *b = qemu_plugin_insn_data(insn);
    if (memcmp(b, mark_prefix, 3) || memcmp(b + 4, mark_suffix, 3)) {
        return OP_NONE;
    }
    return (b[3] == OP_OPEN || b[3] == OP_CLOSE) ? b[3] : OP_NONE;
}

/* Host address of the guest code stands for its physical address (QEMU 7.2 gives no guest
 * physical address for code): only equality matters to LRU, so the simulation does not depend
 * on its value. Code without RAM backing falls back to the virtual address, top bit set. */
static uint64_t host_addr(struct qemu_plugin_insn *insn, uint64_t vaddr)
{
    void *h = qemu_plugin_insn_haddr(insn);
    return h ? (uint64_t)(uintptr_t)h : (vaddr | (1ULL << 63));
}

/* Whether n offsets, each `stride` words after the last, differ (few: quadratic is fine). */
static bool distinct_offsets(const uint64_t *off, size_t n, size_t stride)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j < i; j++) {
            if (off[i * stride] == off[j * stride]) {
                return false;
            }
        }
    }
    return true;
}

/* The offset of an instruction's opcode, after its legacy prefixes and an optional REX prefix
 * (in 32-bit code 0x40-0x4f is inc/dec, a whole instruction: the offset reaches n); *rep tells
 * whether a rep/repne prefix was among them. */
static size_t opcode_at(const uint8_t *b, size_t n, bool *rep)
{
    size_t i = 0;
    *rep = false;
    for (; i < n; i++) {  /* legacy prefixes */
        uint8_t x = b[i];
        if (x == 0xf2 || x == 0xf3) {
            *rep = true;
        } else if (x != 0xf0 && x != 0x2e && x != 0x36 && x != 0x3e && x != 0x26 && x != 0x64 &&
                   x != 0x65 && x != 0x66 && x != 0x67) {
            break;
        }
    }
    if (i < n && (b[i] & 0xf0) == 0x40) {
        i++;
    }
    return i;
}

/* Whether an instruction is a rep/repne-prefixed string instruction (ins, outs, movs, cmps, stos,
 * lods, scas). TCG ends the block after it and runs each further iteration as a block of its own
 * that starts at it. */
static bool rep_string(struct qemu_plugin_insn *insn)
{
    const uint8_t *b = qemu_plugin_insn_data(insn);
    size_t n = qemu_plugin_insn_size(insn);
    bool rep;
    size_t i = opcode_at(b, n, &rep);
    if (!rep || i >= n) {
        return false;
    }
    uint8_t op = b[i];
    return (op >= 0x6c && op <= 0x6f) || (op >= 0xa4 && op <= 0xa7) || (op >= 0xaa && op <= 0xaf);
}

/* Whether an instruction is an indirect call or jump: ff /2 (call near), /3 (call far), /4 (jmp
 * near), /5 (jmp far), whatever its prefixes (notrack 3e and bnd f2 included). Far forms with a
 * register operand (mod 3) are undefined (#UD), no branch. Each ends its TCG block. A phantom
 * whose recorded bytes stop before the ModRM byte is none here; it is decoded in its next block. */
static bool indirect_branch(struct qemu_plugin_insn *insn)
{
    const uint8_t *b = qemu_plugin_insn_data(insn);
    size_t n = qemu_plugin_insn_size(insn);
    bool rep;
    size_t i = opcode_at(b, n, &rep);
    if (i + 1 >= n || b[i] != 0xff) {
        return false;
    }
    unsigned mod = b[i + 1] >> 6, reg = (b[i + 1] >> 3) & 7;
    return reg == 2 || reg == 4 || ((reg == 3 || reg == 5) && mod != 3);
}

/* What kind of branch an instruction is, for the records' edges (enum bkind): the call graph is
 * made of the calls. BK_NONE for any other instruction: a taken branch after it is an interrupt
 * or exception (or the page-crossing phantom's bytes did not reach the opcode). */
static uint32_t branch_kind(struct qemu_plugin_insn *insn)
{
    const uint8_t *b = qemu_plugin_insn_data(insn);
    size_t n = qemu_plugin_insn_size(insn);
    bool rep;
    size_t i = opcode_at(b, n, &rep);
    if (i >= n) {
        return BK_NONE;
    }
    uint8_t op = b[i];
    uint8_t next = i + 1 < n ? b[i + 1] : 0;
    switch (op) {
    case 0xe8: case 0x9a:
        return BK_CALL;
    case 0xe9: case 0xeb: case 0xea:
        return BK_JUMP;
    case 0xc3: case 0xc2: case 0xcb: case 0xca:
        return BK_RET;
    case 0xcf:  /* iret */
        return BK_SYSRET;
    case 0xcc: case 0xcd: case 0xce:  /* int3, int n, into */
        return BK_SYSCALL;
    case 0xff:
        if (i + 1 >= n) {
            return BK_NONE;
        }
        switch ((next >> 3) & 7) {
        case 2: case 3:
            return BK_CALL;
        case 4: case 5:
            return BK_JUMP;
        }
        return BK_NONE;
    case 0x0f:
        if (next >= 0x80 && next <= 0x8f) {
            return BK_COND;
        }
        if (next == 0x05 || next == 0x34) {  /* syscall, sysenter */
            return BK_SYSCALL;
        }
        if (next == 0x07 || next == 0x35) {  /* sysret, sysexit */
            return BK_SYSRET;
        }
        return BK_NONE;
    }
    if ((op >= 0x70 && op <= 0x7f) || (op >= 0xe0 && op <= 0xe3)) {  /* jcc, loop, jrcxz */
        return BK_COND;
    }
    return BK_NONE;
}

/* Append the pages of size 1 << shift that an instruction at v..vend (host address h) touches to refs[0..n), one
 * per distinct page in execution order (*last: the page appended last); the new count. */
static size_t add_pages(struct page_ref *refs, size_t n, uint64_t *last, uint64_t v, uint64_t vend, uint64_t h,
                        uint64_t virt_flag, unsigned shift)
{
    for (uint64_t pn = v >> shift; pn <= vend >> shift; pn++) {
        if (pn == *last) {
            continue;
        }
        uint64_t ph = h + ((pn << shift) - v);
        refs[n].vtag = pn;
        refs[n].htag = (ph >> shift) | virt_flag;
        refs[n].off = (pn & (tlb_sets - 1)) * cfg.tlb_assoc;
        n++;
        *last = pn;
    }
    return n;
}

/* The interned segment for instructions [first, last) of the block. */
static struct seg *build_seg(struct qemu_plugin_tb *tb, size_t first, size_t last, int op, int side,
                             uint64_t phantom)
{
    /* Upper bound: each insn (at most 15 bytes) spans at most 2 lines and 2 pages. */
    size_t max = 2 * (last - first) + 2;
    struct seg *s = g_malloc0(sizeof(*s) + max * (sizeof(struct line_ref) + 2 * sizeof(struct page_ref)));
    struct line_ref *lines = (struct line_ref *)s->data;
    struct page_ref *pages = g_new(struct page_ref, max);
    struct page_ref *small = g_new(struct page_ref, max);
    size_t nl = 0, np = 0, ns = 0;
    uint64_t last_line = UINT64_MAX, last_page = UINT64_MAX, last_small = UINT64_MAX;
    unsigned pshift = tlb_shift[side];

    for (size_t i = first; i < last; i++) {
        struct qemu_plugin_insn *insn = qemu_plugin_tb_get_insn(tb, i);
        uint64_t v = qemu_plugin_insn_vaddr(insn);
        uint64_t h = host_addr(insn, v);
        uint64_t virt_flag = h & (1ULL << 63);
        uint64_t vend = v + qemu_plugin_insn_size(insn) - 1;
        /* One access per distinct line/page in execution order: a block looping within a line
         * is one fetch of it, which changes accesses, not misses. */
        for (uint64_t ln = v >> ic_line_shift; ln <= vend >> ic_line_shift; ln++) {
            if (ln == last_line) {
                continue;
            }
            /* Relative to the insn start: an insn crossing a page puts its tail on the next
             * host page (approximation; such insns are rare). */
            uint64_t lh = h + ((ln << ic_line_shift) - v);
            lines[nl].tag = (lh >> ic_line_shift) | virt_flag;
            lines[nl].off = (ln & (ic_sets - 1)) * cfg.ic_assoc;
            nl++;
            last_line = ln;
        }
        np = add_pages(pages, np, &last_page, v, vend, h, virt_flag, pshift);
        ns = add_pages(small, ns, &last_small, v, vend, h, virt_flag, SMALL_PAGE_SHIFT);
    }
    s->n_insns = last - first;
    s->own_sets = distinct_offsets(&lines[0].off, nl, sizeof(*lines) / sizeof(uint64_t)) &&
                  distinct_offsets(&pages[0].off, np, sizeof(*pages) / sizeof(uint64_t)) &&
                  distinct_offsets(&small[0].off, ns, sizeof(*small) / sizeof(uint64_t));
    s->vaddr = qemu_plugin_insn_vaddr(qemu_plugin_tb_get_insn(tb, first));
    struct qemu_plugin_insn *tail = qemu_plugin_tb_get_insn(tb, last - 1);
    s->end = qemu_plugin_insn_vaddr(tail) + qemu_plugin_insn_size(tail);
    s->tail = qemu_plugin_insn_vaddr(tail);
    s->kind = branch_kind(tail);
    s->thunk = thunk_of(s->vaddr);
    s->phantom = phantom;
    s->rep_at = rep_string(tail) ? qemu_plugin_insn_vaddr(tail) : NO_ADDR;
    /* Only a block's last instruction can be one: a segment that ends at a marker never is. */
    s->indirect = indirect_branch(tail);
    /* Running this segment again right after itself: a back edge unless it is the next iteration
     * of its rep string instruction (or, not possible for a segment of some bytes, the
     * fall-through or the phantom). */
    s->self_taken = s->vaddr != s->end && s->vaddr != s->phantom && s->vaddr != s->rep_at;
    s->n_lines = nl;
    s->n_pages = np;
    s->n_small = ns;
    s->side = side;
    s->op = op;
    memcpy(lines + nl, pages, np * sizeof(*pages));
    memcpy((struct page_ref *)(lines + nl) + np, small, ns * sizeof(*small));
    g_free(pages);
    g_free(small);

    g_mutex_lock(&segs_lock);
    translations++;
    struct seg *known = g_hash_table_lookup(segs, s);
    if (known) {
        g_free(s);
        s = known;
    } else {
        s = g_realloc(s, seg_size(s));
        g_hash_table_add(segs, s);
        seg_bytes += seg_size(s);
    }
    g_mutex_unlock(&segs_lock);
    return s;
}

static void tb_trans(qemu_plugin_id_t id, struct qemu_plugin_tb *tb)
{
    size_t n = qemu_plugin_tb_n_insns(tb);
    /* A block never straddles the halves; the upper canonical half is the kernel's (also with
     * 5-level paging). */
    int side = (qemu_plugin_tb_vaddr(tb) >> 63) ? KERNEL : USER;
    size_t start = 0;
    int op = OP_NONE;

    /* QEMU 7.2's x86 translator ends a block before an instruction that would leave the block's
     * first page and runs it first in the next block, but the plugin still sees it as this
     * block's last, with the bytes the translator had read when it gave up: it reads the fields
     * (prefixes, opcode, ModRM, displacement, immediate) in turn and stops at the first that
     * would cross, so the recorded bytes need not reach the page end (`add $imm32, %eax` shows
     * as its opcode byte only). Counted as it is, such an instruction is counted twice
     * (measured: +1 per page crossed) and its block looks like a taken branch. An x86
     * instruction has at most 15 bytes, so one that crosses starts in the page's last 14 bytes:
     * the last instruction of a block of several that starts there is a candidate, and when
     * the next block this vCPU runs starts at its address, it was not executed here: account()
     * takes it back and counts no taken branch. (A genuine last instruction there is taken
     * back only if the next block starts at its own address: it jumps to itself. A rep string
     * instruction, which TCG re-runs from its own address, is no candidate.) */
    uint64_t phantom = NO_ADDR;
    if (n > 1) {
        struct qemu_plugin_insn *last = qemu_plugin_tb_get_insn(tb, n - 1);
        uint64_t v = qemu_plugin_insn_vaddr(last);
        if ((v & (GUEST_PAGE - 1)) > GUEST_PAGE - X86_MAX_INSN && !rep_string(last)) {
            phantom = v;
        }
    }
    for (size_t i = 0; i <= n; i++) {
        int next_op = OP_NONE;
        if (i < n) {
            next_op = marker_op(qemu_plugin_tb_get_insn(tb, i));
            if (next_op == OP_NONE) {
                continue;
            }
        }
        /* Segment [start, i) ends here, at a marker or at the block's end. */
        if (i > start) {
            struct seg *s = build_seg(tb, start, i, op, side, i == n ? phantom : NO_ADDR);
            if (op == OP_NONE) {
                qemu_plugin_register_vcpu_tb_exec_cb(tb, tb_exec, QEMU_PLUGIN_CB_NO_REGS, s);
            } else {
                qemu_plugin_register_vcpu_insn_exec_cb(qemu_plugin_tb_get_insn(tb, start),
                                                       mark_exec, QEMU_PLUGIN_CB_NO_REGS, s);
            }
        }
        start = i;
        op = next_op;
    }
}

static void at_exit(qemu_plugin_id_t id, void *p)
{
    g_mutex_lock(&win_lock);
    g_autofree char *open_window = (window_gen & 1) ? window_json(window_gen, false) : NULL;
    write_report(open_window);  /* always: an empty "windows" list still says the plugin ran */
    if (recording) {
        write_records(open_window != NULL);
    }
    g_mutex_unlock(&win_lock);
}

/* ---- arguments ---- */
static bool parse_size(const char *val, uint64_t *out)
{
    char *end;
    uint64_t v = g_ascii_strtoull(val, &end, 10);
    if (end == val) {
        return false;
    }
    if (*end == 'k' || *end == 'K') {
        v <<= 10, end++;
    } else if (*end == 'm' || *end == 'M') {
        v <<= 20, end++;
    }
    if (*end || v == 0) {
        return false;
    }
    *out = v;
    return true;
}

static bool pow2(uint64_t v)
{
    return v && !(v & (v - 1));
}

QEMU_PLUGIN_EXPORT int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info,
                                           int argc, char **argv)
{
    static const struct { const char *key; uint64_t *val; } sizes[] = {
        { "l1i_size", &cfg.ic_size },         { "l1i_assoc", &cfg.ic_assoc },
        { "l1i_line", &cfg.ic_line },         { "itlb_entries", &cfg.tlb_entries },
        { "itlb_assoc", &cfg.tlb_assoc },     { "itlb_page", &cfg.tlb_page },
        { "itlb_kpage", &cfg.tlb_kpage },     { "branch_period", &rec.period },
        { "branch_entries", &rec.entries },   { "branch_stacks", &rec.stacks },
    };
    for (int i = 0; i < argc; i++) {
        char *eq = strchr(argv[i], '=');
        if (!eq) {
            fprintf(stderr, "kpgosim: argument '%s' is not KEY=VALUE\n", argv[i]);
            return -1;
        }
        g_autofree char *key = g_strndup(argv[i], eq - argv[i]);
        const char *val = eq + 1;
        bool ok = true, known = false;
        for (size_t k = 0; k < G_N_ELEMENTS(sizes); k++) {
            if (!strcmp(key, sizes[k].key)) {
                ok = parse_size(val, sizes[k].val);
                known = true;
            }
        }
        if (known) {
            /* done */
        } else if (!strcmp(key, "out")) {
            cfg.out = g_strdup(val);
        } else if (!strcmp(key, "warm")) {
            ok = qemu_plugin_bool_parse(key, val, &cfg.warm);
        } else if (!strcmp(key, "always")) {
            ok = qemu_plugin_bool_parse(key, val, &cfg.always);
        } else if (!strcmp(key, "branches")) {
            rec.out = g_strdup(val);
        } else if (!strcmp(key, "branch_side")) {
            ok = !strcmp(val, "kernel") || !strcmp(val, "user");
            rec.side = strcmp(val, "user") ? KERNEL : USER;
        } else if (!strcmp(key, "thunk") || !strcmp(key, "return_thunk")) {
            /* START-END in hex, end excluded; repeatable */
            char *dash = strchr(val, '-'), *e1 = NULL, *e2 = NULL;
            ok = dash != NULL && n_thunks < MAX_THUNKS;
            if (ok) {
                thunks[n_thunks].lo = g_ascii_strtoull(val, &e1, 16);
                thunks[n_thunks].hi = g_ascii_strtoull(dash + 1, &e2, 16);
                thunks[n_thunks].kind = strcmp(key, "thunk") ? TH_RETURN : TH_INDIRECT;
                ok = e1 == dash && *e2 == 0 && thunks[n_thunks].lo < thunks[n_thunks].hi;
                n_thunks += ok;
            }
        } else if (!strcmp(key, "build_id")) {
            size_t len = strlen(val);
            ok = len % 2 == 0 && len / 2 <= sizeof(rec.build_id);
            for (size_t k = 0; ok && k < len / 2; k++) {
                ok = g_ascii_isxdigit(val[2 * k]) && g_ascii_isxdigit(val[2 * k + 1]);
                rec.build_id[k] = g_ascii_xdigit_value(val[2 * k]) * 16 + g_ascii_xdigit_value(val[2 * k + 1]);
            }
            rec.build_id_len = len / 2;
        } else {
            fprintf(stderr, "kpgosim: unknown argument '%s'\n", key);
            return -1;
        }
        if (!ok) {
            fprintf(stderr, "kpgosim: bad value in '%s'\n", argv[i]);
            return -1;
        }
    }
    /* Same rules as kpgo.sim.SimConfig: sets are indexed by masking, LRU state is per set. */
    if (!pow2(cfg.ic_line) || !pow2(cfg.tlb_page) || !pow2(cfg.tlb_kpage) ||
        cfg.ic_assoc > 64 || cfg.tlb_assoc > 64 ||
        cfg.ic_size % (cfg.ic_line * cfg.ic_assoc) || !pow2(cfg.ic_size / (cfg.ic_line * cfg.ic_assoc)) ||
        cfg.tlb_entries % cfg.tlb_assoc || !pow2(cfg.tlb_entries / cfg.tlb_assoc)) {
        fprintf(stderr, "kpgosim: line/page sizes and the number of sets must be powers of two,"
                        " associativity at most 64\n");
        return -1;
    }
    /* Entry indices are u32 in the index (and each table's index has twice the entries' slots). */
    if (rec.entries > (1 << 28) || rec.stacks > (1 << 24)) {
        fprintf(stderr, "kpgosim: branch_entries is at most 268435456, branch_stacks at most 16777216\n");
        return -1;
    }
    recording = rec.out != NULL;
    ic_sets = cfg.ic_size / (cfg.ic_line * cfg.ic_assoc);
    ic_line_shift = __builtin_ctzll(cfg.ic_line);
    tlb_sets = cfg.tlb_entries / cfg.tlb_assoc;
    tlb_shift[USER] = __builtin_ctzll(cfg.tlb_page);
    tlb_shift[KERNEL] = __builtin_ctzll(cfg.tlb_kpage);

    /* User-mode QEMU numbers vCPUs by thread without a bound: give it room, count as best we can. */
    n_vcpus = info->system_emulation ? info->system.max_vcpus : 64;
    /* malloc does not honour the 64-byte alignment of struct vcpu */
    if (posix_memalign((void **)&vcpus, 64, n_vcpus * sizeof(struct vcpu))) {
        fprintf(stderr, "kpgosim: out of memory\n");
        return -1;
    }
    memset(vcpus, 0, n_vcpus * sizeof(struct vcpu));
    for (int i = 0; i < n_vcpus; i++) {
        vcpus[i].ic = g_malloc0_n((size_t)ic_sets * cfg.ic_assoc, sizeof(uint64_t));
        vcpus[i].tlb = g_malloc0_n((size_t)tlb_sets * cfg.tlb_assoc, sizeof(struct tlb_ent));
        vcpus[i].small = g_malloc0_n((size_t)tlb_sets * cfg.tlb_assoc, sizeof(struct tlb_ent));
    }
    segs = g_hash_table_new(seg_hash, seg_equal);
    closed_windows = g_ptr_array_new_with_free_func(g_free);
    if (cfg.always) {
        opens = 1;
        clock_gettime(CLOCK_MONOTONIC, &t_open);
        window_gen = 1;
    }
    qemu_plugin_register_vcpu_tb_trans_cb(id, tb_trans);
    qemu_plugin_register_atexit_cb(id, at_exit, NULL);
    return 0;
}
