#!/usr/bin/env python3
"""Loss-aware mixed precision (issue 10): training speed and accuracy of tf_ext's
LossAwareOptimizer ("ours") against float32 and TensorFlow's own AMP, every ratio taken in one run.

Speed: a DLRM/DCN-style tower (26 Zipf id fields through one tf_ext DynamicEmbedding table of dim
16, 13 dense features, MLP --speed-hidden, batch --speed-batch, Adam wrapped by
tf_ext.DynamicEmbeddingOptimizer, Keras fit) in variants built side by side: float32; Keras'
`mixed_bfloat16` policy; TensorFlow's Grappler rewrite `auto_mixed_precision_onednn_bfloat16`
(switched on only while its variant runs; the script checks with a probe MatMul whether it
rewrites anything on this CPU); ours, `amp.LossAwareOptimizer(..., half=--speed-half)` over the
float32 model (half="auto" runs float32 on a CPU without AVX512_BF16 / AMX); and, when that is not
bf16 already, ours with half="bfloat16" forced. Timed in --speed-rounds interleaved rounds of
--speed-steps steps (rotating order; each round's first step is not timed); steps/s of each
variant's best round (a shared machine's load only slows a round down) and the median over the
rounds; ratios of the best rounds (used for the targets) and, beside them, the median
of the rounds' ratios (each round's variants ran within seconds of each other).
Targets by CPU feature (for ours as --speed-half gives it): >= 1.5x float32 with AMX (amx_bf16 /
amx_tile), >= 1.2x with AVX512_BF16 only, >= 0.95x TensorFlow's AMP everywhere (against the
faster of its two variants); on a CPU with neither bf16 feature the first two do not apply.

Accuracy: three seeded synthetic tasks (benchmarks/_amp_tasks.py), each trained one pass in one
run as float32, with TensorFlow's own AMP (a Keras global policy while the model is built; the
last Dense layer float32 as Keras' guide recommends; mixed_float16 adds Keras'
LossScaleOptimizer) and with ours (the float32 model, no policy, LossAwareOptimizer), from the
same initial weights, and evaluated with `predict` on held-out data as each was trained:
  (a) benign CTR with tf_ext tables (AUC): ours within 0.5% of float32 and >= 90% of steps in half;
  (b) raw counts ~1e5 into a Dense layer, regression target ~1e5 (R2): fp16 overflows (65504);
      Keras mixed_float16 + LossScaleOptimizer fails, ours with half="float16" within 0.5%;
  (c) coordinates of one metro area normalised inside the model (R2): bf16 rounds them to 0.25
      degree steps; Keras mixed_bfloat16 ends > 1% worse, ours with half="bfloat16" within 0.5%.
Per task: the metric of each variant, ours' ratio to float32 and to TensorFlow's AMP, ours'
fraction of steps in half, switches, skipped steps and last fallback, and PASS/MISS lines (the
exit status is 0 whatever the numbers). A PNG (--png) plots, for ours on each task, the loss per
step (float32's and TensorFlow AMP's beside it), the precision per step (half=1, full=0) and the
loss scale. Without tf_ext.mixed_precision.LossAwareOptimizer, ours is reported as not available.

The default takes about 4 to 5 minutes on a 2-CPU AVX2 machine; --quick (a smaller tower, fewer
steps) well under a minute.

  python benchmarks/amp.py
  python benchmarks/amp.py --quick --json /tmp/amp.json --png /tmp/amp.png
  python benchmarks/amp.py --tasks b,c --no-speed
"""

import math
import os
import sys
import time
import warnings

