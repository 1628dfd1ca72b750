"""Every setting of tf_ext, declared once: name, default, meaning, parser and capability.

This module is the one registry: the settings table of docs/settings.md is generated from it
(`python -m tf_ext.settings` prints the table; tests/test_settings_registry.py checks that the
page matches), and a capability's config object (e.g. LightCC's LightConfig) is derived from its
declarations by `config_class`. Adding a setting is one `Setting(...)` below, plus the
regenerated table.

Read a setting with `get("NAME")`; the environment overrides the default. Code elsewhere must
not read these variables from `os.environ` directly.

What a declaration is and checks (each capability's prefix, CAPABILITIES) is in
setting_declaration.py; the parsers of the raw strings are in setting_parsers.py.
"""

import dataclasses
import os
from typing import Dict, Tuple

from tf_ext.setting_declaration import CAPABILITIES, Setting, registry
from tf_ext.setting_parsers import (
  auto_flag,
  flag,
  float_at_least,
  fraction,
  gpu_tables,
  harp_cpu_list,
  harp_integer,
  harp_interface,
  increasing_positive_numbers,
  int_at_least,
  op_names,
  open_fraction,
  positive_float,
  tfra_initial_rows,
)

# LightCC's fusion probe does not count its first round (Horovod's first negotiation of each
# bucketing), so a probe needs one round more to measure anything (tf_ext/lightcc/fusion.py).
FUSION_MIN_PROBE_ROUNDS = 2


