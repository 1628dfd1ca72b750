"""The Estimator example runs end to end: train_and_evaluate, export, serving in a fresh process."""

from _examples import run_example


def test_estimator_columns_quick():
  stdout = run_example("estimator_columns.py", "--quick")
  assert "served in a fresh process: max |probability difference| to Estimator.predict = 0" in (
    stdout
  )
