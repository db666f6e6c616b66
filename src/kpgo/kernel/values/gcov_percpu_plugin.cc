// kpgo's GCC plugin for value-profiled kernels: gives GCC's indirect-call profiler tuple a per-CPU home.
//
// With -fprofile-values GCC records which function an indirect call reaches through a tuple it declares
// thread-local (__gcov_indirect_call: the callee the caller is about to call and that call site's counters; the
// callee's prologue compares itself with it). On x86-64 that is a %fs-relative access, and in the kernel %fs holds
// the user task's TLS base (zero in kernel threads), so the instrumented kernel would write through it. This pass
// runs last on GIMPLE, after every optimization that could move the accesses, and turns each load and store of a
// field of that tuple into one instruction on the same field of the kernel's per-CPU copy, __kpgo_indirect_call
// (kernel/gcov/values.c, from kpgo's patch): "%gs:sym" addresses this CPU's copy of a per-CPU variable sym on
// x86-64 SMP kernels. A use the pass does not know how to rewrite stops the compilation: a kernel must never be
// built with a %fs access left in it.
#include "gcc-plugin.h"
#include "plugin-version.h"
#include "tree.h"
#include "tree-pass.h"
#include "context.h"
#include "function.h"
#include "basic-block.h"
#include "gimple.h"
#include "gimple-iterator.h"
#include "gimple-walk.h"
#include "ssa.h"
#include "tree-into-ssa.h"
#include "diagnostic-core.h"
#include "stor-layout.h"
#include "tree-dfa.h"

int plugin_is_GPL_compatible;

static const char *const kTuple = "__gcov_indirect_call";
static const char *const kPerCpu = "__kpgo_indirect_call";

static bool is_tuple(const_tree t) {
  return t && TREE_CODE(t) == VAR_DECL && DECL_NAME(t) && !strcmp(IDENTIFIER_POINTER(DECL_NAME(t)), kTuple);
}

// The byte offset in the tuple that `ref` accesses as one 64-bit word, else -1. GCC writes tuple.field, which
// later passes may turn into MEM[&tuple + off] (a component of a memory reference): both resolve to the tuple
// and a constant offset.
static HOST_WIDE_INT field_offset(tree ref) {
  if (!handled_component_p(ref) && TREE_CODE(ref) != MEM_REF)
    return -1;
  poly_int64 off;
  HOST_WIDE_INT at;
  tree base = get_addr_base_and_unit_offset(ref, &off);
  tree size = TYPE_SIZE(TREE_TYPE(ref));
  if (!base || !is_tuple(base) || !off.is_constant(&at) || !size || !tree_fits_uhwi_p(size) || tree_to_uhwi(size) != 64)
    return -1;
  return at;
}

static tree operand(const char *constraint, tree value) {
  tree c = build_tree_list(NULL_TREE, build_string(strlen(constraint), constraint));
  return build_tree_list(c, value);
}

// One volatile asm moving a 64-bit value to (store) or from (load) this CPU's copy of the tuple's field.
static gasm *percpu_move(HOST_WIDE_INT offset, tree value, bool store) {
  char text[128];
  vec<tree, va_gc> *in = NULL, *out = NULL, *clobbers = NULL;
  if (store) {
    snprintf(text, sizeof text, "movq %%0, %%%%gs:%s+%ld", kPerCpu, (long)offset);
    vec_safe_push(in, operand("r", value));
  } else {
    snprintf(text, sizeof text, "movq %%%%gs:%s+%ld, %%0", kPerCpu, (long)offset);
    vec_safe_push(out, operand("=r", value));
  }
  // "memory" orders it with the counter updates around it, as the plain access was ordered.
  vec_safe_push(clobbers, build_tree_list(NULL_TREE, build_string(6, "memory")));
  gasm *a = gimple_build_asm_vec(ggc_strdup(text), in, out, clobbers, NULL);
  gimple_asm_set_volatile(a, true);
  return a;
}

// A call to one of GCC's value profilers (__gcov_topn_values_profiler, __gcov_indirect_call_profiler_v4, ...,
// their _atomic twins); `callee_only`: only the one at the entry of a function that may be called indirectly.
static bool is_value_profiler(const gimple *stmt, bool callee_only) {
  if (!is_gimple_call(stmt))
    return false;
  tree fn = gimple_call_fndecl(stmt);
  const char *name = fn && DECL_NAME(fn) ? IDENTIFIER_POINTER(DECL_NAME(fn)) : "";
  if (callee_only)
    return startswith(name, "__gcov_indirect_call_profiler");
  return startswith(name, "__gcov_") && strstr(name, "_profiler");
}

