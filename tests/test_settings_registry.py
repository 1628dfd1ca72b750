"""The settings registry (tf_ext/settings.py): declarations, the docs' table, LightCC's config."""

import ast
import dataclasses
import os
import re
import subprocess

import pytest

import tf_ext
from tf_ext import setting_parsers, settings
from tf_ext.lightcc import config

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.dirname(os.path.abspath(tf_ext.__file__))
PREFIXES = ("TF_EXT_", "LIGHT_", "HARP_")


def _checkout_file(name):
  path = os.path.join(ROOT, name)
  assert os.path.exists(path), (
    f"{path} is missing (under Bazel, //:{name} must be in the test's data)"
  )
  return path


SETTINGS_PAGE = "docs/settings.md"


def _documented_settings_table():
  with open(_checkout_file(SETTINGS_PAGE), encoding="utf-8") as page:
    text = page.read()
  section = re.search(r"^## All settings\n(.*?)(?=^## |\Z)", text, re.M | re.S)
  assert section, f"{SETTINGS_PAGE} has no '## All settings' section"
  return [line for line in section.group(1).splitlines() if line.startswith("|")]


def test_documented_table_is_the_registry():
  documented = _documented_settings_table()
  generated = settings.markdown_table().splitlines()
  assert [row.split("|")[1].strip() for row in documented[2:]] == [
    f"`{name}`" for name in settings.SETTINGS
  ], f"{SETTINGS_PAGE}'s settings are not the registry's (regenerate: python -m tf_ext.settings)"
  assert documented == generated, (
    f"{SETTINGS_PAGE}'s settings table is stale: python -m tf_ext.settings prints it"
  )


def test_table_renders_defaults_and_meanings():
  rows = {row.split(" | ")[0]: row for row in settings.markdown_table().splitlines()[2:]}
  assert rows["| `TF_EXT_OPS_LIBRARY`"].split(" | ")[2] == "(empty)"
  for setting in settings.SETTINGS.values():
    row = rows[f"| `{setting.name}`"]
    assert row.endswith(f" | {setting.meaning} |")
    if setting.default:
      assert f" | `{setting.default}` | " in row


def test_every_default_parses_and_every_name_has_its_capability_prefix():
  assert settings.SETTINGS, "no settings declared"
  for setting in settings.SETTINGS.values():
    setting.parse(setting.default)
    assert setting.name.startswith(settings.CAPABILITIES[setting.capability])
    assert setting.name.startswith(PREFIXES)


@pytest.mark.parametrize(
  "name,capability",
  [
    ("LIGHT_NEW", "tf_ext"),
    ("TF_EXT_NEW", "lightcc"),
    ("HARP_NEW", "dynamic_embedding"),
    ("NEW_SETTING", "harp"),
    ("light_new", "lightcc"),
    ("LIGHT_", "lightcc"),
    ("LIGHT_NEW", "no_such_capability"),
  ],
)
def test_declaring_a_badly_named_setting_raises(name, capability):
  with pytest.raises(ValueError, match=name):
    settings.Setting(name, "0", "Something.", capability=capability)


def test_each_capability_prefix_is_accepted():
  for capability, prefix in settings.CAPABILITIES.items():
    assert settings.Setting(prefix + "NEW", "", "Something.", capability=capability).name


def test_declarations_are_checked():
  with pytest.raises(ValueError, match="LIGHT_NEW='x' is invalid"):
    settings.Setting("LIGHT_NEW", "x", "A flag.", capability="lightcc", parse=setting_parsers.flag)
  with pytest.raises(ValueError, match="one line"):
    settings.Setting("LIGHT_NEW", "0", "A | B.", capability="lightcc")
  with pytest.raises(ValueError, match="not an identifier"):
    settings.Setting("LIGHT_NEW", "0", "New.", capability="lightcc", attribute="new-one")
  one = settings.Setting("LIGHT_NEW", "0", "New.", capability="lightcc", attribute="new")
  with pytest.raises(ValueError, match="declared twice"):
    settings.registry([one, one])
  other = settings.Setting("LIGHT_OTHER", "0", "Other.", capability="lightcc", attribute="new")
  with pytest.raises(ValueError, match="attribute 'new' is already used"):
    settings.registry([one, other])


