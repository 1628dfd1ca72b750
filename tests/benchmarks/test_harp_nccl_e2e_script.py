"""benchmarks/harp_nccl_e2e.py without a GPU: what --dry-run would launch (each rank's environment:
HARP's plugin path, the NCCL network, distinct NCCL_HOSTIDs, P2P and SHM off), the clear message
of the real mode where PyTorch is missing, and the launcher's own logic (rendezvous, result checks,
NCCL log checks, the table, --json, the exit status) on a stand-in `torch` that this test writes:
numpy arrays, an all_reduce over a TCP socket between the two rank processes, and an NCCL-like
log. The stand-in says nothing about NCCL or HARP themselves; that needs a GPU machine."""

import importlib.util
import json
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = os.path.join(ROOT, "benchmarks", "harp_nccl_e2e.py")

# A stand-in for the parts of torch the script uses. all_reduce really exchanges the two ranks'
# data (over one TCP connection, rank 0 listening at init_method's address); the "NCCL log" says
# which network NCCL_NET selected (the plugin's name as its ncclNetPlugin_v8 struct gives it when
# NCCL_NET_PLUGIN is a loadable library). FAKE_VIA overrides the connections' transport and
# FAKE_CORRUPT=1 makes rank 0 add 1 to one element, to test the checks.
FAKE_TORCH = r"""
import ctypes, os, socket, threading, time, types
import numpy as np

__version__ = "0.0-fake"
version = types.SimpleNamespace(cuda="13.0")
int64, float32 = np.int64, np.float32


class Tensor(np.ndarray):
  def to(self, dtype):
    return self.astype(dtype).view(Tensor)

  def numel(self):
    return self.size

  def nonzero(self):
    return np.argwhere(np.asarray(self)).view(Tensor)


def device(kind, index=0):
  return (kind, index)


def arange(n, device=None, dtype=None):
  return np.arange(n, dtype=dtype).view(Tensor)


def zeros(n, dtype=None, device=None):
  return np.zeros(n, dtype=dtype).view(Tensor)


cuda = types.SimpleNamespace(
  is_available=lambda: True,
  device_count=lambda: 1,
  set_device=lambda d: None,
  synchronize=lambda d=None: None,
  get_device_name=lambda d=None: "Fake GPU",
  get_device_properties=lambda d: types.SimpleNamespace(
    name="Fake GPU", total_memory=80 << 30, major=9, minor=0
  ),
  nccl=types.SimpleNamespace(version=lambda: (2, 30, 0)),
)
"""

FAKE_DISTRIBUTED = r"""
import ctypes, os, socket, threading, time, types
import numpy as np

ReduceOp = types.SimpleNamespace(SUM="sum")
_state = {}


def is_available():
  return True


def is_nccl_available():
  return True


def _log(line):
  with open(os.environ["NCCL_DEBUG_FILE"], "a") as f:
    f.write(f"host:{os.getpid()}:1 [0] NCCL INFO {line}\n")


def init_process_group(backend, init_method, rank, world_size, timeout=None, device_id=None):
  assert backend == "nccl" and world_size == 2
  assert os.environ["NCCL_P2P_DISABLE"] == "1" and os.environ["NCCL_SHM_DISABLE"] == "1"
  _log("NCCL version 2.30.0+fake")
  names = ["Socket"]
  plugin = os.environ.get("NCCL_NET_PLUGIN")
  if plugin:
    lib = ctypes.CDLL(plugin)  # a real library, or the test's stand-in
    name = ctypes.c_char_p.in_dll(lib, "ncclNetPlugin_v8").value.decode()
    _log(f"NET/Plugin: Loaded net plugin {name} (v8)")
    names.insert(0, name)
  if os.environ["NCCL_NET"] not in names:
    raise RuntimeError(f"NCCL error: no net named {os.environ['NCCL_NET']} ({names})")
  net = os.environ["NCCL_NET"]
  _log(f"Using network {net}")
  via = os.environ.get("FAKE_VIA")
  if via:  # NCCL's format for P2P, SHM and the like
    _log(f"Channel 00 : {rank}[1a000] -> {1 - rank}[1a000] via {via}")
  else:
    _log(f"Channel 00/0 : {rank}[1a000] -> {1 - rank}[1a000] [send] via NET/{net}/0")
    _log(f"Channel 00/0 : {1 - rank}[1a000] -> {rank}[1a000] [receive] via NET/{net}/0")
  host, port = init_method[len("tcp://"):].rsplit(":", 1)
  if rank == 0:
    server = socket.create_server((host, int(port)))
    conn, _ = server.accept()
    server.close()
  else:
    for _ in range(300):
      try:
        conn = socket.create_connection((host, int(port)))
        break
      except OSError:
        time.sleep(0.05)
  _state.update(conn=conn, rank=rank, corrupt=os.environ.get("FAKE_CORRUPT") == "1")


def get_world_size():
  return 2


def all_reduce(x, op="sum"):
  conn, data = _state["conn"], np.ascontiguousarray(x).tobytes()
  sender = threading.Thread(target=conn.sendall, args=(data,))
  sender.start()
  got = bytearray()
  while len(got) < len(data):
    chunk = conn.recv(len(data) - len(got))
    assert chunk, "peer closed"
    got += chunk
  sender.join()
  x[...] = x + np.frombuffer(bytes(got), dtype=x.dtype)
  if _state["corrupt"] and _state["rank"] == 0 and x.size > 4:
    x[3] += 1


def destroy_process_group():
  _state["conn"].close()
"""


