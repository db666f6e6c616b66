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

int plugin_is_GPL_compatible;

static const char *const kTuple = "__gcov_indirect_call";
static const char *const kPerCpu = "__kpgo_indirect_call";

static bool is_tuple(const_tree t) {
  return t && TREE_CODE(t) == VAR_DECL && DECL_NAME(t) && !strcmp(IDENTIFIER_POINTER(DECL_NAME(t)), kTuple);
}

// The byte offset of `ref` in the tuple when it is tuple.field, else -1.
static HOST_WIDE_INT field_offset(const_tree ref) {
  if (TREE_CODE(ref) != COMPONENT_REF || !is_tuple(TREE_OPERAND(ref, 0)) || TREE_OPERAND(ref, 2))
    return -1;
  tree field = TREE_OPERAND(ref, 1);
  if (!tree_fits_shwi_p(DECL_FIELD_OFFSET(field)) || !tree_fits_shwi_p(DECL_FIELD_BIT_OFFSET(field)))
    return -1;
  HOST_WIDE_INT bits = tree_to_shwi(DECL_FIELD_BIT_OFFSET(field));
  if (bits % BITS_PER_UNIT || tree_to_shwi(TYPE_SIZE(TREE_TYPE(ref))) != 64)
    return -1;
  return tree_to_shwi(DECL_FIELD_OFFSET(field)) + bits / BITS_PER_UNIT;
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
    bool changed = false;
    basic_block bb;
    FOR_EACH_BB_FN(bb, fn) {
      for (gimple_stmt_iterator gsi = gsi_start_bb(bb); !gsi_end_p(gsi); gsi_next(&gsi)) {
        gimple *stmt = gsi_stmt(gsi);
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
            continue;
          }
        }
        struct walk_stmt_info wi;
        memset(&wi, 0, sizeof wi);
        if (walk_gimple_op(stmt, find_tuple, &wi))
          error_at(gimple_location(stmt), "kpgo: a use of %qs this plugin cannot make per-CPU", kTuple);
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