from _common import (  # noqa: E402 (benchmarks/ is on sys.path)
  add_intra_op_threads,
  add_json,
  argument_parser,
  chart_path,
  cpu_model_and_flags,
  finish,
  int_list,
  log,
  machine_report,
  require_positive,
  rotated,
  save_figure,
  use_checkout,
  verdict,
  versions,
  write_chart,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
use_checkout()

import _amp_tasks  # noqa: E402
import numpy as np  # noqa: E402

AMP_FLAGS = ("avx512f", "avx512_bf16", "amx_bf16", "amx_tile")
SPEED_AMX, SPEED_AVX512_BF16, SPEED_VS_TF = 1.5, 1.2, 0.95
WITHIN_FP32 = 0.005  # ours ends within 0.5% of float32's metric
HALF_FRACTION = 0.90  # task (a): ours spends >= 90% of its steps in half
BASELINE_LOSS = 0.01  # task (c): plain bf16 ends more than 1% worse than float32
VARIANTS = ("fp32", "tf_amp", "ours")
DEFAULT_PNG = chart_path("amp.png")


def parse_args(argv=None):
  p = argument_parser(__doc__)
  p.add_argument("--quick", action="store_true", help="small tower, fewer steps: under a minute")
  p.add_argument("--seed", type=int, default=2026, help="data and initial weights")
  p.add_argument("--tasks", default="a,b,c", help="accuracy tasks to run (of a, b, c)")
  p.add_argument("--no-speed", action="store_true", help="skip the speed comparison")
  p.add_argument("--speed-batch", type=int, default=4096, help="speed tower batch (quick: 1024)")
  p.add_argument(
    "--speed-hidden", default="1024,1024,512,256", help="speed tower MLP (quick: 512,512,256)"
  )
  p.add_argument("--speed-rounds", type=int, default=8, help="interleaved rounds (quick: 2)")
  p.add_argument(
    "--speed-steps", type=int, default=4, help="steps per variant and round, the first untimed"
  )
  p.add_argument(
    "--speed-half",
    default="auto",
    choices=("auto", "bfloat16", "float16"),
    help="ours' half precision in the speed comparison",
  )
  p.add_argument("--steps-scale", type=float, default=1.0, help="scales every task's steps")
  p.add_argument("--test-samples", type=int, default=50_000, help="held-out samples per task")
  p.add_argument("--png", default=DEFAULT_PNG, help="chart path ('' for none)")
  add_intra_op_threads(p)
  add_json(p)
  args = p.parse_args(argv)
  if args.quick:
    defaults = {"speed_batch": 4096, "speed_hidden": "1024,1024,512,256", "speed_rounds": 8}
    quick = {"speed_batch": 1024, "speed_hidden": "512,512,256", "speed_rounds": 2}
    for k, v in quick.items():
      if getattr(args, k) == defaults[k]:
        setattr(args, k, v)
    if args.test_samples == 50_000:
      args.test_samples = 20_000
  args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
  known = {t.key for t in _amp_tasks.TASKS}
  if not set(args.tasks) <= known:
    p.error(f"--tasks: unknown {sorted(set(args.tasks) - known)} (of {sorted(known)})")
  args.speed_hidden = int_list(args.speed_hidden)
  require_positive(p, args, ["speed_batch", "speed_rounds", "test_samples"])
  if args.speed_steps < 2:
    p.error("--speed-steps must be >= 2 (the first step of a round is not timed)")
  return args


# ---- ours -------------------------------------------------------------------------------------


def import_ours():
  """(tf_ext.mixed_precision, None) when LossAwareOptimizer is importable, else (None, why)."""
  try:
    import tf_ext.mixed_precision as amp  # pylint: disable=import-outside-toplevel

    for name in ("LossAwareOptimizer", "report"):
      if not hasattr(amp, name):
        raise ImportError(f"tf_ext.mixed_precision has no {name} yet")
    return amp, None
  except Exception as error:  # ImportError, or an op library that fails to load
    return None, f"{type(error).__name__}: {error}"


def short_error(error, limit=300):
  """A one-line description of an exception: its type and the last line of its message (a
  tf.function's "in user code:" traceback ends with the actual error)."""
  lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
  return f"{type(error).__name__}: {(lines[-1] if lines else '')[:limit]}"


def state_values(amp, opt):
  """The policy's state fields, read in one variable read (cheap enough for every step)."""
  return dict(zip(amp.STATE_FIELDS, amp.policy_of(opt).state.numpy()))


# ---- helpers ----------------------------------------------------------------------------------


def build_with_policy(tf, policy, build):
  """Builds a model with the Keras global dtype policy `policy` (None: float32) active."""
  tf.keras.mixed_precision.set_global_policy(policy or "float32")
  try:
    return build()
  finally:
    tf.keras.mixed_precision.set_global_policy("float32")


def grappler_rewrites(tf):
  """Whether TensorFlow's auto_mixed_precision_onednn_bfloat16 rewrite changes anything on this
  machine: a float32 MatMul in a tf.function, with the rewrite off and on (on a CPU without bf16
  support TensorFlow 2.15 leaves the graph in float32, and the results are bit-identical)."""
  x = tf.random.stateless_normal([64, 256], seed=[1, 2])
  w = tf.random.stateless_normal([256, 64], seed=[3, 4])

  def product(x, w):
    return tf.matmul(x, w)

  plain = tf.function(product)(x, w).numpy()
  with grappler_bf16(tf, True):
    rewritten = tf.function(product)(x, w).numpy()
  return not np.array_equal(plain, rewritten)


class grappler_bf16:  # noqa: N801 (a context manager, used like a function)
  """`with grappler_bf16(on):` TensorFlow's auto_mixed_precision_onednn_bfloat16 rewrite on (or
  left as it is) for the block's function calls, off again after."""

  def __init__(self, tf, on):
    self.tf, self.on = tf, on

  def __enter__(self):
    if self.on:
      self.tf.config.optimizer.set_experimental_options(
        {"auto_mixed_precision_onednn_bfloat16": True}
      )

  def __exit__(self, *exc_info):
    if self.on:
      self.tf.config.optimizer.set_experimental_options(
        {"auto_mixed_precision_onednn_bfloat16": False}
      )
    return False


def make_last_loss_metric(tf, loss_fn):
  class BatchLoss(tf.keras.metrics.Metric):
    """The loss of the last batch alone (Keras' own loss log is a running mean)."""

    def __init__(self, name="batch_loss"):
      super().__init__(name=name, dtype="float32")
      self.value = self.add_weight(name="value", initializer="zeros")

    def update_state(self, y_true, y_pred, sample_weight=None):
      y_true = tf.reshape(tf.cast(y_true, tf.float32), [-1, 1])
      self.value.assign(tf.cast(loss_fn(y_true, tf.cast(y_pred, tf.float32)), tf.float32))

    def result(self):
      return self.value

    def reset_state(self):
      self.value.assign(0.0)

  return BatchLoss()


def make_trace_callback(tf, amp, opt, tf_loss_scale_opt=None):
  class Trace(tf.keras.callbacks.Callback):
    """Per step: the batch loss; ours: precision (from the half-step count), loss scale;
    Keras' LossScaleOptimizer: its loss scale."""

    def __init__(self):
      super().__init__()
      self.loss, self.half, self.scale = [], [], []
      self._half_steps = 0

    def on_train_batch_end(self, batch, logs=None):
      self.loss.append(float((logs or {}).get("batch_loss", float("nan"))))
      if amp is not None:
        r = state_values(amp, opt)
        half_steps = int(r["half_steps"])
        self.half.append(1 if half_steps > self._half_steps else 0)
        self._half_steps = half_steps
        self.scale.append(float(r["loss_scale"]))
      elif tf_loss_scale_opt is not None:
        self.scale.append(float(tf_loss_scale_opt.loss_scale.numpy()))

  return Trace()


def adam(tf, lr, tables, tf_ext):
  opt = tf.keras.optimizers.Adam(lr)
  return tf_ext.DynamicEmbeddingOptimizer(opt) if tables else opt


# ---- speed ------------------------------------------------------------------------------------

SPEED_LABELS = {
  "fp32": "float32",
  "keras_bf16": "TF AMP: Keras mixed_bfloat16",
  "grappler_bf16": "TF AMP: Grappler onednn_bfloat16",
  "ours": "ours: LossAwareOptimizer",
  "ours_bf16": "ours, half='bfloat16' forced",
}


def resolved_half(tf, amp, half):
  """What ours runs for `half`: "bfloat16", "float16" or "float32" (half="auto" without fast
  half-precision hardware)."""
  if half != "auto":
    return half
  dtype = amp.auto_half_dtype() if hasattr(amp, "auto_half_dtype") else tf.bfloat16
  return "float32" if dtype is None else tf.as_dtype(dtype).name


def speed_section(tf, tf_ext, amp, ours_error, args):
  """Builds the towers, times them in interleaved rounds; the results' "speed" entry."""
  rng = np.random.default_rng(args.seed)
  batches = 4
  (ids, dense), label = _amp_tasks.speed_data(rng, batches * args.speed_batch)
  ds = (
    tf.data.Dataset.from_tensor_slices(((ids, dense), label))
    .batch(args.speed_batch, drop_remainder=True)
    .cache()
    .repeat()
    .prefetch(2)
  )
  loss = tf.keras.losses.BinaryCrossentropy(from_logits=True)
  models, errors, opts = {}, {}, {}
  half = {"ours": args.speed_half, "ours_bf16": "bfloat16"}
  names = list(SPEED_LABELS)
  if amp is not None and resolved_half(tf, amp, args.speed_half) == "bfloat16":
    names.remove("ours_bf16")  # the same as ours
  for name in names:
    if name.startswith("ours") and amp is None:
      if name == "ours":
        errors[name] = f"not available ({ours_error})"
      continue
    try:
      tf.keras.utils.set_random_seed(args.seed)
      policy = "mixed_bfloat16" if name == "keras_bf16" else None
      model = build_with_policy(
        tf,
        policy,
        lambda name=name: _amp_tasks.speed_model(tf, tf_ext, args.speed_hidden, f"speed_{name}"),
      )
      opt = adam(tf, 1e-3, True, tf_ext)
      if name.startswith("ours"):
        opt = amp.LossAwareOptimizer(opt, half=half[name])
      model.compile(optimizer=opt, loss=loss)
      with grappler_bf16(tf, name == "grappler_bf16"):
        t = time.perf_counter()
        model.fit(ds, steps_per_epoch=2, epochs=1, verbose=0)  # trace, build, warm up
      log(f"[speed] {name}: built and warmed up in {time.perf_counter() - t:.1f}s")
      models[name], opts[name] = model, opt
    except Exception as error:  # pylint: disable=broad-except
      errors[name] = f"failed ({short_error(error)})"
      log(f"[speed] {name}: {errors[name]}")

  class StepTimes(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
      self.times.append(time.perf_counter())

  rates = {name: [] for name in models}
  names = list(models)
  for r in range(args.speed_rounds):
    for name in rotated(names, r):
      timer = StepTimes()
      timer.times = []
      with grappler_bf16(tf, name == "grappler_bf16"):
        models[name].fit(
          ds, steps_per_epoch=args.speed_steps, epochs=1, verbose=0, callbacks=[timer]
        )
      rates[name].append((len(timer.times) - 1) / (timer.times[-1] - timer.times[0]))
    log(
      f"[speed] round {r + 1}/{args.speed_rounds}: "
      + ", ".join(f"{n} {rates[n][-1]:.2f} steps/s" for n in names)
    )
  state = {n: amp.report(opts[n]) for n in ("ours", "ours_bf16") if n in models}
  out = {"steps_per_s": {}, "ratios": {}, "errors": errors, "ours_state": state}
  if amp is not None:
    out["ours_half"] = resolved_half(tf, amp, args.speed_half)
  out["grappler_rewrites"] = grappler_rewrites(tf)
  # A shared machine's load only ever slows a round down: each variant's best round is its
  # least disturbed figure, and the ratios use them; the median of the rounds' ratios is shown
  # beside them.
  out["median_steps_per_s"], out["round_ratios"] = {}, {}
  for name in names:
    out["steps_per_s"][name] = float(np.max(rates[name]))
    out["median_steps_per_s"][name] = float(np.median(rates[name]))
    out[f"rounds_{name}"] = rates[name]
  pairs = [(n, "fp32") for n in names if n != "fp32"]
  pairs += [(o, n) for o in ("ours", "ours_bf16") for n in ("keras_bf16", "grappler_bf16")]
  for a, b in pairs:
    if a in rates and b in rates:
      out["ratios"][f"{a}/{b}"] = out["steps_per_s"][a] / out["steps_per_s"][b]
      out["round_ratios"][f"{a}/{b}"] = float(
        np.median([x / y for x, y in zip(rates[a], rates[b])])
      )
  return out


def print_speed(speed, flags, args):
  print()
  print(
    f"speed: DLRM/DCN-style tower, 26 id fields -> one tf_ext table (dim 16) + 13 dense, MLP "
    f"{'-'.join(map(str, args.speed_hidden))}, batch {args.speed_batch}, Adam, Keras fit; "
    f"{args.speed_rounds} interleaved rounds of {args.speed_steps - 1} timed steps"
  )
  print(
    f"  {'steps/s:':<34} {'best':>6} {'median':>7} {'samples/s':>10} {'x float32':>9} "
    "  x float32, median of rounds"
  )
  for name, label in SPEED_LABELS.items():
    if name in speed["steps_per_s"]:
      v = speed["steps_per_s"][name]
      ratio = speed["ratios"].get(f"{name}/fp32", 1.0 if name == "fp32" else None)
      rounds = speed["round_ratios"].get(f"{name}/fp32", 1.0 if name == "fp32" else None)
      print(
        f"  {label:<34} {v:6.2f} {speed['median_steps_per_s'][name]:7.2f} "
        f"{v * args.speed_batch:>10,.0f} {fmt(ratio, '.2f'):>8}x {fmt(rounds, '.2f'):>27}x"
      )
    elif name in speed["errors"]:
      print(f"  {label:<34} {speed['errors'][name]}")
  for ours, s in speed["ours_state"].items():
    half = args.speed_half if ours == "ours" else "bfloat16"
    runs = f", runs {speed['ours_half']} here" if ours == "ours" and half == "auto" else ""
    print(
      f"  {ours} (half={half!r}{runs}) after the speed runs: {s['half_fraction']:.0%} of "
      f"{int(s['steps'])} steps in half, {int(s['switches'])} switches, "
      f"{int(s['skipped_steps'])} skipped"
    )
  for ours in ("ours", "ours_bf16"):
    for name in ("keras_bf16", "grappler_bf16"):
      if f"{ours}/{name}" in speed["ratios"]:
        print(
          f"  {ours} / {SPEED_LABELS[name]}: {speed['ratios'][f'{ours}/{name}']:.2f}x (median "
          f"of the rounds' ratios {speed['round_ratios'][f'{ours}/{name}']:.2f}x)"
        )
  if "grappler_bf16" in speed["steps_per_s"]:
    if speed["grappler_rewrites"]:
      print(
        "  (Grappler's onednn_bfloat16 rewrite is active here: a probe MatMul's result changed)"
      )
    else:
      print(
        "  (Grappler's onednn_bfloat16 rewrite is inactive on this CPU: a probe MatMul gives "
        "bit-identical results with it on and off, so that variant runs float32)"
      )


def speed_targets(speed, flags, targets):
  ours = speed["ratios"].get("ours/fp32")
  has_amx = "amx_bf16" in flags or "amx_tile" in flags
  has_bf16 = "avx512_bf16" in flags
  if has_amx:
    applies, need = "AMX", SPEED_AMX
  elif has_bf16:
    applies, need = "AVX512_BF16", SPEED_AVX512_BF16
  else:
    applies, need = None, None
  line = "ours training steps/s >= {:g}x float32 on a CPU with {}"
  for feature, target in (("AMX", SPEED_AMX), ("AVX512_BF16 only", SPEED_AVX512_BF16)):
    text = line.format(target, feature)
    if applies is None or not feature.startswith(applies):
      why = (
        "this CPU has no bf16 hardware (no avx512_bf16, amx_bf16, amx_tile)"
        if applies is None
        else f"this CPU has {applies}"
      )
      measured = f"; measured {ours:.2f}x" if ours is not None else ""
      print(f"  n/a   {text}: does not apply, {why}{measured}")
      continue
    if ours is None:
      print(f"  n/a   {text}: ours not measured")
      targets[f"speed_vs_fp32_{applies}"] = {"ratio": None, "pass": None}
      continue
    ok = ours >= need
    targets[f"speed_vs_fp32_{applies}"] = {"ratio": ours, "pass": ok}
    print(f"  {verdict(ok)}  {text}: {ours:.2f}x")
  # Against TensorFlow's AMP, ours must run half too: with half="auto" on a CPU without bf16
  # hardware ours runs float32, so the forced-bf16 run is the one compared; and only TF variants
  # that really run bf16 count (Grappler's rewrite does nothing on such a CPU).
  ours_half = "ours" if speed.get("ours_half") == "bfloat16" else "ours_bf16"
  real_tf = [
    n for n in ("keras_bf16", "grappler_bf16") if n != "grappler_bf16" or speed["grappler_rewrites"]
  ]
  vs = {
    n: speed["ratios"][f"{ours_half}/{n}"] for n in real_tf if f"{ours_half}/{n}" in speed["ratios"]
  }
  text = (
    f"ours (bf16) training steps/s >= {SPEED_VS_TF:g}x TensorFlow's own AMP (each variant that "
    "runs bf16 here)"
  )
  if not vs:
    print(f"  n/a   {text}: not measured")
    targets["speed_vs_tf_amp"] = {"ratio": None, "pass": None}
    return
  worst = min(vs, key=vs.get)
  ok = vs[worst] >= SPEED_VS_TF
  targets["speed_vs_tf_amp"] = {"ratio": vs[worst], "against": worst, "pass": ok}
  print(f"  {verdict(ok)}  {text}: {vs[worst]:.2f}x ({SPEED_LABELS[worst]})")
  if ours_half != "ours" and "ours/fp32" in speed["ratios"]:
    print(
      f"  info  ours with half='auto' runs float32 on this CPU: "
      f"{speed['ratios']['ours/fp32']:.2f}x float32"
    )


# ---- accuracy tasks ---------------------------------------------------------------------------


def run_variant(tf, tf_ext, amp, task, variant, train, test, args):
  """Trains one variant of a task, one pass over `train`; its result."""
  steps = len(train[1]) // task.batch_size
  tf.keras.utils.set_random_seed(args.seed)
  policy = task.tf_amp if variant == "tf_amp" else None
  model = build_with_policy(
    tf, policy, lambda: task.build(tf, tf_ext, train, f"task_{task.key}_{variant}")
  )
  opt = adam(tf, task.learning_rate, task.uses_tables, tf_ext)
  lso = None
  if variant == "tf_amp" and task.tf_amp == "mixed_float16":
    opt = lso = tf.keras.mixed_precision.LossScaleOptimizer(opt)
  if variant == "ours":
    opt = amp.LossAwareOptimizer(opt, half=task.half)
  if task.loss == "mse":
    loss_fn = tf.keras.losses.MeanSquaredError()
  else:
    loss_fn = tf.keras.losses.BinaryCrossentropy(from_logits=task.from_logits)
  model.compile(optimizer=opt, loss=loss_fn, metrics=[make_last_loss_metric(tf, loss_fn)])
  trace = make_trace_callback(tf, amp if variant == "ours" else None, opt, lso)
  t = time.perf_counter()
  model.fit(
    train[0],
    train[1],
    batch_size=task.batch_size,
    epochs=1,
    shuffle=False,
    verbose=0,
    callbacks=[trace],
  )
  seconds = time.perf_counter() - t
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    predictions = model.predict(test[0], batch_size=8192, verbose=0)
  if task.from_logits:
    predictions = 1.0 / (1.0 + np.exp(-np.asarray(predictions, np.float64)))
  result = {
    "metric": task.metric(predictions, test[1]),
    "steps": steps,
    "train_seconds": seconds,
    "loss": trace.loss,
    "nonfinite_steps": int(np.sum(~np.isfinite(trace.loss))),
  }
  if variant == "ours":
    result["state"] = amp.report(opt)
    result["half"], result["scale"] = trace.half, trace.scale
  if lso is not None:
    result["scale"] = trace.scale
    result["final_loss_scale"] = float(lso.loss_scale.numpy())
  return result


def run_task(tf, tf_ext, amp, ours_error, task, args):
  steps = max(10, int(round((task.quick_steps if args.quick else task.steps) * args.steps_scale)))
  rng = np.random.default_rng([args.seed, ord(task.key)])
  t = time.perf_counter()
  train = task.make_data(rng, steps * task.batch_size)
  test = task.make_data(rng, args.test_samples)
  log(
    f"[{task.key}] data: {steps * task.batch_size:,} + {args.test_samples:,} samples "
    f"in {time.perf_counter() - t:.1f}s"
  )
  out = {"steps": steps, "variants": {}, "errors": {}}
  for variant in VARIANTS:
    if variant == "ours" and amp is None:
      out["errors"][variant] = f"not available ({ours_error})"
      continue
    try:
      r = run_variant(tf, tf_ext, amp, task, variant, train, test, args)
      out["variants"][variant] = r
      log(
        f"[{task.key}] {variant}: {task.metric_name} {r['metric']:.4f}, {r['steps']} steps in "
        f"{r['train_seconds']:.1f}s"
      )
    except Exception as error:  # pylint: disable=broad-except
      out["errors"][variant] = f"failed ({short_error(error)})"
      log(f"[{task.key}] {variant}: {out['errors'][variant]}")
  return out


def ratio(a, b):
  if a is None or b is None or not math.isfinite(a) or not math.isfinite(b) or b == 0:
    return None
  return a / b


def within(value, reference, tolerance=WITHIN_FP32):
  """Whether `value` (higher is better) ends within `tolerance` (relative) of `reference`."""
  ok = value is not None and reference is not None and math.isfinite(value)
  return bool(ok and math.isfinite(reference) and value >= reference - tolerance * abs(reference))


def worse_by(value, reference, margin=BASELINE_LOSS):
  """Whether `value` (higher is better) ends more than `margin` (relative) below `reference`."""
  return value < reference - margin * abs(reference)


def fmt(x, spec=".4f"):
  return "n/a" if x is None else ("nan" if not math.isfinite(x) else format(x, spec))


TF_AMP_LABELS = {
  "mixed_bfloat16": "Keras mixed_bfloat16",
  "mixed_float16": "Keras mixed_float16 + LossScaleOptimizer",
}


def print_task(task, res, targets):
  """Prints a task's results and its PASS/MISS lines; keeps the lines in res["verdicts"] (for
  the summary) and the targets in `targets`."""
  v = res["variants"]
  res["verdicts"] = []

  def say(ok, text, key, **entry):
    mark = "n/a " if ok is None else verdict(ok)
    print(f"  {mark}  {text}")
    res["verdicts"].append(f"  {mark}  {task.title.split(')')[0]}) {text}")
    targets[f"task_{task.key}_{key}"] = {**entry, "pass": ok}

  print()
  print(f"{task.title}: {task.design}")
  print(
    f"  {res['steps']} steps of batch {task.batch_size}, Adam lr {task.learning_rate:g}, one "
    f"pass; {task.metric_name} on held-out data (higher is better)"
  )
  labels = {
    "fp32": "float32",
    "tf_amp": f"TF AMP: {TF_AMP_LABELS[task.tf_amp]}",
    "ours": f"ours: LossAwareOptimizer(half={task.half!r})",
  }
  for variant in VARIANTS:
    if variant in v:
      r = v[variant]
      extra = (
        f", {r['nonfinite_steps']} steps with a non-finite loss" if r["nonfinite_steps"] else ""
      )
      if "final_loss_scale" in r:
        extra += f", final loss scale {r['final_loss_scale']:g}"
      print(
        f"  {labels[variant]:<50} {task.metric_name} {fmt(r['metric']):>7}   "
        f"train {r['train_seconds']:5.1f}s{extra}"
      )
    else:
      print(f"  {labels[variant]:<50} {res['errors'].get(variant, 'not run')}")
  fp32 = v.get("fp32", {}).get("metric")
  tfm = v.get("tf_amp", {}).get("metric")
  ours = v.get("ours", {}).get("metric")
  if "ours" in v:
    s = v["ours"]["state"]
    print(
      f"  ours / float32 {fmt(ratio(ours, fp32))}, ours / TF AMP {fmt(ratio(ours, tfm))}; ours "
      f"in half {s['half_fraction']:.1%} of {int(s['steps'])} steps, {int(s['switches'])} "
      f"switches, {int(s['skipped_steps'])} skipped steps, final loss scale "
      f"{s['loss_scale']:g}, last fallback: {fallback_name(s)}, last probe error "
      f"{s['last_probe_error']:.3g}"
    )
  not_ours = f"ours {res['errors'].get('ours', 'not run')}"
  # the task's design checks: TensorFlow's AMP fails where the task says it does
  if task.key == "b" and "tf_amp" in v and fp32 is not None:
    failed = not math.isfinite(tfm) or worse_by(tfm, fp32)
    how = "non-finite predictions" if not math.isfinite(tfm) else f"{fmt(ratio(tfm, fp32))}x"
    say(
      failed,
      f"(task design) TF fp16 AMP diverges or stalls (ends > {BASELINE_LOSS:.0%} below float32): "
      f"{how}",
      "tf_amp_fails",
      ratio=ratio(tfm, fp32),
    )
  if task.key == "c" and "tf_amp" in v and fp32 is not None:
    say(
      not math.isfinite(tfm) or worse_by(tfm, fp32),
      f"(task design) plain bf16 ends > {BASELINE_LOSS:.0%} worse than float32: "
      f"{fmt(ratio(tfm, fp32))}x",
      "tf_amp_worse",
      ratio=ratio(tfm, fp32),
    )
  text = f"ours ({task.half}) {task.metric_name} within {WITHIN_FP32:.1%} of float32's"
  if "ours" not in v or fp32 is None:
    say(None, f"{text}: {not_ours if 'ours' not in v else 'float32 not run'}", "ours_vs_fp32")
  else:
    r = ratio(ours, fp32)
    say(within(ours, fp32), f"{text}: {fmt(r)}x", "ours_vs_fp32", ratio=r)
  if task.key == "a":
    text = f"ours spends >= {HALF_FRACTION:.0%} of its steps in half"
    if "ours" not in v:
      say(None, f"{text}: {not_ours}", "half_fraction")
    else:
      hf = v["ours"]["state"]["half_fraction"]
      say(hf >= HALF_FRACTION, f"{text}: {hf:.1%}", "half_fraction", value=hf)


def fallback_name(state, amp_fallbacks=None):
  """amp.report's word; result files of older runs hold an index into FALLBACKS."""
  if isinstance(state.get("last_fallback"), str):
    return state["last_fallback"]
  names = amp_fallbacks or FALLBACK_NAMES
  i = int(state.get("last_fallback", 0))
  return names[i] if 0 <= i < len(names) else str(i)


FALLBACK_NAMES = ("none", "nonfinite_streak", "scale_floor", "nonfinite", "probe", "loss_spike")


# ---- chart ------------------------------------------------------------------------------------


def moving_average(values, window):
  values = np.asarray(values, np.float64)
  if len(values) < window or window <= 1:
    return values
  finite = np.where(np.isfinite(values), values, np.nan)
  out = np.full(len(values), np.nan)
  for i in range(len(values)):
    chunk = finite[max(0, i - window + 1) : i + 1]
    if np.any(np.isfinite(chunk)):
      out[i] = np.nanmean(chunk)
  return out


def chart(path, tasks, results):
  import matplotlib  # pylint: disable=import-outside-toplevel

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel

  fig, axes = plt.subplots(3, len(tasks), figsize=(4.6 * len(tasks), 8.5), dpi=72, squeeze=False)
  for col, task in enumerate(tasks):
    v = results[task.key]["variants"]
    ax_loss, ax_mode, ax_scale = axes[0][col], axes[1][col], axes[2][col]
    window = max(1, results[task.key]["steps"] // 60)
    finite = [x for r in v.values() for x in r["loss"] if math.isfinite(x)]
    top = max(finite) if finite else 1.0
    styles = {
      "fp32": ("float32", "C0", 1.0),
      "tf_amp": ("TF AMP", "C1", 1.0),
      "ours": ("ours", "C2", 1.6),
    }
    for variant, (label, color, width) in styles.items():
      if variant in v:
        loss = np.asarray(v[variant]["loss"], np.float64)
        steps = np.arange(1, len(loss) + 1)
        shown = moving_average(loss, window)
        ax_loss.plot(steps, shown, color=color, lw=width, label=f"{label} (mean of {window})")
        bad = ~np.isfinite(loss)
        if bad.any():
          ax_loss.plot(
            steps[bad],
            np.full(bad.sum(), top),
            "x",
            color=color,
            ms=3,
            label=f"{label}: non-finite loss",
          )
    ax_loss.set_yscale("log")
    ax_loss.set(title=f"{task.title}\nloss per step", xlabel="step", ylabel="batch loss")
    if "ours" in v:
      half = np.asarray(v["ours"]["half"], np.float64)
      ax_mode.step(np.arange(1, len(half) + 1), half, where="post", color="C2", lw=0.8)
      ax_mode.set_ylim(-0.1, 1.1)
      ax_mode.set_yticks([0, 1], ["full", "half"])
      s = v["ours"]["state"]
      ax_mode.set_title(
        f"ours' precision ({task.half}): {s['half_fraction']:.0%} half, "
        f"{int(s['switches'])} switches",
        fontsize=9,
      )
      scale = np.asarray(v["ours"]["scale"], np.float64)
      ax_scale.plot(np.arange(1, len(scale) + 1), scale, color="C2", label="ours")
    else:
      ax_mode.text(
        0.5, 0.5, "ours not available", ha="center", va="center", transform=ax_mode.transAxes
      )
    if "tf_amp" in v and "scale" in v["tf_amp"] and v["tf_amp"]["scale"]:
      ax_scale.plot(
        np.arange(1, len(v["tf_amp"]["scale"]) + 1),
        v["tf_amp"]["scale"],
        color="C1",
        ls="--",
        label="Keras LossScaleOptimizer",
      )
    ax_scale.set_yscale("log")
    ax_scale.set(title="loss scale", xlabel="step", ylabel="scale")
    ax_mode.set(xlabel="step")
    for ax in (ax_loss, ax_mode, ax_scale):
      ax.grid(alpha=0.3)
    for ax in (ax_loss, ax_scale):
      if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
  save_figure(fig, plt, path)


# ---- main -------------------------------------------------------------------------------------


def main(argv=None):
  args = parse_args(argv)
  wall_start = time.perf_counter()
  warnings.filterwarnings("ignore", category=UserWarning)

  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  tf.get_logger().setLevel("ERROR")  # Keras' "mixed_float16 may run slowly without a GPU"
  if args.intra_op_threads:
    tf.config.threading.set_intra_op_parallelism_threads(args.intra_op_threads)
  import tf_ext  # pylint: disable=import-outside-toplevel

  amp, ours_error = import_ours()
  global FALLBACK_NAMES  # pylint: disable=global-statement
  if amp is not None and hasattr(amp, "FALLBACKS"):
    FALLBACK_NAMES = tuple(amp.FALLBACKS)

  print("== tf_ext loss-aware mixed precision benchmark (issue 10) ==")
  machine = machine_report(tf, tf_ext, np, cpu_features=False)
  _, flags = cpu_model_and_flags(AMP_FLAGS)
  print(
    "CPU flags    : "
    + ", ".join(f"{f} {'yes' if f in flags else 'no'}" for f in AMP_FLAGS)
    + " (/proc/cpuinfo)"
  )
  if {"amx_bf16", "amx_tile"} & set(flags):
    applies = f"AMX: ours >= {SPEED_AMX:g}x float32 steps/s applies"
  elif "avx512_bf16" in flags:
    applies = f"AVX512_BF16 only: ours >= {SPEED_AVX512_BF16:g}x float32 steps/s applies"
  else:
    applies = (
      f"no bf16 hardware: the {SPEED_AMX:g}x (AMX) and {SPEED_AVX512_BF16:g}x (AVX512_BF16) "
      "speed targets do not apply; ratios reported as measured"
    )
  print(f"speed targets: {applies}; ours >= {SPEED_VS_TF:g}x TensorFlow's AMP everywhere")
  ours_line = (
    "tf_ext.mixed_precision.LossAwareOptimizer" if amp else f"not available ({ours_error})"
  )
  print(f"ours         : {ours_line}")
  print(f"seed         : {args.seed}{' (--quick)' if args.quick else ''}")
  results = {
    "config": {
      k: getattr(args, k)
      for k in (
        "quick",
        "seed",
        "tasks",
        "speed_batch",
        "speed_hidden",
        "speed_rounds",
        "speed_steps",
        "speed_half",
        "steps_scale",
        "test_samples",
        "intra_op_threads",
      )
    },
    "versions": versions(tf, tf_ext, np),
    "machine": dict(machine, amp_flags=flags),
    "ours_available": amp is not None,
    "ours_error": ours_error,
  }
  targets = {}

  if not args.no_speed:
    speed = speed_section(tf, tf_ext, amp, ours_error, args)
    results["speed"] = speed
    print_speed(speed, flags, args)

  tasks = [t for t in _amp_tasks.TASKS if t.key in args.tasks]
  task_results = {}
  for task in tasks:
    task_results[task.key] = run_task(tf, tf_ext, amp, ours_error, task, args)

  for task in tasks:
    print_task(task, task_results[task.key], targets)

  print()
  print("targets (informational; the exit status is 0 regardless):")
  if not args.no_speed:
    speed_targets(results["speed"], flags, targets)
  for task in tasks:
    for line in task_results[task.key].get("verdicts", []):
      print(line)
  results["targets"] = targets
  results["tasks"] = {
    k: {
      "steps": r["steps"],
      "errors": r["errors"],
      "variants": {
        n: {kk: vv for kk, vv in x.items() if kk not in ("loss", "half", "scale")}
        for n, x in r["variants"].items()
      },
    }
    for k, r in task_results.items()
  }

  if args.png:
    write_chart(args.png, results, lambda path: chart(path, tasks, task_results))
  return finish(results, args.json, wall_start)


if __name__ == "__main__":
  sys.exit(main())
