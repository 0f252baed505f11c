"""How every command line (realm_tf.train / evaluate / export, beam.*, serving.*) reports a
failure: one line on stderr that says what is wrong and with which path or flag, and an
exit code a script can act on. The traceback only with `--verbosity debug` (or absl's
`--verbosity 1`): a user who mistyped a bucket needs the bucket's name, not 80 lines of
gRPC and Beam internals. A failure that is neither a usage error nor storage is a bug, and
keeps its traceback.

  exit 2   a usage error: a flag, a path or pattern that names nothing, a config mistake,
           a bucket that does not exist
  exit 1   storage could not be asked (permission, network, a server error after retries)

The absl command lines (realm_tf.train, evaluate, export, import_released) share one
skeleton, `run_absl`. Their flags parse and --help answers before TensorFlow loads (each
command does its heavy imports itself), so this module, which they import at their top,
imports no TensorFlow.
"""
import argparse
import contextlib
import json
import logging
import sys
from typing import Any, Callable, Iterator, Optional, Sequence

from absl import app, flags

USAGE_EXIT = 2
STORAGE_EXIT = 1
VERBOSITY_CHOICES = ("info", "debug")


class UsageError(ValueError):
  """A user's mistake on the command line (exit 2)."""
  is_usage_error = True


def is_usage_error(error: BaseException) -> bool:
  """FileNotFoundError and friends (a path that names nothing), UsageError, and any error
  class that declares `is_usage_error = True` (realm_tf.configs.ConfigError does; it sits
  beside this package and cannot import it)."""
  return (isinstance(error, (FileNotFoundError, NotADirectoryError, IsADirectoryError))
          or bool(getattr(error, "is_usage_error", False)))


def is_storage_error(error: BaseException) -> bool:
  """The store could not be asked: realm_tf.io.storage.StorageError, which declares
  `is_storage_error = True` (storage imports TensorFlow; this module must not)."""
  return bool(getattr(error, "is_storage_error", False))


def one_line(error: BaseException) -> str:
  lines = [line.strip() for line in str(error).splitlines() if line.strip()]
  return lines[0] if lines else type(error).__name__


@contextlib.contextmanager
def errors_reported(program: str, debug: bool = False) -> Iterator[None]:
  """Runs a command line's body; usage and storage errors exit with one line (see the
  module docstring), others propagate with their traceback."""
  try:
    yield
  except Exception as e:  # pylint: disable=broad-except
    if debug:
      raise
    if is_usage_error(e):
      print(f"{program}: error: {one_line(e)}", file=sys.stderr)
      sys.exit(USAGE_EXIT)
    if is_storage_error(e):
      print(f"{program}: storage error: {one_line(e)}", file=sys.stderr)
      sys.exit(STORAGE_EXIT)
    raise


def debug_requested(verbosity) -> bool:
  """`--verbosity debug` (argparse command lines) or absl's numeric verbosity >= 1."""
  if isinstance(verbosity, str) and not verbosity.lstrip("-").isdigit():
    return verbosity == "debug"
  return int(verbosity) >= 1


def print_result(result: Any) -> None:
  """A command's result on stdout: indented JSON, keys sorted (what is not JSON as str)."""
  print(json.dumps(result, indent=2, sort_keys=True, default=str))


def run_absl(program: str, command: Callable[[], Any],
             refused: tuple[type[Exception], ...] = ()) -> None:
  """Runs an absl command line: parses its flags, runs `command` under errors_reported
  and prints the result it returns (print_result; None: nothing).

  Args:
    program: the command's name in its error lines (its module, e.g. realm_tf.export).
    command: the command's body, called with the flags parsed (absl.flags.FLAGS).
    refused: the exceptions by which the library calls it makes refuse their arguments:
      reported as usage errors (one line, exit 2).
  """
  def main(argv):
    del argv
    with errors_reported(program, debug_requested(flags.FLAGS.verbosity)):
      try:
        result = command()
      except refused as e:
        raise UsageError(str(e)) from e
    if result is not None:
      print_result(result)

  logging.getLogger().setLevel(logging.INFO)
  app.run(main)


def split_verbosity(argv: Optional[Sequence[str]]) -> tuple[bool, list[str]]:
  """(whether --verbosity debug was given, the other arguments) for argparse command
  lines whose unknown flags go on to Beam's runner untouched."""
  parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
  parser.add_argument("--verbosity", choices=VERBOSITY_CHOICES, default="info")
  known, rest = parser.parse_known_args(sys.argv[1:] if argv is None else list(argv))
  return known.verbosity == "debug", rest


__all__ = ["USAGE_EXIT", "STORAGE_EXIT", "UsageError", "debug_requested", "errors_reported",
           "is_storage_error", "is_usage_error", "one_line", "print_result", "run_absl",
           "split_verbosity"]
