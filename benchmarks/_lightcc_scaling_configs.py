"""The configurations lightcc_scaling.py compares: their LIGHT_* settings, names and labels, the
order they run in (interleaved rounds of a fusion configuration and its fixed bucket sizes), how a
configuration's repeated runs pool, and the targets."""

# Adaptive fusion: candidate bucket sizes S/16, S/4 and Horovod's default fusion threshold, 128 MiB
# (which holds the whole shrunk step: one bucket), probed in --fusion-rounds interleaved rounds
# (LIGHT_FUSION_PROBE_STEPS, default 5 as LightCC's; the first round is not counted; close sizes
# are refined), each in a graph that holds it alone (LIGHT_FUSION_RETRACE=1: behind the switch,
# the dead branches' CPU made the probe favour small buckets); never re-probed within a run.
# Fusion configurations warm up for their longest probe, then for --warmup steps as the others:
# the timed steps run the chosen size, frozen.
FUSION = {"LIGHT_FUSION": "1", "LIGHT_FUSION_REPROBE_STEPS": "0", "LIGHT_FUSION_RETRACE": "1"}


TOPK = {"LIGHT_TOPK_ALLREDUCE": "1", "LIGHT_TOPK_RATIO": "0.01"}


# Without fusion, LightCC exchanges 2D and TOPK gradients in fixed buckets of LIGHT_BUCKET_MB
# (default 25 MiB), divided by the shrink factor like TOPK's threshold; "+onegroup" sets 0: one
# exchange per kind after the whole backward pass.
BUCKET_MB = 25


CONFIG_NAMES = [
  "horovod",
  "2d",
  "2d+topk",
  "2d+topk+fp16",
  "fusion",
  "2d+fusion",
  "2d+topk+fusion",
  "2d+topk+fp16+fusion",
  "2d+topk+fusion+switch",
  "2d+onegroup",
  "2d+topk+onegroup",
]


QUICK_CONFIGS = ["horovod", "2d+topk", "2d+topk+fusion"]


# --fixed-sweep runs these fusion configurations again without fusion, once per candidate size
# fixed (LIGHT_BUCKET_MB), named "<config>@<MiB>": the sizes fusion chooses among.
SWEPT_CONFIGS = ["2d+fusion", "2d+topk+fusion"]


LABELS = {
  "horovod": "Horovod",
  "2d": "2D",
  "2d+topk": "2D+TOPK",
  "2d+topk+fp16": "2D+TOPK+fp16",
  "fusion": "fusion",
  "2d+fusion": "2D+fusion",
  "2d+topk+fusion": "2D+TOPK+fusion",
  "2d+topk+fp16+fusion": "2D+TOPK+fp16+fusion",
  "2d+topk+fusion+switch": "2D+TOPK+fusion, switch probe",
  "2d+onegroup": "2D one group",
  "2d+topk+onegroup": "2D+TOPK one group",
}


TARGETS = {"vgg16": 0.85, "resnet50": 0.90}


FUSION_TARGET = 1.1  # adaptive fusion against Horovod, on one profile


FIXED_TARGET = 0.97  # adaptive fusion against its best fixed bucket size, on every profile


def label(name):
  base, _, fixed_mb = name.partition("@")
  return f"{LABELS[base]} {fixed_mb} MiB" if fixed_mb else LABELS[base]


def fixed_sweep(config, plan):
  """The fixed-bucket runs that --fixed-sweep adds for a fusion configuration (none for others)."""
  if config not in SWEPT_CONFIGS:
    return []
  return [f"{config.replace('+fusion', '')}@{mb:g}" for mb in plan["fusion_mb"]]


