"""What amp.py reports of its accuracy tasks: each task's metrics, ratios and PASS/MISS lines, and
the chart of ours' loss, precision and loss scale per step."""

import math

import numpy as np
from _report import save_figure, verdict

WITHIN_FP32 = 0.005  # ours ends within 0.5% of float32's metric


HALF_FRACTION = 0.90  # task (a): ours spends >= 90% of its steps in half


BASELINE_LOSS = 0.01  # task (c): plain bf16 ends more than 1% worse than float32


VARIANTS = ("fp32", "tf_amp", "ours")


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
