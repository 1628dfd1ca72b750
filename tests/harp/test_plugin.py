"""HARP's plugin loaded the way NCCL loads it: a C++ harness (plugin_harness.cc, compiled here)
dlopens tf_ext/harp/libnccl-net-harp.so and drives its ncclNetPlugin_vN tables as NCCL's proxy
thread does, between two processes over loopback."""

import os
import re
import subprocess

import pytest

from tf_ext import harp, settings

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HARNESS_SOURCE = os.path.join(ROOT, "tests", "harp", "plugin_harness.cc")
INVALID_ARGUMENT = 4  # ncclInvalidArgument
INVALID_USAGE = 5  # ncclInvalidUsage
REMOTE_ERROR = 6  # ncclRemoteError


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
  binary = str(tmp_path_factory.mktemp("harness") / "plugin_harness")
  compiled = subprocess.run(
    ["g++", "-std=c++17", "-O2", "-I", ROOT, HARNESS_SOURCE, "-o", binary, "-ldl"],
    capture_output=True,
    text=True,
  )
  assert compiled.returncode == 0, compiled.stderr
  return binary


def run(harness, version, *args, **harp_settings):
  """The harness's output; the environment holds no HARP_* setting nor NCCL_SOCKET_IFNAME but
  `harp_settings` (which may also name them or the harness's HARNESS_TRAFFIC_CLASS)."""
  env = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("HARP_", "HARNESS_")) and k != "NCCL_SOCKET_IFNAME"
  }
  env.update({k: str(v) for k, v in harp_settings.items()})
  result = subprocess.run(
    [harness, harp.plugin_path(), str(version), *args],
    capture_output=True,
    text=True,
    env=env,
    timeout=100,
  )
  return result


def test_the_plugins_defaults_are_the_declared_settings(harness):
  result = run(harness, 10, "config")
  assert "INIT 0" in result.stdout, result.stdout + result.stderr
  config_line = next(line for line in result.stdout.splitlines() if "HARP_NSTREAMS=" in line)
  reported = dict(re.findall(r"(HARP_[A-Z_]+)=(\S*)", config_line))
  declared = {s.name: s.default for s in settings.of("harp")}
  assert reported == declared
  assert "PROPERTIES" in result.stdout and "ptrSupport=1" in result.stdout  # NCCL_PTR_HOST


@pytest.mark.parametrize(
  "name,value",
  [
    ("HARP_NSTREAMS", "0"),
    ("HARP_NTHREADS", "two"),
    ("HARP_CPU_AFFINITY", "1,"),
    ("HARP_CHUNK_BYTES", "10"),
    ("HARP_ZEROCOPY_THRESHOLD", "-1"),
    ("HARP_IFNAME", "no-such-if0"),
    ("HARP_TIMEOUT_MS", "5"),
    ("HARP_CALLER_CONNECTIONS", "65"),
  ],
)
def test_an_invalid_setting_fails_init_naming_it(harness, name, value):
  result = run(harness, 10, "config", **{name: value})
  assert f"INIT {INVALID_USAGE}" in result.stdout, result.stdout
  warnings = [line for line in result.stdout.splitlines() if line.startswith("LOG WARN")]
  assert any(f"{name}='{value}' is invalid" in line for line in warnings), result.stdout
  if name != "HARP_IFNAME":  # whether an interface exists is only known where the plugin runs
    with pytest.raises(ValueError, match=f"{name}='{re.escape(value)}' is invalid"):
      settings.get(name, value)


def test_nccl_socket_ifname_chooses_the_interface_when_harp_ifname_is_unset(harness):
  result = run(harness, 10, "config", NCCL_SOCKET_IFNAME="=lo")
  assert "INIT 0" in result.stdout, result.stdout + result.stderr
  init_line = next(line for line in result.stdout.splitlines() if "HARP_NSTREAMS=" in line)
  assert " on lo 127.0.0.1" in init_line, result.stdout
  # The log says why: the variable that chose it, and its value.
  assert "NCCL_SOCKET_IFNAME='=lo'" in result.stdout, result.stdout
  # HARP_IFNAME, when set, wins.
  result = run(harness, 10, "config", NCCL_SOCKET_IFNAME="no-such-if", HARP_IFNAME="127.0.0.1")
  assert "INIT 0" in result.stdout, result.stdout
  assert "HARP_IFNAME='127.0.0.1'" in result.stdout, result.stdout
  result = run(harness, 10, "config", NCCL_SOCKET_IFNAME="no-such-if")
  assert f"INIT {INVALID_USAGE}" in result.stdout, result.stdout
  assert "NCCL_SOCKET_IFNAME='no-such-if' admits no interface" in result.stdout, result.stdout