def _run(args, env=None, timeout=120):
  return subprocess.run(
    [sys.executable, SCRIPT] + args,
    env=env or dict(os.environ),
    capture_output=True,
    text=True,
    timeout=timeout,
  )


def _dry_run(tmp_path, extra, env=None):
  plan_path = tmp_path / "plan.json"
  proc = _run(["--dry-run", f"--json={plan_path}"] + extra, env)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "Traceback" not in proc.stderr
  return proc.stdout, json.loads(plan_path.read_text())


def test_dry_run_gives_each_rank_its_network_and_host(tmp_path):
  plugin = str(tmp_path / "lib" / "libnccl-net-harp.so")  # need not exist for a dry run
  env = dict(os.environ, NCCL_NET_PLUGIN="/inherited/libnccl-net.so", NCCL_NET="IB")
  out, plan = _dry_run(tmp_path, [f"--plugin={plugin}", "--quick"], env)
  assert plan["plugin"] == plugin
  assert set(plan["transports"]) == {"harp", "socket"}
  hostids = []
  for transport, network in (("harp", "HARP"), ("socket", "Socket")):
    entry = plan["transports"][transport]
    assert entry["master"].startswith("127.0.0.1:")
    assert [r["rank"] for r in entry["ranks"]] == [0, 1]
    for r in entry["ranks"]:
      e = r["env"]
      assert e["NCCL_NET"] == network
      if transport == "harp":
        assert e["NCCL_NET_PLUGIN"] == plugin
        assert e["HARP_IFNAME"] == "lo"
      else:
        assert "NCCL_NET_PLUGIN" not in e  # NCCL's own Socket transport, no plugin
      assert e["NCCL_P2P_DISABLE"] == "1" and e["NCCL_SHM_DISABLE"] == "1"
      assert e["NCCL_IB_DISABLE"] == "1"
      assert e["NCCL_MULTI_RANK_GPU_ENABLE"] == "1"
      assert e["NCCL_DEBUG"] == "INFO" and e["NCCL_DEBUG_FILE"] == r["nccl_log"]
      assert e["NCCL_SOCKET_IFNAME"] == "lo"
      # The inherited NCCL settings are not passed on.
      assert {"NCCL_NET_PLUGIN", "NCCL_NET"} <= set(r["env_removed"])
      assert r["netns"] is None and "--worker" in r["argv"]
      assert f"--rank={r['rank']}" in r["argv"] and f"--master={entry['master']}" in r["argv"]
      assert r["command"] in out  # printed as it would run
      hostids.append(e["NCCL_HOSTID"])
    assert entry["ranks"][0]["env"]["NCCL_HOSTID"] != entry["ranks"][1]["env"]["NCCL_HOSTID"]
  assert len(set(hostids)) == 4
  assert f"NCCL_NET_PLUGIN={plugin}" in out
  # The plugin of the checkout the script lives in, by default (under Bazel the script's runfile
  # links into the checkout, while this test's own tree holds Bazel's copy of the plugin).
  _, plan = _dry_run(tmp_path, ["--transports=harp"])
  checkout = os.path.dirname(os.path.dirname(os.path.realpath(SCRIPT)))
  assert plan["plugin"] == os.path.join(checkout, "tf_ext", "harp", "libnccl-net-harp.so")
  assert all(
    r["env"]["NCCL_NET_PLUGIN"] == plan["plugin"] for r in plan["transports"]["harp"]["ranks"]
  )