def run_order(configs, plan, sweep, repeats):
  """(the configurations as the report lists them, the order they run in). With the fixed sweep,
  each swept fusion configuration and its fixed sizes form a group that runs `repeats` times in
  rounds, each round one run of each (fusion, @a, @b, @c, then @a, @b, @c, fusion, ...): a load or
  a link that drifts for a while then weighs on one round's runs alike, and the verdict compares
  them round by round. Each round starts one later in the group, so that no configuration always
  runs first after the previous one's exchange. Other configurations run once, first."""
  groups = [[c, *fixed_sweep(c, plan)] for c in configs if sweep and fixed_sweep(c, plan)]
  grouped = {c for g in groups for c in g}
  listed = list(configs) + [c for g in groups for c in g[1:] if c not in configs]
  once = [c for c in configs if c not in grouped]
  rounds = [g[n % len(g) :] + g[: n % len(g)] for n in range(repeats) for g in groups]
  return listed, once + [c for group_round in rounds for c in group_round]


def pool_repeats(rows):
  """One row from a configuration's repeated runs: its step time is the mean over all their
  steps; the per-run step times and fusion choices are kept beside it. Failed runs are counted
  and left out; the row fails only when every run did."""
  ok = [r for r in rows if "error" not in r]
  if not ok:
    return rows[-1]
  if len(rows) == 1:
    return rows[0]
  steps = sum(r["steps"] for r in ok)
  step_s = sum(r["step_s"] * r["steps"] for r in ok) / steps
  pooled = dict(ok[-1], steps=steps, step_s=step_s)
  pooled["images_per_s"] = ok[0]["images_per_s"] * ok[0]["step_s"] / step_s
  pooled["efficiency"] = ok[0]["efficiency"] * ok[0]["step_s"] / step_s
  pooled["link_bytes_per_step"] = [
    sum(r["link_bytes_per_step"][n] for r in ok) / len(ok)
    for n in range(len(ok[0]["link_bytes_per_step"]))
  ]
  pooled["repeats"] = [
    {key: r[key] for key in ("step_s", "cpu_s_per_rank_step", "steal_share", "fusion")}
    if "error" not in r
    else {"error": r["error"]}
    for r in rows
  ]
  return pooled


def fusion_warmup(warmup, plan):
  """Warm-up steps of a fusion configuration: its longest probe, then `warmup` steps, as the
  other configurations, of the size it chose."""
  from tf_ext.lightcc.fusion import FusionPolicy

  return FusionPolicy.longest_probe(len(plan["fusion_mb"]), plan["fusion_rounds"]) + warmup


def config_env(name, ranks_per_node, plan):
  """LIGHT_* settings of a configuration name ("2d+topk+fusion" = its parts' settings;
  "2d+topk@2.06" = 2D + TOPK in fixed 2.06 MiB buckets). TOPK's size threshold (1 MiB by default)
  is divided by the plan's shrink factor, so that the same tensors are compressed as in the
  full-size model."""
  env = {}
  name, _, fixed_mb = name.partition("@")
  parts = set(name.split("+"))
  if "2d" in parts:
    env.update(LIGHT_2D_ALLREDUCE="1", LIGHT_INTRA_SIZE=str(ranks_per_node))
  if "topk" in parts:
    env.update(TOPK, LIGHT_TOPK_THRESHOLD=str(max(1, (1 << 20) // plan["shrink"])))
  if "fp16" in parts:
    env["LIGHT_TOPK_FP16"] = "1"
  if "fusion" in parts:
    env.update(FUSION, LIGHT_FUSION_PROBE_STEPS=str(plan["fusion_rounds"]))
    env["LIGHT_FUSION_BUCKETS_MB"] = ",".join(f"{x:g}" for x in plan["fusion_mb"])
    if "switch" in parts:  # probed behind one tf.switch_case (LIGHT_FUSION_RETRACE=0)
      env["LIGHT_FUSION_RETRACE"] = "0"
  elif fixed_mb:
    env["LIGHT_BUCKET_MB"] = fixed_mb
  elif parts & {"2d", "topk"}:
    env["LIGHT_BUCKET_MB"] = "0" if "onegroup" in parts else f"{BUCKET_MB / plan['shrink']:g}"
  return env