def marked_sockets(output):
  return {
    side: int(count)
    for side, count in re.findall(r"TRAFFIC CLASS 136: (\w+), (\d+) sockets marked", output)
  }


@pytest.mark.parametrize("version", [6, 7, 8, 9, 10, 11, 12])
def test_every_version_transfers_grouped_receives_with_32_outstanding(harness, version):
  # From v10 on, with the communicator's traffic class DSCP AF41 (TOS 0x88, 136).
  traffic_class = {"HARNESS_TRAFFIC_CLASS": 0x88} if version >= 10 else {}
  result = run(
    harness,
    version,
    "transfer",
    "2",
    str(4 << 20),
    HARP_IFNAME="127.0.0.1",
    HARP_NSTREAMS=3,
    HARP_CHUNK_BYTES=65536,
    **traffic_class,
  )
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"HARNESS OK transfer v{version}: 2 connections" in result.stdout
  assert "SENDER OK" in result.stdout
  if traffic_class:
    # 2 connections of 3 streams and a control socket each; v10 hands the class to connect only,
    # v11 and later to init, for both sides.
    expected = {"sender": 8, "receiver": 0 if version == 10 else 8}
    assert marked_sockets(result.stdout) == expected, result.stdout


@pytest.mark.parametrize("version", [11, 12])
def test_the_plugin_survives_nccls_unload_and_loads_again(harness, version):
  # NCCL 2.28+: an init per communicator (two at once: connected, finalized one at a time), the
  # last one's finalize, dlclose, then dlopen and init for the next one, while HARP's worker
  # threads run on (without -z nodelete they crash once their poll returns).
  result = run(harness, version, "reload", HARP_IFNAME="127.0.0.1")
  assert result.returncode == 0, result.stdout + result.stderr
  assert f"HARNESS OK reload v{version}: two communicators" in result.stdout
  # The finalized context was refused, with a reason, before the unload.
  assert "listen: not a context from init" in result.stdout
  assert "finalize: not a context from init" in result.stdout


def test_an_invalid_traffic_class_is_refused_with_a_reason(harness):
  result = run(harness, 11, "config", HARP_IFNAME="127.0.0.1", HARNESS_TRAFFIC_CLASS=256)
  assert f"INIT {INVALID_ARGUMENT}" in result.stdout, result.stdout
  assert "traffic class 256 is invalid" in result.stdout
  result = run(harness, 10, "transfer", "1", "0", HARP_IFNAME="127.0.0.1", HARNESS_TRAFFIC_CLASS=-2)
  assert result.returncode != 0
  assert f"connect returned {INVALID_ARGUMENT}" in result.stdout, result.stdout
  assert "connect: traffic class -2 is invalid" in result.stdout


def test_messages_up_to_64_mib_on_several_connections_at_once(harness):
  result = run(harness, 10, "transfer", "4", str(64 << 20), HARP_IFNAME="lo")
  assert result.returncode == 0, result.stdout + result.stderr
  assert "HARNESS OK transfer v10: 4 connections" in result.stdout


def elapsed_ms(output, side):
  match = re.search(rf"HARNESS OK {side} saw error (\d+) after (\d+) ms", output)
  assert match, output
  return int(match.group(1)), int(match.group(2))


def test_a_sender_killed_mid_message_fails_the_receive_quickly(harness):
  result = run(harness, 10, "kill-sender", HARP_IFNAME="127.0.0.1")
  assert result.returncode == 0, result.stdout + result.stderr
  error, ms = elapsed_ms(result.stdout, "receiver")
  assert error == REMOTE_ERROR and ms < 5000


def test_a_receiver_killed_mid_message_fails_the_send_quickly(harness):
  # The receiver (the harness's main process) kills itself; the sender reports.
  result = run(harness, 9, "kill-receiver", HARP_IFNAME="127.0.0.1")
  assert result.returncode == -9, result.stdout + result.stderr
  error, ms = elapsed_ms(result.stdout, "sender")
  assert error == REMOTE_ERROR and ms < 5000


def test_garbage_and_stale_handles_are_errors(harness):
  result = run(harness, 8, "handles", HARP_IFNAME="127.0.0.1")
  assert result.returncode == 0, result.stdout + result.stderr
  assert "HARNESS OK handles" in result.stdout
  assert "not a HARP handle" in result.stdout  # the logged reason