def test_dry_run_with_namespaces(tmp_path):
  out, plan = _dry_run(tmp_path, ["--netns=cloud", "--flow-classes=4", "--plugin=/x/p.so"])
  for entry in plan["transports"].values():
    assert entry["master"].startswith("10.78.0.1:")
    first, second = entry["ranks"]
    assert first["netns"] != second["netns"] and first["ifname"] != second["ifname"]
    for r in entry["ranks"]:
      assert f"ip netns exec {r['netns']} " in r["command"]
      assert r["env"]["NCCL_SOCKET_IFNAME"] == r["ifname"]
    if "HARP_IFNAME" in first["env"]:
      assert [r["env"]["HARP_IFNAME"] for r in entry["ranks"]] == [
        first["ifname"],
        second["ifname"],
      ]
  assert "htb" in out and "match ip sport" in out  # harp_transport.py's cloud profile


def test_bad_arguments_are_refused():
  for args in (["--sizes=6"], ["--transports=ib"], ["--harp-env=NCCL_X=1"], ["--netns=lan"]):
    proc = _run(["--dry-run"] + args)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, (args, proc.stderr)


def _blocked_module(tmp_path, name):
  """A PYTHONPATH folder in which importing `name` fails as if it were not installed."""
  folder = tmp_path / f"no_{name}"
  (folder / name).mkdir(parents=True)
  (folder / name / "__init__.py").write_text(
    f"raise ModuleNotFoundError(\"No module named '{name}'\")\n"
  )
  return str(folder)


def test_without_torch_the_real_mode_says_so(tmp_path):
  plugin = tmp_path / "libnccl-net-harp.so"
  plugin.write_bytes(b"")
  env = dict(os.environ, PYTHONPATH=_blocked_module(tmp_path, "torch"))
  proc = _run([f"--plugin={plugin}", "--quick", f"--log-dir={tmp_path / 'logs'}"], env)
  assert proc.returncode != 0
  assert "Traceback" not in proc.stderr, proc.stderr
  assert "PyTorch is not importable" in proc.stderr and "--dry-run" in proc.stderr, proc.stderr
  assert not (tmp_path / "logs").exists()  # nothing was started


def test_missing_plugin_is_reported_before_anything_runs(tmp_path):
  proc = _run([f"--plugin={tmp_path / 'none.so'}"], dict(os.environ, PYTHONPATH=""))
  assert proc.returncode != 0 and "Traceback" not in proc.stderr
  assert "does not exist" in proc.stderr and "make build" in proc.stderr


def _build_plugin(cc, path, name):
  """A stand-in plugin: a library whose ncclNetPlugin_v8 starts with `name`, as HARP's does."""
  source = f"{path}.c"
  with open(source, "w") as f:
    f.write(f'const char* ncclNetPlugin_v8[20] = {{"{name}"}};\n')
  subprocess.run([cc, "-shared", "-fPIC", source, "-o", path], check=True, timeout=60)
  return path


@pytest.fixture
def fake_torch(tmp_path):
  """(PYTHONPATH with the stand-in torch, a stand-in plugin named HARP, the C compiler)."""
  pytest.importorskip("numpy")
  cc = next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
  if cc is None:
    pytest.skip("no C compiler for the stand-in plugin")
  folder = tmp_path / "fake"
  (folder / "torch").mkdir(parents=True)
  (folder / "torch" / "__init__.py").write_text(FAKE_TORCH)
  (folder / "torch" / "distributed.py").write_text(FAKE_DISTRIBUTED)
  plugin = _build_plugin(cc, str(tmp_path / "libnccl-net-fake.so"), "HARP")
  return str(folder), plugin, cc


def _fake_run(tmp_path, fake_torch, extra=(), **env_extra):
  folder, plugin, _ = fake_torch
  out = tmp_path / "e2e.json"
  env = dict(os.environ, PYTHONPATH=folder, **env_extra)
  args = [f"--plugin={plugin}", "--sizes=8,4096,1048576", "--warmup=1", "--iters=2"]
  args += [f"--json={out}", f"--log-dir={tmp_path / 'logs'}", *extra]
  proc = _run(args, env)
  return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_launcher_with_stand_in_torch(tmp_path, fake_torch):
  png = tmp_path / "e2e.png"
  proc, results = _fake_run(tmp_path, fake_torch, [f"--plot={png}"])
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert png.exists() or "not written (No module named 'matplotlib'" in proc.stdout
  assert "GPU          : Fake GPU" in proc.stdout
  assert "PASSED" in proc.stdout and "busbw ratio" in proc.stdout
  for transport, network in (("harp", "HARP"), ("socket", "Socket")):
    entry = results["transports"][transport]
    assert entry["ok"] and entry["network"] == network, entry
    assert sorted(int(s) for s in entry["sizes"]) == [8, 4096, 1 << 20]
    for figures in entry["sizes"].values():
      assert figures["busbw_gbs"] == pytest.approx(figures["algbw_gbs"])  # 2 (n - 1) / n = 1
      assert figures["time_us"] > 0 and figures["iters"] == 2
    for rank in entry["ranks"]:
      assert rank["connections_via_net"] == 2 and rank["nccl_version"] == "2.30.0+fake"
      assert rank["elements_checked"] == 2 * (2 + 1024 + (1 << 18))
  assert "Loaded net plugin HARP" in proc.stdout
  assert set(results["busbw_ratio"]) == {"8", "4096", "1048576"}


