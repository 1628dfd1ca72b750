"""The Estimator example runs end to end: train_and_evaluate, both exports, serving each in a fresh
process (the core-ops one where tf_ext cannot be imported)."""

from _examples import run_example


def test_estimator_columns_quick():
  stdout = run_example("estimator_columns.py", "--quick")
  for how in ("with", "WITHOUT"):
    line = f"served {how} tf_ext in a fresh process: max |probability difference| to "
    assert line + "Estimator.predict = 0" in stdout, stdout
