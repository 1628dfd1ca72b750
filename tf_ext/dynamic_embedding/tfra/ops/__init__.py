"""TFRA's `dynamic_embedding.python.ops` modules that user code imports by path. TFRA backs them
with GPU kernels of its own; here they are TensorFlow's ops, which run on the CPU and the GPU."""

from tf_ext.dynamic_embedding.tfra.ops import (
  data_flow_grad,
  data_flow_ops,
  math_ops,
  ragged_embedding_ops,
  shadow_embedding_ops,
)

__all__ = [
  "data_flow_grad",
  "data_flow_ops",
  "math_ops",
  "ragged_embedding_ops",
  "shadow_embedding_ops",
]