@pytest.mark.parametrize(
  "env, message",
  [
    ({"FAKE_VIA": "P2P/IPC"}, "connections not made through NET/HARP: P2P/IPC"),
    ({"FAKE_CORRUPT": "1"}, "wrong all_reduce result"),
  ],
)
def test_launcher_fails_loudly(tmp_path, fake_torch, env, message):
  proc, results = _fake_run(tmp_path, fake_torch, ["--transports=harp"], **env)
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert message in proc.stdout and "FAILED: harp" in proc.stdout, proc.stdout
  assert not results["transports"]["harp"]["ok"]


def test_launcher_refuses_a_plugin_of_another_name(tmp_path, fake_torch):
  # A plugin whose network is not HARP: NCCL_NET=HARP finds no such network, the ranks fail.
  folder, _, cc = fake_torch
  other = _build_plugin(cc, str(tmp_path / "libnccl-net-other.so"), "OTHER")
  proc, results = _fake_run(tmp_path, (folder, other, cc), ["--transports=harp"])
  assert proc.returncode == 1, proc.stdout + proc.stderr
  assert "no net named HARP" in proc.stdout, proc.stdout
  assert "never names the network HARP" in proc.stdout
  assert not results["transports"]["harp"]["ok"]


# A stand-in for nvidia-cuda-mps-control: records how it was called (and what it read on stdin,
# where the real one takes commands such as "quit") with the pipe folder it was pointed at.
FAKE_MPS_CONTROL = """#!/bin/sh
if [ "$1" = "-d" ]; then
  echo "start $CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_MPS_RECORD"
else
  echo "command $(cat) $CUDA_MPS_PIPE_DIRECTORY" >> "$FAKE_MPS_RECORD"
fi
"""


def _fake_mps_control(tmp_path):
  folder = tmp_path / "mps_bin"
  folder.mkdir()
  control = folder / "nvidia-cuda-mps-control"
  control.write_text(FAKE_MPS_CONTROL)
  control.chmod(0o755)
  path = f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"
  return {"PATH": path, "FAKE_MPS_RECORD": str(tmp_path / "mps_record")}


def test_mps_daemon_of_the_runs_own_around_the_ranks(tmp_path, fake_torch):
  mps_env = _fake_mps_control(tmp_path)
  inherited = {"CUDA_MPS_PIPE_DIRECTORY": "/somebody/elses"}
  proc, results = _fake_run(tmp_path, fake_torch, ["--rounds=2"], **mps_env, **inherited)
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "MPS          : a daemon of the run's own" in proc.stdout
  record = (tmp_path / "mps_record").read_text().splitlines()
  pipe = record[0].split()[1]
  # Started once before the ranks, told to quit once after; its pipe folder is removed.
  assert record == [f"start {pipe}", f"command quit {pipe}"], record
  assert pipe != "/somebody/elses" and not os.path.exists(pipe)
  assert results["settings"]["mps"] is True
  for transport in ("harp", "socket"):
    for command in results["commands"][transport]:
      assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in command
  # Two rounds: each transport's figures per round, medians in "sizes", logs per round.
  assert results["settings"]["rounds"] == 2
  for entry in results["transports"].values():
    assert entry["ok"] and len(entry["rounds"]) == 2
    for size, figures in entry["sizes"].items():
      times = sorted(r[size]["time_us"] for r in entry["rounds"])
      assert figures["time_us"] == pytest.approx(sum(times) / 2)  # the median of two
    assert all(
      rank["elements_checked"] == 2 * 2 * (2 + 1024 + (1 << 18)) for rank in entry["ranks"]
    )
  logs = sorted(os.listdir(tmp_path / "logs"))
  assert "harp.round1.rank0.nccl.log" in logs and "socket.round2.rank1.nccl.log" in logs
  assert "per round, median over messages >= 1 MiB" in proc.stdout