SETTINGS: Dict[str, Setting] = registry(
  [
    # tf_ext: the package itself.
    Setting(
      "TF_EXT_OPS_LIBRARY",
      "",
      "Path of the op library to load instead of the `_tf_ext_ops.so` inside the package.",
      capability="tf_ext",
    ),
    Setting(
      "TF_EXT_CACHE_DIR",
      "~/.cache/tf_ext",
      "Machine-wide cache of `make setup`, outside the work tree so fresh clones reuse it: "
      "`wheels/` holds the Horovod wheel built from source (empty means the default).",
      capability="tf_ext",
    ),
    # Dynamic embedding.
    Setting(
      "TF_EXT_CUDA",
      "auto",
      "Build time (Bazel and `setup.py`): whether the op library holds the GPU table core "
      "compiled by nvcc: `auto` where nvcc is on the PATH, `1` always (an error without nvcc), "
      "`0` never. Read by `third_party/cuda_library.sh`.",
      capability="dynamic_embedding",
      parse=auto_flag,
    ),
    Setting(
      "TF_EXT_FIND_DEDUP",
      "auto",
      "Read when a find kernel is made (a graph's first run): whether the unfused lookup of a "
      "host table's int64 ids finds each distinct id once and copies its row to its repeats, as "
      "the fused lookup does (rows and `lookups` / `lookup_hits` statistics unchanged). `auto`: "
      "for rows of at most 32 floats, where at least 1 in 8 of 256 ids sampled across the batch "
      "repeat (Zipf-like batches); `1` always; `0` never (one probe per id, as before).",
      capability="dynamic_embedding",
      parse=auto_flag,
    ),
    Setting(
      "TF_EXT_GPU_TABLES",
      "0",
      "Read when the op library loads: `1` registers the GPU kernels of the table ops that serve "
      "GPU tables (create, find, insert, remove, size, clear, the optimizer step, eviction, "
      "statistics, checkpoints), so a table created under `tf.device('/GPU:0')` lives in GPU "
      "memory (a build with CUDA: `TF_EXT_CUDA`). `0`: tables stay in host memory on every "
      "device, as before. `emulate`, for tests without a GPU: every int64 table is the GPU "
      "table core run on host threads (the emulated GPU table), served by the same kernels as on "
      "a GPU (slow; the ops that do not serve GPU tables refuse it); `host` is its older name.",
      capability="dynamic_embedding",
      parse=gpu_tables,
    ),
    Setting(
      "TF_EXT_PS_WAIT_TIMEOUT_S",
      "120",
      "Seconds a table built on a task of the TF_CONFIG cluster (e.g. a shard on a PS) waits "
      "for that task to accept connections before a clear error; 0 skips the check.",
      capability="dynamic_embedding",
      parse=float_at_least(0.0),
    ),
    Setting(
      "TF_EXT_TRIM_HEAP_AFTER_SAVE",
      "1",
      "`1`: after each link `tf_ext.DeltaCheckpointManager` writes, give the heap memory the "
      "process freed back to the system (glibc's `malloc_trim`; nothing under other C "
      "libraries). Between saves, glibc keeps the memory freed by training steps inside its "
      "heap, so a long job's resident memory creeps up though what it holds stays flat "
      "(docs/benchmarks.md, Soak). `0`: leave the heap as the allocator keeps it.",
      capability="dynamic_embedding",
      parse=flag,
    ),
    Setting(
      "TF_EXT_SERVING_EXPORT_CHUNK_BYTES",
      "8388608",
      "Bytes of ids and rows (about) that `tf_ext.saved_model.export_for_serving` and "
      "`export_estimator_for_serving` stream into the SavedModel's variables at a time, as one "
      "slice of each table's tensors: the export's extra memory for a table, at 8 + 4 x dim "
      "bytes per row.",
      capability="dynamic_embedding",
      parse=int_at_least(1),
    ),
    Setting(
      "TF_EXT_TFRA_INITIAL_ROWS",
      "tfra",
      "Read when a `tf_ext.tfra` Variable is created: the initial rows of a random initializer "
      "object (RandomNormal, Glorot, ...). `tfra`: called for each lookup's keys, as TFRA calls "
      "it, and a missing key reads the row at its position (a Keras initializer repeats its "
      "values at every call, VarianceScaling scales by the lookup's number of keys); the row "
      "a key read is written before its first update. `per_key`: the table computes each "
      "missing key's row from the key and a seed, of the same distribution (faster; a key reads "
      "the same row at every lookup).",
      capability="dynamic_embedding",
      parse=tfra_initial_rows,
    ),
    # Loss-aware mixed precision (tf_ext.mixed_precision): the policy's knobs, read when a policy
    # is created. The attributes are the policy op's attributes (kernels/mixed_precision/core/
    # loss_aware_policy.h explains each).
    Setting(
      "TF_EXT_AMP_INITIAL_LOSS_SCALE",
      "32768",
      "fp16: the loss scale to start (and to return to half precision) with.",
      capability="mixed_precision",
      parse=float_at_least(1.0),
      attribute="initial_loss_scale",
    ),
    Setting(
      "TF_EXT_AMP_GROWTH_INTERVAL",
      "2000",
      "fp16: finite steps in a row after which the loss scale doubles.",
      capability="mixed_precision",
      parse=int_at_least(1),
      attribute="growth_interval",
    ),
    Setting(
      "TF_EXT_AMP_MIN_LOSS_SCALE",
      "1",
      "fp16: a loss scale below this falls back to full precision.",
      capability="mixed_precision",
      parse=positive_float,
      attribute="min_loss_scale",
    ),
    Setting(
      "TF_EXT_AMP_MAX_NONFINITE_STEPS",
      "8",
      "fp16: this many steps in a row with non-finite gradients fall back to full precision.",
      capability="mixed_precision",
      parse=int_at_least(1),
      attribute="max_nonfinite_streak",
    ),
    Setting(
      "TF_EXT_AMP_PROBE_TOLERANCE",
      "0.02",
      "A precision probe whose relative loss difference (half vs full) exceeds this falls back.",
      capability="mixed_precision",
      parse=positive_float,
      attribute="probe_tolerance",
    ),
    Setting(
      "TF_EXT_AMP_SPIKE_SIGMAS",
      "6",
      "A half-precision loss above its running mean by this many running standard deviations "
      "falls back.",
      capability="mixed_precision",
      parse=positive_float,
      attribute="spike_sigmas",
    ),
    Setting(
      "TF_EXT_AMP_SPIKE_WARMUP_STEPS",
      "50",
      "Losses seen before the spike detector acts.",
      capability="mixed_precision",
      parse=int_at_least(2),
      attribute="spike_warmup_steps",
    ),
    Setting(
      "TF_EXT_AMP_LOSS_DECAY",
      "0.99",
      "Decay of the loss's running mean and variance, in (0, 1).",
      capability="mixed_precision",
      parse=open_fraction,
      attribute="loss_decay",
    ),
    Setting(
      "TF_EXT_AMP_RETURN_AFTER_STEPS",
      "200",
      "Applied full-precision steps in a row before half precision is tried again.",
      capability="mixed_precision",
      parse=int_at_least(1),
      attribute="return_after_steps",
    ),
    Setting(
      "TF_EXT_AMP_MAX_RETURN_AFTER_STEPS",
      "12800",
      "Cap of that wait, which doubles at each fallback soon after a return.",
      capability="mixed_precision",
      parse=int_at_least(1),
      attribute="max_return_after_steps",
    ),
    Setting(
      "TF_EXT_AMP_STABLE_HALF_STEPS",
      "2000",
      "Half-precision steps after a return past which a fallback resets the wait instead of "
      "doubling it.",
      capability="mixed_precision",
      parse=int_at_least(1),
      attribute="stable_half_steps",
    ),
    # Loss-aware mixed precision: the probe and the rewrite's op lists, read when
    # LossAwareOptimizer wraps an optimizer (its probe_interval argument overrides the first).
    Setting(
      "TF_EXT_AMP_PROBE_INTERVAL",
      "100",
      "Every this many half-precision steps, the precision probe computes the step's loss in "
      "both precisions on the same batch; 0: never.",
      capability="mixed_precision",
      parse=int_at_least(0),
    ),
    Setting(
      "TF_EXT_AMP_ALLOW_OPS",
      "",
      "Op types added to the rewrite's allow list (always half), comma-separated.",
      capability="mixed_precision",
      parse=op_names,
    ),
    Setting(
      "TF_EXT_AMP_INFER_OPS",
      "",
      "Op types added to the rewrite's infer list (half when their inputs are), comma-separated.",
      capability="mixed_precision",
      parse=op_names,
    ),
    Setting(
      "TF_EXT_AMP_DENY_OPS",
      "",
      "Op types the rewrite keeps in fp32 whatever the other lists say, comma-separated.",
      capability="mixed_precision",
      parse=op_names,
    ),
    # Adaptive XLA compilation cache (tf_ext.jit): read when tf_ext.jit.function wraps a
    # function (its keyword arguments of the same names override them).
    Setting(
      "TF_EXT_JIT_MAX_EXECUTABLES",
      "8",
      "tf_ext.jit: compiled executables kept per function; the least recently used beyond this "
      "are dropped. A Bucketing makes at most this many bucket shapes.",
      capability="jit",
      parse=int_at_least(1),
    ),
    Setting(
      "TF_EXT_JIT_MAX_BUCKETS",
      "8",
      "tf_ext.jit: bucket shapes a plan may hold (the product of the bucket counts of the padded "
      "dimensions).",
      capability="jit",
      parse=int_at_least(1),
    ),
    Setting(
      "TF_EXT_JIT_MAX_SIZE",
      "4096",
      "tf_ext.jit: largest size of a padded dimension that is compiled; larger runs uncompiled "
      "with one warning.",
      capability="jit",
      parse=int_at_least(1),
    ),
    Setting(
      "TF_EXT_JIT_MIN_OBSERVATIONS",
      "32",
      "tf_ext.jit: calls observed (run uncompiled) before the first bucket plan; the plan may "
      "grow each time the calls seen double.",
      capability="jit",
      parse=int_at_least(1),
    ),
    Setting(
      "TF_EXT_JIT_MIN_GAIN",
      "0.05",
      "tf_ext.jit: an extra bucket shape is planned only if it cuts the padded work on the "
      "observed sizes by at least this fraction of the unpadded work.",
      capability="jit",
      parse=float_at_least(0.0),
    ),
    Setting(
      "TF_EXT_JIT_REPLAN_GAIN",
      "0.1",
      "tf_ext.jit: a new plan replaces the current one only if it cuts the padded work by this "
      "fraction (sizes the plan cannot hold always replan).",
      capability="jit",
      parse=float_at_least(0.0),
    ),
    Setting(
      "TF_EXT_JIT_ASYNC",
      "1",
      "tf_ext.jit: compile in a background thread while calls run uncompiled (0: compile in the "
      "calling thread, like tf.function(jit_compile=True)); a Bucketing turns on TensorFlow's "
      "asynchronous XLA compilation for the process.",
      capability="jit",
      parse=flag,
    ),
    Setting(
      "TF_EXT_JIT_ADAPTIVE",
      "1",
      "tf_ext.jit.function: after each new executable, time 12 calls compiled and 12 "
      "uncompiled, interleaved, fit each way's time as a fixed cost per call plus a cost per "
      "element, and run the faster way; compile no new bucket where XLA would be slower even "
      "unpadded (checked again every 1000 calls), and grow a plan only after a check. "
      "tf_ext.jit.Bucketing (Sessions): a speed gate times 12 steps each way "
      "once executables are ready and runs the graph's XLA clusters the faster way; after an "
      "uncompiled verdict XLA is no longer asked and batches pass unpadded. 0: always compiled.",
      capability="jit",
      parse=flag,
    ),
    # Graph passes (tf_ext.graph): read by enable() and config_proto().
    Setting(
      "TF_EXT_GRAPH_FUSE_EMBEDDINGS",
      "1",
      "tf_ext.graph: fuse every embedding lookup of a step into one op, and the "
      "table updates into one (0: leave them unfused).",
      capability="graph",
      parse=flag,
    ),
    Setting(
      "TF_EXT_GRAPH_CLUSTER_DENSE",
      "auto",
      "tf_ext.graph: compile the dense part between the embedding outputs and the "
      "loss, and its gradients, with XLA: 1, 0, or auto (on where TensorFlow sees a GPU; on CPU, "
      "XLA made the benchmark's steps slower).",
      capability="graph",
      parse=auto_flag,
    ),
    # LightCC (tf_ext.lightcc): read at hvd.init(); init(light_<name>=...) overrides them. The
    # attributes are LightConfig's fields (tf_ext/lightcc/config.py).
    Setting(
      "LIGHT_2D_ALLREDUCE",
      "0",
      "Use 2D allreduce: reduce-scatter in each group of "
      "LIGHT_INTRA_SIZE ranks, allreduce across groups, allgather in the group.",
      capability="lightcc",
      parse=flag,
      attribute="two_d",
    ),
    Setting(
      "LIGHT_INTRA_SIZE",
      "8",
      "Ranks per group (node) in 2D allreduce; must divide the world size.",
      capability="lightcc",
      parse=int_at_least(1),
      attribute="intra_size",
    ),
    Setting(
      "LIGHT_HIERARCHICAL_THRESHOLD",
      "1073741824",
      "Bytes; tensors up to this size use 2D allreduce, larger ones Horovod's flat allreduce.",
      capability="lightcc",
      parse=int_at_least(0),
      attribute="hierarchical_threshold",
    ),
    Setting(
      "LIGHT_TOPK_ALLREDUCE",
      "0",
      "Use TOPK compressed communication with error feedback for gradients.",
      capability="lightcc",
      parse=flag,
      attribute="topk",
    ),
    Setting(
      "LIGHT_TOPK_RATIO",
      "0.01",
      "Fraction of a gradient's entries sent, in (0, 1].",
      capability="lightcc",
      parse=fraction,
      attribute="topk_ratio",
    ),
    Setting(
      "LIGHT_TOPK_THRESHOLD",
      "1048576",
      "Bytes; gradients at least this size are TOPK-compressed, smaller ones reduced densely.",
      capability="lightcc",
      parse=int_at_least(0),
      attribute="topk_threshold",
    ),
    Setting(
      "LIGHT_TOPK_FP16",
      "0",
      "Send TOPK values as float16.",
      capability="lightcc",
      parse=flag,
      attribute="topk_fp16",
    ),
    # Adaptive gradient fusion (tf_ext/lightcc/fusion.py has the policy).
    Setting(
      "LIGHT_FUSION",
      "0",
      "Reduce dense gradients (TOPK ones included) in buckets, in "
      "backprop order, with the bucket size chosen from measured step times.",
      capability="lightcc",
      parse=flag,
      attribute="fusion",
    ),
    Setting(
      "LIGHT_FUSION_BUCKETS_MB",
      "1,4,16,64",
      "Candidate bucket sizes in MiB, in increasing order.",
      capability="lightcc",
      parse=increasing_positive_numbers,
      attribute="fusion_buckets_mb",
    ),
    Setting(
      "LIGHT_FUSION_PROBE_STEPS",
      "5",
      "Rounds of a probe: the candidates take turns, one step each, per round (the first "
      "round is not counted); those within 3 % of the fastest then take as many rounds again.",
      capability="lightcc",
      parse=int_at_least(FUSION_MIN_PROBE_ROUNDS),
      attribute="fusion_probe_steps",
    ),
    Setting(
      "LIGHT_FUSION_REPROBE_STEPS",
      "200",
      "Steps between re-probes of the chosen size's neighbours; 0 never re-probes.",
      capability="lightcc",
      parse=int_at_least(0),
      attribute="fusion_reprobe_steps",
    ),
    Setting(
      "LIGHT_FUSION_RETRACE",
      "0",
      "1: a step's graph holds the bucket size in force alone, so that a probe times the graph "
      "that will run; the step function must be traced again whenever hvd.fusion_graph_key() "
      "changes (Keras: FusionSettledCallback does it). 0: every candidate size sits behind one "
      "tf.switch_case, and nothing is traced again (TF1 Sessions need 0).",
      capability="lightcc",
      parse=flag,
      attribute="fusion_retrace",
    ),
    Setting(
      "LIGHT_BUCKET_MB",
      "25",
      "Without LIGHT_FUSION: MiB per bucket (PyTorch DDP's default size) in which 2D and TOPK "
      "gradients are exchanged, in backprop order, each bucket as soon as its gradients exist; "
      "0 sends all TOPK gradients in one exchange and all 2D ones in another.",
      capability="lightcc",
      parse=float_at_least(0),
      attribute="bucket_mb",
    ),
    Setting(
      "LIGHT_HARP",
      "0",
      "1: init() points NCCL at HARP (NCCL_NET_PLUGIN = tf_ext.harp.plugin_path(), NCCL_NET=HARP) "
      "before NCCL starts; only Horovod built with NCCL uses it.",
      capability="lightcc",
      parse=flag,
      attribute="harp",
    ),
    # HARP, the NCCL network plugin (kernels/harp/): read by the plugin itself at NCCL's init, in
    # C++ (kernels/harp/core/config.cc has the same names, defaults and checks;
    # tests/harp/test_plugin.py checks that the two agree).
    Setting(
      "HARP_NSTREAMS",
      "4",
      "TCP data streams per connection (NCCL opens one per channel); each chunk of a message "
      "goes to the stream with the fewest unacknowledged bytes. With NCCL's 2 channels, 4 ran "
      "faster than 8 on both emulated networks (docs/benchmarks.md, HARP).",
      capability="harp",
      parse=harp_integer(1, 64),
    ),
    Setting(
      "HARP_NTHREADS",
      "2",
      "Worker threads driving the sockets; each connection belongs to one of them.",
      capability="harp",
      parse=harp_integer(1, 64),
    ),
    Setting(
      "HARP_CPU_AFFINITY",
      "",
      "CPUs to pin the worker threads to, e.g. 0,2,4-7 (worker i on the i-th, cycling); "
      "empty: not pinned.",
      capability="harp",
      parse=harp_cpu_list,
    ),
    Setting(
      "HARP_CHUNK_BYTES",
      "524288",
      "Bytes per chunk, the unit a message is spread over the streams in (4096 to 64 MiB).",
      capability="harp",
      parse=harp_integer(4096, 64 << 20),
    ),
    Setting(
      "HARP_ZEROCOPY_THRESHOLD",
      "0",
      "Bytes from which a chunk is sent with MSG_ZEROCOPY (the send completes once the "
      "kernel's notification releases the buffer); 0 is off, the default (over loopback and "
      "veth the kernel copies anyway, and harp_transport.py measured it slower). Where "
      "SO_ZEROCOPY is unavailable, sends copy (logged once).",
      capability="harp",
      parse=harp_integer(0, 1 << 62),
    ),
    Setting(
      "HARP_IFNAME",
      "",
      "Interface name or IPv4 address to listen on. Empty: as NCCL_SOCKET_IFNAME says when "
      "that is set (NCCL's syntax: comma-separated name prefixes, a leading ^ excludes them, a "
      "leading = makes them exact names; of the interfaces it admits, the first that is up and "
      "not loopback), else the first interface that is up and not loopback, else loopback. The "
      "plugin logs the interface it chose and why.",
      capability="harp",
      parse=harp_interface,
    ),
    Setting(
      "HARP_TIMEOUT_MS",
      "30000",
      "Milliseconds after which a silent peer or an unfinished connection set-up is an error.",
      capability="harp",
      parse=harp_integer(100, 3600 * 1000),
    ),
    Setting(
      "HARP_CALLER_CONNECTIONS",
      "1",
      "Busy connections that the calling thread drives itself (NCCL's proxy thread, which "
      "spins on test() whatever the transport) instead of a worker; the rest stay with the "
      "workers. 0: the workers drive all (more throughput where one flow cannot fill the link, "
      "at more CPU per byte; docs/benchmarks.md, HARP).",
      capability="harp",
      parse=harp_integer(0, 64),
    ),
  ]
)


