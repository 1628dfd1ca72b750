"""SavedModel export of models with dynamic embedding tables.

- `export_for_serving(obj, export_dir, signatures=None)` (Keras models, tf.Modules) and
  `export_estimator_for_serving(estimator, export_dir_base, serving_input_receiver_fn)`: core
  TensorFlow ops only, for stock TensorFlow Serving and plain TensorFlow (no tf_ext needed).
- `tf.saved_model.save` / `model.save` / `estimator.export_saved_model` as they are: full
  fidelity (rows, optimizer slots, counts), for warm-starting training; loading needs tf_ext.
"""

from tf_ext.dynamic_embedding.saved_model.serving import (
  ServingTable,
  default_row,
  export_estimator_for_serving,
  export_for_serving,
)

__all__ = [
  "ServingTable",
  "default_row",
  "export_estimator_for_serving",
  "export_for_serving",
]
