// Which ops of a training step run in half precision: the allow / infer / deny lists of the
// loss-aware AMP rewrite, and the painting over a graph described without TensorFlow types
// (kernels/mixed_precision/half_rewrite_pass.cc builds that description and rewrites the graph).
//
// The rule, in topological order:
//   - allow (compute-heavy: MatMul, BatchMatMul, Conv, Einsum) -> half;
//   - infer (elementwise and data-movement ops) -> half when at least one float input is half and
//     every other float input is half or a parameter (a variable read or a constant), so the
//     elementwise ops between and after half matmuls follow them, while an op that mixes a half
//     value with another fp32 value (a label, an incoming loss gradient) stays fp32;
//   - everything else, and every op named in deny -> fp32: reductions and losses, softmax / log /
//     exp, embedding lookups and their combiners, tables, optimizer updates (master weights).
// A node the rewrite cannot convert (no half kernel on its device, inside a loop frame, a float
// argument not typed by the attribute T) is never half.
#ifndef TF_EXT_KERNELS_MIXED_PRECISION_CORE_HALF_PRECISION_PLAN_H_
#define TF_EXT_KERNELS_MIXED_PRECISION_CORE_HALF_PRECISION_PLAN_H_

#include <set>
#include <string>
#include <vector>

namespace tf_ext {
namespace amp {

struct OpLists {
  std::set<std::string> allow;
  std::set<std::string> infer;
  std::set<std::string> deny;  // wins over both others

  // The built-in lists, with `allow_add` / `infer_add` added and `deny_add` denied.
  static OpLists Default(const std::vector<std::string>& allow_add = {},
                         const std::vector<std::string>& infer_add = {},
                         const std::vector<std::string>& deny_add = {});
  bool Denied(const std::string& op) const;  // also true for a fusion of a denied op
  bool Allowed(const std::string& op) const;
  bool Inferred(const std::string& op) const;
};

struct PlanNode {
  std::string op;
  bool convertible = false;  // the rewrite can make a half copy of it
  bool parameter = false;    // a variable read or a constant: cast freely at a boundary
  // Producers of its float (T-typed) data inputs, as indices into the plan's nodes.
  std::vector<int> float_inputs;
};

// `nodes` in topological order (producers first). Returns, per node, whether it runs in half.
std::vector<bool> PaintHalf(const std::vector<PlanNode>& nodes, const OpLists& lists);

}  // namespace amp
}  // namespace tf_ext

#endif  // TF_EXT_KERNELS_MIXED_PRECISION_CORE_HALF_PRECISION_PLAN_H_