def test_without_mps_the_run_warns_and_mps_on_refuses(tmp_path, fake_torch):
  proc, results = _fake_run(tmp_path, fake_torch, ["--mps=off", "--transports=harp"])
  assert proc.returncode == 0, proc.stdout + proc.stderr
  assert "MPS          : off. WARNING" in proc.stdout and results["settings"]["mps"] is False
  # --mps on with no control program anywhere: refused before anything starts.
  empty = tmp_path / "empty_bin"
  empty.mkdir()
  env = dict(os.environ, PATH=str(empty))
  plugin = tmp_path / "p.so"
  plugin.write_bytes(b"")
  proc = _run([f"--plugin={plugin}", "--mps=on", f"--log-dir={tmp_path / 'none'}"], env)
  # (Where MPS sits in one of the folders the script also searches, it is found: not refused.)
  folders = ("/usr/local/nvidia/bin", "/usr/local/cuda/bin", "/usr/bin")
  elsewhere = any(os.access(os.path.join(f, "nvidia-cuda-mps-control"), os.X_OK) for f in folders)
  refused = "--mps on: nvidia-cuda-mps-control is neither on PATH" in proc.stderr
  assert refused != elsewhere, proc.stderr
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
  assert not (tmp_path / "none").exists()


def test_dry_run_shows_the_mps_daemon(tmp_path):
  out, plan = _dry_run(
    tmp_path, ["--plugin=/x/p.so"], dict(os.environ, **_fake_mps_control(tmp_path))
  )
  assert "# MPS: " in out and "nvidia-cuda-mps-control -d" in out
  for entry in plan["transports"].values():
    for r in entry["ranks"]:
      assert r["env"]["CUDA_MPS_PIPE_DIRECTORY"].startswith("/tmp/harp_e2e_mps_")


def _has_matplotlib():
  return importlib.util.find_spec("matplotlib") is not None


def _assert_chart_redrawn(proc, png):
  """--chart-from drew `png`, or, without matplotlib here, said what to install."""
  if _has_matplotlib():
    assert proc.returncode == 0 and png.stat().st_size > 0, proc.stdout + proc.stderr
  else:
    assert proc.returncode != 0 and "needs matplotlib" in proc.stderr, proc.stderr


def test_chart_from_earlier_runs(tmp_path, fake_torch):
  _, results = _fake_run(tmp_path, fake_torch)
  run = tmp_path / "e2e.json"
  png = tmp_path / "redrawn.png"
  _assert_chart_redrawn(_run(["--chart-from", str(run), str(run), f"--plot={png}"]), png)
  assert results["busbw_ratio"]  # what the right-hand panel draws
  _dry_run(tmp_path, ["--plugin=/x/p.so"])  # writes plan.json, a dry run's JSON
  for args, message in (
    ([f"--chart-from={tmp_path / 'plan.json'}", f"--plot={png}"], "is not the --json of a run"),
    ([f"--chart-from={run}"], "--chart-from needs --plot PATH"),
  ):
    proc = _run(args)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


def _kept_runs(prefix):
  folder = os.path.join(ROOT, "benchmarks", "results")
  return sorted(
    os.path.join(folder, name) for name in os.listdir(folder) if name.startswith(prefix)
  )


def test_the_kept_h100_runs_redraw_the_readme_chart(tmp_path):
  kept = _kept_runs("harp_nccl_e2e_h100_")
  assert len(kept) == 3, kept  # loopback, cloud, aggregate
  png = tmp_path / "readme.png"
  _assert_chart_redrawn(_run(["--chart-from", *kept, f"--plot={png}"]), png)
  for path in _kept_runs("harp_nccl_e2e_"):  # the chart's and the later ones
    with open(path) as f:
      run = json.load(f)
    assert run["settings"]["mps"] and run["settings"]["rounds"] == 3
    for entry in run["transports"].values():
      assert entry["ok"] and not entry["problems"]


def test_chart_from_without_matplotlib_says_what_to_install(tmp_path):
  kept = os.path.join(ROOT, "benchmarks", "results", "harp_nccl_e2e_h100_cloud.json")
  env = dict(os.environ, PYTHONPATH=_blocked_module(tmp_path, "matplotlib"))
  proc = _run(["--chart-from", kept, f"--plot={tmp_path / 'x.png'}"], env)
  assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
  assert "needs matplotlib" in proc.stderr and "make bench-deps" in proc.stderr