def test_get_reads_value_then_environment_then_default(monkeypatch):
  monkeypatch.delenv("LIGHT_TOPK_RATIO", raising=False)
  assert settings.get("LIGHT_TOPK_RATIO") == 0.01
  monkeypatch.setenv("LIGHT_TOPK_RATIO", "0.5")
  assert settings.get("LIGHT_TOPK_RATIO") == 0.5
  assert settings.get("LIGHT_TOPK_RATIO", "0.25") == 0.25
  with pytest.raises(KeyError, match="LIGHT_NO_SUCH"):
    settings.get("LIGHT_NO_SUCH")


def test_get_error_names_the_variable_value_reason_and_meaning():
  meaning = settings.SETTINGS["LIGHT_TOPK_RATIO"].meaning
  with pytest.raises(ValueError) as error:
    settings.get("LIGHT_TOPK_RATIO", "1.5")
  assert str(error.value) == f"LIGHT_TOPK_RATIO='1.5' is invalid: must be in (0, 1] ({meaning})"


def test_light_config_is_derived_from_the_lightcc_declarations():
  declared = settings.of("lightcc")
  assert declared and all(s.attribute for s in declared), "every LIGHT_* setting needs an attribute"
  assert [f.name for f in dataclasses.fields(config.LightConfig)] == [s.attribute for s in declared]
  defaults = config.LightConfig()
  for setting in declared:
    value = getattr(defaults, setting.attribute)
    assert value == setting.parse(setting.default) and type(value) is type(
      setting.parse(setting.default)
    ), setting.name
  assert defaults.fusion_buckets_mb == (1.0, 4.0, 16.0, 64.0)
  assert not defaults.enabled
  for flag in ("two_d", "topk", "fusion"):
    assert dataclasses.replace(defaults, **{flag: True}).enabled
  with pytest.raises(dataclasses.FrozenInstanceError):
    defaults.topk = True


@pytest.fixture
def clean_environment(monkeypatch):
  for setting in settings.SETTINGS.values():
    monkeypatch.delenv(setting.name, raising=False)
  return monkeypatch


def test_resolve_defaults_environment_and_keywords(clean_environment):
  assert config.resolve(4, {}) == config.LightConfig()
  clean_environment.setenv("LIGHT_TOPK_ALLREDUCE", "1")
  clean_environment.setenv("LIGHT_TOPK_RATIO", "0.5")
  clean_environment.setenv("LIGHT_FUSION_BUCKETS_MB", "2,8")
  keywords = {"light_topk_ratio": 0.25, "light_fusion_probe_steps": 3, "root_rank": 0}
  resolved = config.resolve(4, keywords)
  assert keywords == {"root_rank": 0}, "light_* keywords are consumed, others left for Horovod"
  assert resolved.topk and resolved.enabled
  assert resolved.topk_ratio == 0.25  # keyword over environment
  assert resolved.fusion_buckets_mb == (2.0, 8.0)
  assert resolved.fusion_probe_steps == 3
  assert config.resolve(4, {"light_fusion_buckets_mb": [4, 32]}).fusion_buckets_mb == (4.0, 32.0)


def test_resolve_takes_every_lightcc_setting_as_a_keyword(clean_environment):
  declared = settings.of("lightcc")
  keywords = {s.name.lower(): s.default for s in declared}
  assert config.resolve(8, keywords) == config.LightConfig()
  assert keywords == {}


def test_resolve_errors_name_the_variable(clean_environment):
  with pytest.raises(ValueError, match=r"LIGHT_TOPK_RATIO='-1' is invalid"):
    config.resolve(4, {"light_topk_ratio": -1})
  clean_environment.setenv("LIGHT_INTRA_SIZE", "0")
  with pytest.raises(ValueError, match=r"LIGHT_INTRA_SIZE='0' is invalid: must be >= 1"):
    config.resolve(4, {})
  clean_environment.delenv("LIGHT_INTRA_SIZE")
  with pytest.raises(ValueError, match="light_topk_ratoi"):
    config.resolve(4, {"light_topk_ratoi": 0.5})


