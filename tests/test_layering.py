"""The package diagram in .importlinter holds, and the check is able to fail.

`make lint` runs the same `lint-imports`; this keeps a bare `pytest` honest too, and the
second test shows a layer importing upwards is reported (a check that cannot fail proves
nothing).
"""
import configparser
import os
import pathlib
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
LINT_IMPORTS = shutil.which("lint-imports", path=os.path.dirname(sys.executable))


def _lint_imports(cwd: pathlib.Path, pythonpath: pathlib.Path) -> subprocess.CompletedProcess:
  env = dict(os.environ, PYTHONPATH=str(pythonpath))
  return subprocess.run([LINT_IMPORTS, "--no-cache"], cwd=cwd, env=env, capture_output=True,
                        text=True, timeout=300, check=False)


def test_the_repository_keeps_its_layers():
  result = _lint_imports(REPO, REPO)
  assert result.returncode == 0, result.stdout + result.stderr
  assert "0 broken" in result.stdout


def _layered_modules(config_path: pathlib.Path) -> list[str]:
  """`<container>.<layer>` for every layer of every layers contract."""
  parser = configparser.ConfigParser()
  parser.read(config_path)
  modules = []
  for section in parser.sections():
    if parser[section].get("type") != "layers":
      continue
    rows = parser[section]["layers"].split("\n")
    names = [n.strip() for row in rows for n in row.replace("|", ":").split(":") if n.strip()]
    modules += [f"{container}.{name}" for container in parser[section]["containers"].split()
                for name in names]
  return modules


def test_an_upward_import_breaks_the_contract(tmp_path):
  """A copy of the contract over a skeleton with realm_tf.training importing realm_tf.train."""
  shutil.copy(REPO / ".importlinter", tmp_path / ".importlinter")
  for package in ("realm_tf", "beam", "serving", "benchmarks", "tests"):
    (tmp_path / package).mkdir()
    (tmp_path / package / "__init__.py").write_text("")
  for module in _layered_modules(tmp_path / ".importlinter"):
    parts = module.split(".")
    tmp_path.joinpath(*parts).mkdir(parents=True, exist_ok=True)
    for depth in range(2, len(parts) + 1):  # realm_tf/__init__.py exists already
      tmp_path.joinpath(*parts[:depth], "__init__.py").touch()
  assert _lint_imports(tmp_path, tmp_path).returncode == 0  # the skeleton alone is clean
  (tmp_path / "realm_tf" / "training" / "loop.py").write_text("from realm_tf import train\n")
  (tmp_path / "realm_tf" / "io" / "paths.py").write_text("import serving\n")
  (tmp_path / "realm_tf" / "io" / "versioned" / "manifest" / "names.py").write_text(
      "from realm_tf.io.versioned import reading\n")
  result = _lint_imports(tmp_path, tmp_path)
  assert result.returncode != 0
  assert "realm_tf.training.loop -> realm_tf.train" in result.stdout, result.stdout
  assert "realm_tf.io.paths -> serving" in result.stdout, result.stdout
  assert ("realm_tf.io.versioned.manifest.names -> realm_tf.io.versioned.reading"
          in result.stdout), result.stdout
