"""The parsers of settings (tf_ext/settings.py): each takes the raw string the environment holds
and returns the value, or raises ValueError with the reason when the string is invalid."""

import re


def flag(raw):
  value = raw.strip().lower()
  if value in ("1", "true", "yes", "on"):
    return True
  if value in ("0", "false", "no", "off", ""):
    return False
  raise ValueError("expected 0 or 1")


def auto_flag(raw):
  """ "auto", or a flag."""
  if raw.strip().lower() == "auto":
    return "auto"
  try:
    return flag(raw)
  except ValueError:
    raise ValueError("expected 0, 1 or auto") from None


def gpu_tables(raw):
  """TF_EXT_GPU_TABLES: the op library compares the exact text ("host": emulate's older name)."""
  if raw not in ("0", "1", "emulate", "host"):
    raise ValueError("expected 0, 1 or emulate (or host, its older name)")
  return raw


def tfra_initial_rows(raw):
  """TF_EXT_TFRA_INITIAL_ROWS."""
  if raw not in ("tfra", "per_key"):
    raise ValueError("expected tfra or per_key")
  return raw


def int_at_least(minimum):
  def parse(raw):
    value = int(raw)
    if value < minimum:
      raise ValueError(f"must be >= {minimum}")
    return value

  return parse


def fraction(raw):
  value = float(raw)
  if not 0.0 < value <= 1.0:
    raise ValueError("must be in (0, 1]")
  return value


def increasing_positive_numbers(raw):
  values = tuple(float(item) for item in raw.split(",") if item.strip())
  if not values or any(v <= 0 for v in values) or list(values) != sorted(values):
    raise ValueError("must be positive numbers in increasing order, e.g. 1,4,16")
  return values


def float_at_least(minimum):
  def parse(raw):
    value = float(raw)
    if not value >= minimum or value == float("inf"):
      raise ValueError(f"must be a finite number >= {minimum}")
    return value

  return parse


def positive_float(raw):
  value = float(raw)
  if not 0.0 < value < float("inf"):
    raise ValueError("must be a finite number > 0")
  return value


def open_fraction(raw):
  value = float(raw)
  if not 0.0 < value < 1.0:
    raise ValueError("must be in (0, 1)")
  return value


def op_names(raw):
  names = tuple(item.strip() for item in raw.split(",") if item.strip())
  for name in names:
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
      raise ValueError(f"{name!r} is not an op type name (e.g. MatMul,BatchMatMulV2)")
  return names


# HARP's parsers accept exactly what the plugin's C++ parser accepts (plain decimal digits, no
# sign or spaces), so a value that passes here cannot fail at NCCL's init.
def harp_integer(minimum, maximum):
  def parse(raw):
    if not re.fullmatch(r"[0-9]{1,19}", raw) or not minimum <= int(raw) <= maximum:
      raise ValueError(f"expected an integer in [{minimum}, {maximum}]")
    return int(raw)

  return parse


def harp_cpu_list(raw):
  cpus = []
  for item in raw.split(",") if raw else []:
    match = re.fullmatch(r"([0-9]{1,19})(?:-([0-9]{1,19}))?", item)
    first = int(match.group(1)) if match else 0
    last = int(match.group(2) or first) if match else -1
    if not match or first > last or last >= 4096:
      raise ValueError("expected CPU numbers below 4096 and ranges, e.g. 0,2,4-7")
    cpus.extend(range(first, last + 1))
  return tuple(cpus)


def harp_interface(raw):
  if len(raw) > 64 or " " in raw:
    raise ValueError("expected an interface name or an IPv4 address, or empty (auto)")
  return raw
