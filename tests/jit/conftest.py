import pytest


@pytest.fixture(autouse=True)
def compiled_where_ready(monkeypatch):
  """These tests check what padded, compiled calls compute and count them, so the speed check
  (TF_EXT_JIT_ADAPTIVE), which may run calls uncompiled on a CPU where XLA is slower, is off
  unless a test turns it on (`adaptive=True`, as the speed-check tests do)."""
  monkeypatch.setenv("TF_EXT_JIT_ADAPTIVE", "0")