def test_resolve_checks_that_intra_size_divides_the_world_size(clean_environment):
  clean_environment.setenv("LIGHT_INTRA_SIZE", "3")
  assert config.resolve(4, {}).intra_size == 3  # 2D off: the group size does not matter
  with pytest.raises(ValueError, match="LIGHT_INTRA_SIZE=3 does not divide the world size 4"):
    config.resolve(4, {"light_2d_allreduce": 1})
  assert config.resolve(6, {"light_2d_allreduce": 1}).two_d


def _direct_environment_reads(source):
  """(line, variable) for each read of a TF_EXT_/LIGHT_/HARP_ variable through os.environ or
  os.getenv in `source` (as environ.get("X"), environ["X"], "X" in environ, getenv("X"))."""
  found = []

  def reserved(node):
    return isinstance(node, ast.Constant) and str(node.value).startswith(PREFIXES)

  for node in ast.walk(ast.parse(source)):
    names = []
    if isinstance(node, ast.Call) and re.search(r"environ|getenv", ast.unparse(node.func)):
      names = [arg for arg in node.args if reserved(arg)]
    elif isinstance(node, ast.Subscript) and "environ" in ast.unparse(node.value):
      names = [node.slice] if reserved(node.slice) else []
    elif isinstance(node, ast.Compare) and any(
      "environ" in ast.unparse(c) for c in node.comparators
    ):
      names = [node.left] if reserved(node.left) else []
    found += [(node.lineno, name.value) for name in names]
  return found


def test_the_environment_read_check_finds_direct_reads():
  source = """
import os
from os import environ, getenv
a = os.environ.get("LIGHT_TOPK_RATIO", "0.01")
b = os.environ["TF_EXT_OPS_LIBRARY"]
c = "HARP_SOCKET" in os.environ
d = getenv("LIGHT_FUSION")
e = environ.get(
  "TF_EXT_CACHE_DIR"
)
f = os.environ.get("CXX", "g++")
"""
  assert _direct_environment_reads(source) == [
    (4, "LIGHT_TOPK_RATIO"),
    (5, "TF_EXT_OPS_LIBRARY"),
    (6, "HARP_SOCKET"),
    (7, "LIGHT_FUSION"),
    (8, "TF_EXT_CACHE_DIR"),
  ]


def test_only_the_registry_reads_settings_from_the_environment():
  registry = os.path.join(PACKAGE, "settings.py")
  checked, offenders = 0, []
  for directory, _, files in os.walk(PACKAGE):
    for file in files:
      path = os.path.join(directory, file)
      if file.endswith(".py") and path != registry:
        with open(path, encoding="utf-8") as source:
          offenders += [(path, *read) for read in _direct_environment_reads(source.read())]
        checked += 1
  assert checked > 10, f"only {checked} files found under {PACKAGE}"
  assert not offenders, f"read these through tf_ext.settings.get instead: {offenders}"


def _make_cache_dir(environment):
  """TF_EXT_CACHE_DIR as the Makefile resolves it in `environment`."""
  rule = 'print-cache-dir: ; @echo "$(TF_EXT_CACHE_DIR)"'
  makefile = _checkout_file("Makefile")
  command = [
    "make",
    "-s",
    "--no-print-directory",
    "-f",
    makefile,
    "--eval",
    rule,
    "print-cache-dir",
  ]
  proc = subprocess.run(command, env=environment, capture_output=True, text=True, timeout=60)
  assert proc.returncode == 0, proc.stderr
  return proc.stdout.strip()


def test_makefile_cache_dir_default_is_the_registry_default(tmp_path):
  home = str(tmp_path)
  environment = {k: v for k, v in os.environ.items() if k != "TF_EXT_CACHE_DIR"}
  environment["HOME"] = home
  default = settings.SETTINGS["TF_EXT_CACHE_DIR"].default
  expected = os.path.join(home, default[2:]) if default.startswith("~/") else default
  assert _make_cache_dir(environment) == expected
  # "empty means the default", and a set value wins.
  assert _make_cache_dir(dict(environment, TF_EXT_CACHE_DIR="")) == expected
  assert _make_cache_dir(dict(environment, TF_EXT_CACHE_DIR="/elsewhere")) == "/elsewhere"
