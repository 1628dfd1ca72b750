"""One rank of harp_nccl_e2e.py (`harp_nccl_e2e.py --worker`, in the ranks' Python, which must
import torch): torch.distributed over NCCL, every size's all_reduce checked before and after its
timed pass; and `--probe`, which tells whether that Python can run the ranks at all."""

import importlib.metadata
import inspect
import json
import time
import traceback

import _common
from _harp_nccl_launch import NETWORKS
from _report import size_label as human


def pattern(torch, n, rank, device):
  """Small integers (exact in float32, and so is their sum over the ranks)."""
  base = torch.arange(n, device=device, dtype=torch.int64) % 1021 + 1
  return (base + 4096 * rank).to(torch.float32)


def iterations(size, args):
  return max(min(args.min_iters, args.iters), min(args.iters, args.bytes_per_size // size))


def worker_main(argv):
  p = _common.argument_parser("One rank of harp_nccl_e2e.py (started by it).")
  p.add_argument("--transport", required=True, choices=sorted(NETWORKS))
  p.add_argument("--rank", type=int, required=True)
  p.add_argument("--world-size", type=int, required=True)
  p.add_argument("--master", required=True)
  p.add_argument("--device", type=int, default=0)
  p.add_argument("--sizes", required=True)
  p.add_argument("--warmup", type=int, required=True)
  p.add_argument("--iters", type=int, required=True)
  p.add_argument("--min-iters", type=int, required=True)
  p.add_argument("--bytes-per-size", type=int, required=True)
  p.add_argument("--timeout", type=float, required=True)
  p.add_argument("--result", required=True)
  args = p.parse_args(argv)
  args.sizes_list = _common.int_list(args.sizes)
  result = {"rank": args.rank, "transport": args.transport, "sizes": {}, "ok": False}
  try:
    run_rank(args, result)
  except BaseException as error:  # the launcher reads the reason from the result file
    result["error"] = f"{type(error).__name__}: {error}"
    result["traceback"] = traceback.format_exc()
    traceback.print_exc()
  with open(args.result, "w") as f:
    json.dump(result, f, indent=2)
  return 0 if result["ok"] else 1


def run_rank(args, result):
  import datetime

  import torch
  import torch.distributed as dist

  device = torch.device("cuda", args.device)
  torch.cuda.set_device(device)
  result["gpu"] = torch.cuda.get_device_name(device)
  options = {
    "backend": "nccl",
    "init_method": f"tcp://{args.master}",
    "rank": args.rank,
    "world_size": args.world_size,
    "timeout": datetime.timedelta(seconds=args.timeout),
  }
  if "device_id" in inspect.signature(dist.init_process_group).parameters:
    options["device_id"] = device  # NCCL initialises now, not at the first collective
  dist.init_process_group(**options)
  world = dist.get_world_size()
  mismatches = []

  def check(size, when):
    n = size // 4
    x = pattern(torch, n, args.rank, device)
    dist.all_reduce(x, op=dist.ReduceOp.SUM)
    expected = sum(pattern(torch, n, r, device) for r in range(world))
    torch.cuda.synchronize(device)
    wrong = (x != expected).nonzero()
    if wrong.numel():
      i = int(wrong[0, 0])
      mismatches.append(
        f"{human(size)} ({when} the timed pass): {wrong.numel()} of {n} elements wrong, first "
        f"at {i}: {float(x[i])} instead of {float(expected[i])}"
      )
    return n

  sync = torch.zeros(1, device=device)
  for size in args.sizes_list:
    n = check(size, "before")
    buf = torch.zeros(n, dtype=torch.float32, device=device)  # zeros stay zeros: no overflow
    for _ in range(args.warmup):
      dist.all_reduce(buf)
    dist.all_reduce(sync)  # both ranks start the timed pass together
    torch.cuda.synchronize(device)
    iters = iterations(size, args)
    start = time.perf_counter()
    for _ in range(iters):
      dist.all_reduce(buf)
    torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / iters
    check(size, "after")
    result["sizes"][str(size)] = {"seconds": seconds, "iters": iters}
  dist.destroy_process_group()
  result["mismatches"] = mismatches
  result["elements_checked"] = sum(2 * (s // 4) for s in args.sizes_list)
  result["ok"] = not mismatches


def probe_main(argv):
  """In the ranks' Python: can it run them? One JSON line (versions, GPU) or the reason not."""
  device = int(argv[0]) if argv else 0
  info = {}
  try:
    import torch
  except ImportError as error:
    info["error"] = f"PyTorch is not importable ({error})"
  except Exception as error:  # e.g. a CUDA library that does not load
    info["error"] = f"importing PyTorch failed ({type(error).__name__}: {error})"
  if "error" in info:
    print(json.dumps(info))
    return 3
  info["torch"] = torch.__version__
  info["cuda"] = torch.version.cuda
  import torch.distributed as dist

  if not torch.cuda.is_available():
    info["error"] = f"PyTorch {torch.__version__} sees no CUDA GPU (CUDA {torch.version.cuda})"
  elif not (dist.is_available() and dist.is_nccl_available()):
    info["error"] = f"PyTorch {torch.__version__} has no NCCL backend for torch.distributed"
  elif device >= torch.cuda.device_count():
    info["error"] = f"--device {device}: only {torch.cuda.device_count()} GPU(s)"
  if "error" in info:
    print(json.dumps(info))
    return 4
  props = torch.cuda.get_device_properties(device)
  version = torch.cuda.nccl.version()
  info.update(
    gpu=props.name,
    gpu_memory_gib=round(props.total_memory / 2**30, 1),
    capability=f"{props.major}.{props.minor}",
    gpus=torch.cuda.device_count(),
    nccl=".".join(str(v) for v in version) if isinstance(version, tuple) else str(version),
  )
  for package in ("nvidia-nccl-cu13", "nvidia-nccl-cu12"):
    try:
      info[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      pass
  print(json.dumps(info))
  return 0
