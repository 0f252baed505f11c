"""`make demo` runs the main job end to end: here, warm-started retrieval over its passages."""
import re
import subprocess
import sys


def test_demo_retrieves_the_written_passage(repo_dir):
  result = subprocess.run([sys.executable, "-m", "realm_tf.demo", "--config",
                           str(repo_dir / "configs" / "demo.yaml")], cwd=repo_dir,
                          capture_output=True, text=True, timeout=600, check=False)
  assert result.returncode == 0, result.stderr[-3000:]
  match = re.search(r"Top-1 retrieval accuracy: (\d+)/(\d+)", result.stdout)
  assert match, result.stdout[-2000:]
  hits, total = int(match.group(1)), int(match.group(2))
  assert total >= 6 and hits >= total - 1, result.stdout
