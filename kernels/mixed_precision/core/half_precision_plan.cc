#include "kernels/mixed_precision/core/half_precision_plan.h"

#include <map>

namespace tf_ext {
namespace amp {
namespace {

// Compute-heavy ops with half kernels, where half precision pays.
const char* const kAllow[] = {
    "MatMul",
    "_FusedMatMul",
    "BatchMatMul",
    "BatchMatMulV2",
    "BatchMatMulV3",
    "Einsum",
    "Conv2D",
    "Conv2DBackpropInput",
    "Conv2DBackpropFilter",
    "_FusedConv2D",
    "Conv3D",
    "Conv3DBackpropInputV2",
    "Conv3DBackpropFilterV2",
    "DepthwiseConv2dNative",
    "DepthwiseConv2dNativeBackpropInput",
    "DepthwiseConv2dNativeBackpropFilter",
};

// Elementwise and data-movement ops whose precision follows their inputs (TensorFlow's own
// auto_mixed_precision keeps the same kind in its infer and clear lists).
const char* const kInfer[] = {
    "Add",        "AddV2",       "AddN",      "BiasAdd",       "BiasAddGrad",  "Sub",
    "Mul",        "Neg",         "Abs",       "Square",        "Maximum",      "Minimum",
    "Relu",       "ReluGrad",    "Relu6",     "Relu6Grad",     "Elu",          "EluGrad",
    "Selu",       "SeluGrad",    "LeakyRelu", "LeakyReluGrad", "Tanh",         "TanhGrad",
    "Sigmoid",    "SigmoidGrad", "Gelu",      "GeluGrad",      "Identity",     "Snapshot",
    "Reshape",    "Transpose",   "ConcatV2",  "Slice",         "StridedSlice", "Squeeze",
    "ExpandDims", "Pack",        "Tile",      "Select",        "SelectV2",     "ZerosLike",
    "OnesLike",   "Pad",         "PadV2",
};

}  // namespace

OpLists OpLists::Default(const std::vector<std::string>& allow_add,
                         const std::vector<std::string>& infer_add,
                         const std::vector<std::string>& deny_add) {
  OpLists lists;
  lists.allow.insert(std::begin(kAllow), std::end(kAllow));
  lists.infer.insert(std::begin(kInfer), std::end(kInfer));
  lists.allow.insert(allow_add.begin(), allow_add.end());
  lists.infer.insert(infer_add.begin(), infer_add.end());
  lists.deny.insert(deny_add.begin(), deny_add.end());
  return lists;
}

bool OpLists::Denied(const std::string& op) const {
  // Grappler's fusions stand for the op they start with: denying MatMul denies _FusedMatMul.
  static const std::map<std::string, std::string> kFusedBase = {{"_FusedMatMul", "MatMul"},
                                                                {"_FusedConv2D", "Conv2D"}};
  const auto base = kFusedBase.find(op);
  return deny.count(op) > 0 || (base != kFusedBase.end() && deny.count(base->second) > 0);
}

bool OpLists::Allowed(const std::string& op) const { return allow.count(op) > 0 && !Denied(op); }

bool OpLists::Inferred(const std::string& op) const {
  return infer.count(op) > 0 && allow.count(op) == 0 && !Denied(op);
}

std::vector<bool> PaintHalf(const std::vector<PlanNode>& nodes, const OpLists& lists) {
  std::vector<bool> half(nodes.size(), false);
  for (size_t i = 0; i < nodes.size(); ++i) {
    const PlanNode& node = nodes[i];
    if (!node.convertible || node.float_inputs.empty()) continue;
    if (lists.Allowed(node.op)) {
      half[i] = true;
      continue;
    }
    if (!lists.Inferred(node.op)) continue;
    bool any_half = false, others_castable = true;
    for (int producer : node.float_inputs) {
      if (half[producer]) {
        any_half = true;
      } else if (!nodes[producer].parameter) {
        others_castable = false;
      }
    }
    half[i] = any_half && others_castable;
  }
  return half;
}

}  // namespace amp
}  // namespace tf_ext
