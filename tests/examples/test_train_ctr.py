"""The demo (make demo) runs end to end on a small click log and checks its own invariants."""

from _examples import run_example


def test_train_ctr_quick():
  stdout = run_example("train_ctr.py", "--quick")
  assert "AUC" in stdout and "equal" in stdout


def test_train_ctr_quick_with_loss_aware_mixed_precision():
  stdout = run_example("train_ctr.py", "--quick", "--amp", "bfloat16")
  assert "mixed precision (bfloat16): 100% of 40 steps in half" in stdout
  assert "equal" in stdout


def test_train_ctr_quick_with_graph_passes():
  stdout = run_example("train_ctr.py", "--quick", "--graph-passes")
  assert "graph passes:" in stdout
  assert "0 lookups" not in stdout