def get(name, value=None):
  """The parsed value of setting `name`: `value` if given, else the environment's, else the
  default. ValueError "NAME='raw' is invalid: why (meaning)" if it does not parse."""
  setting = SETTINGS.get(name)
  if setting is None:
    raise KeyError(f"{name} is not a declared setting (tf_ext/settings.py declares them)")
  return setting.value(value if value is not None else os.environ.get(name, setting.default))


def of(capability) -> Tuple[Setting, ...]:
  """The settings of `capability`, in declaration order."""
  if capability not in CAPABILITIES:
    raise ValueError(f"unknown capability {capability!r}; known: {list(CAPABILITIES)}")
  return tuple(s for s in SETTINGS.values() if s.capability == capability)


def config_class(capability, class_name, namespace=None, module=None):
  """A frozen dataclass with one field per setting of `capability` that has an attribute, typed
  and defaulted by the setting's parsed default (so the config object cannot drift from here).
  `namespace` adds members (properties, a docstring); `module` is the class's __module__."""
  fields = []
  for setting in of(capability):
    if setting.attribute is not None:
      default = setting.parsed_default()
      fields.append((setting.attribute, type(default), dataclasses.field(default=default)))
  namespace = dict(namespace or {})
  if module is not None:
    namespace["__module__"] = module
  return dataclasses.make_dataclass(class_name, fields, namespace=namespace, frozen=True)


def render_default(default):
  """How the settings table shows a default: `(empty)` for "", else in backticks."""
  return "(empty)" if default == "" else f"`{default}`"


def markdown_table():
  """The settings table of docs/settings.md, one row per setting in declaration order."""
  lines = ["| variable | capability | default | meaning |", "|---|---|---|---|"]
  for s in SETTINGS.values():
    lines.append(f"| `{s.name}` | {s.capability} | {render_default(s.default)} | {s.meaning} |")
  return "\n".join(lines)


if __name__ == "__main__":
  print(markdown_table())
