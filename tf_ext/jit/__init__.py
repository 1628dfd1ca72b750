"""tf_ext.jit: an adaptive XLA compilation cache for TF2 functions with varying input shapes.

`tf_ext.jit.function(fn, paddable=..., ...)` is a drop-in for tf.function(jit_compile=True) that
pads declared dimensions (batch, sequence length) to a few buckets planned from the observed
sizes, compiles each bucket in the background (a call never waits for the compiler), keeps at
most a configured number of executables and saves its bucket plan for a warm restart. Inside the
function, `size`, `mask`, `masked_sum` and `masked_mean` exclude padded positions.
tf_ext/jit/function.py documents the padding contract; tf_ext/jit/buckets.py the planning;
tf_ext/jit/options.py declares the options that function, compile and Bucketing take.

For Keras, `tf_ext.jit.compile(model, optimizer=..., loss=..., ...)` (or on a compiled model)
runs fit / evaluate / predict through such functions, padding the batch and masking padded rows
out of the compiled loss and metrics; `tf_ext.jit.functions(model)` gives their statistics
(tf_ext/jit/keras.py).

For TF1 Sessions and Estimator, `tf_ext.jit.Bucketing` pads the batches of the input pipeline to
planned buckets, so that the XLA clusters of the model (tf_ext.graph's dense-part
pass, auto-jit or a jit_scope) compile once per bucket, in the background; `Bucketing.padded`
makes the same helpers work in a model_fn, and `unpad` slices predictions back to the real rows
(tf_ext/jit/bucketing.py); its speed gate runs each cluster compiled only where that is faster
(`speed_verdicts()`). `compile_log()` lists every XLA compilation of the process.
"""

from tf_ext.jit import buckets
from tf_ext.jit.bucketing import SIZES_KEY, Bucketing, unpad
from tf_ext.jit.function import Function, function
from tf_ext.jit.keras import compile, functions
from tf_ext.jit.xla_compiles import (
  compile_count,
  compile_log,
  listener_active,
  set_async_compilation,
  set_speed_gate,
  speed_verdicts,
)
from tf_ext.padding import mask, masked_mean, masked_sum, size

__all__ = [
  "SIZES_KEY",
  "Bucketing",
  "Function",
  "compile",
  "compile_count",
  "compile_log",
  "function",
  "functions",
  "listener_active",
  "mask",
  "masked_mean",
  "masked_sum",
  "set_async_compilation",
  "set_speed_gate",
  "size",
  "speed_verdicts",
  "unpad",
]
