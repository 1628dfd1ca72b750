"""TFRA's model mode: training or inference."""


class ModelMode:
  """TFRA's model mode. tf_ext lookups never insert in either mode (a missing key reads its
  initial row; only optimizer updates create rows), so the mode only records the choice."""

  TRAIN = "train"
  INFERENCE = "inference"
  CURRENT_SETTING = TRAIN


def get_model_mode():
  return ModelMode.CURRENT_SETTING


def enable_train_mode():
  ModelMode.CURRENT_SETTING = ModelMode.TRAIN


def enable_inference_mode():
  ModelMode.CURRENT_SETTING = ModelMode.INFERENCE