// x86-64's early start-up code (__head: .head.text) runs from the identity mapping, before the kernel's own
// addresses are mapped: it may touch counters RIP-relative (arcs) but must not pass their absolute addresses to a
// profiler, which is how GCC calls the value profilers.
static bool runs_unmapped(const function *fn) {
  const char *section = DECL_SECTION_NAME(fn->decl);
  return section && startswith(section, ".head.text");
}

static tree find_tuple(tree *tp, int *walk_subtrees, void *) {
  if (is_tuple(*tp))
    return *tp;
  if (TYPE_P(*tp))
    *walk_subtrees = 0;
  return NULL_TREE;
}

namespace {
const pass_data kPassData = {
    GIMPLE_PASS, "kpgo_gcov_percpu", OPTGROUP_NONE, TV_NONE, PROP_ssa, 0, 0, 0, 0,
};

struct percpu_pass : gimple_opt_pass {
  explicit percpu_pass(gcc::context *ctx) : gimple_opt_pass(kPassData, ctx) {}
  unsigned int execute(function *fn) override {
    bool changed = false, weak = DECL_WEAK(fn->decl), unmapped = runs_unmapped(fn);
    basic_block bb;
    FOR_EACH_BB_FN(bb, fn) {
      for (gimple_stmt_iterator gsi = gsi_start_bb(bb); !gsi_end_p(gsi);) {
        gimple *stmt = gsi_stmt(gsi);
        if (is_value_profiler(stmt, !unmapped) && (weak || unmapped)) {
          // A weak function's own address may resolve at link time to the definition that overrides it, an
          // __init one (arch_cpuhp_init_parallel_bringup): the reference would be a section mismatch. Weak
          // defaults are seldom called through pointers; they record no indirect-call target. Code that runs
          // unmapped records no values at all.
          unlink_stmt_vdef(stmt);
          gsi_remove(&gsi, true);
          release_defs(stmt);
          changed = true;
          continue;
        }
        if (gimple_assign_single_p(stmt)) {
          tree lhs = gimple_assign_lhs(stmt), rhs = gimple_assign_rhs1(stmt);
          HOST_WIDE_INT store_at = field_offset(lhs), load_at = field_offset(rhs);
          gasm *a = NULL;
          if (store_at >= 0 && !walk_tree(&rhs, find_tuple, NULL, NULL))
            a = percpu_move(store_at, rhs, true);
          else if (load_at >= 0 && TREE_CODE(lhs) == SSA_NAME)
            a = percpu_move(load_at, lhs, false);
          if (a) {
            gimple_set_location(a, gimple_location(stmt));
            if (gimple_vdef(stmt))
              unlink_stmt_vdef(stmt);
            gsi_replace(&gsi, a, false);
            if (TREE_CODE(lhs) == SSA_NAME)
              SSA_NAME_DEF_STMT(lhs) = a;
            update_stmt(a);
            changed = true;
            gsi_next(&gsi);
            continue;
          }
        }
        struct walk_stmt_info wi;
        memset(&wi, 0, sizeof wi);
        if (walk_gimple_op(stmt, find_tuple, &wi))
          error_at(gimple_location(stmt), "kpgo: a use of %qs this plugin cannot make per-CPU", kTuple);
        gsi_next(&gsi);
      }
    }
    if (changed)
      mark_virtual_operands_for_renaming(fn);
    return changed ? TODO_update_ssa_only_virtuals : 0;
  }
};
}  // namespace

int plugin_init(struct plugin_name_args *info, struct plugin_gcc_version *version) {
  if (!plugin_default_version_check(version, &gcc_version)) {
    error("kpgo: %s was built for GCC %s, not this compiler (%s); rebuild it", info->base_name,
          gcc_version.basever, version->basever);
    return 1;
  }
  struct register_pass_info pass;
  pass.pass = new percpu_pass(g);
  pass.reference_pass_name = "optimized";
  pass.ref_pass_instance_number = 1;
  pass.pos_op = PASS_POS_INSERT_AFTER;
  register_callback(info->base_name, PLUGIN_PASS_MANAGER_SETUP, NULL, &pass);
  return 0;
}
