"""The release's own check of the imported document tower: it must reproduce block_emb's
rows, which the embedder module computed."""
import logging

import numpy as np
import tensorflow as tf

from realm_tf.configs import load_config
from realm_tf.data import block_texts
from realm_tf.import_released.release import BLOCK_EMB
from realm_tf.import_released.weights import build_model
from realm_tf.io import layout, versioned
from realm_tf.pretrained import released
from realm_tf.retrieval.index_export import load_shard_array
from realm_tf.text.tokenization import Tokenizer

# The release's own check: block_emb was computed by the embedder module, so the imported
# document tower must reproduce its rows. Compared by relative L2 error, not cosine alone:
# a wrong LayerNorm epsilon mostly rescales a row (the retrieval scores change, its cosine
# hardly does). The same float32 computation agrees to ~1e-6 (1.4e-6 on the test
# release); a wrong epsilon or GELU form was off by 5e-4 to 9e-4 there, so a match is
# 1e-4. An import keeps the variant that reproduces block_emb best and refuses only when
# even that one is off by more than BLOCK_EMB_REFUSE: then the files do not belong
# together.
BLOCK_EMB_RELATIVE_ERROR = 1e-4
BLOCK_EMB_COSINE = 0.999
BLOCK_EMB_REFUSE = 1e-2
# (projection LayerNorm epsilon, activation) variants tried when the run's own does not
# reproduce block_emb: the two epsilons the released names allow (tf.contrib's layer_norm,
# 1e-12; Keras' LayerNormalization, 1e-3) and BERT's two GELU forms.
TOWER_VARIANTS = ((1e-12, "gelu_approximate"), (1e-3, "gelu_approximate"),
                  (1e-12, "gelu"), (1e-3, "gelu"))
CHECK_BATCH = 16


def sample_rows(num_blocks: int, rows: int) -> np.ndarray:
  """`rows` row numbers spread evenly over the corpus (first and last included)."""
  return np.unique(np.linspace(0, num_blocks - 1, min(rows, num_blocks)).round().astype(np.int64))


def _index_rows(index_dir: str, picks: np.ndarray) -> np.ndarray:
  """[len(picks), P] float32: the committed index's embeddings of rows `picks` (block id =
  row, as the import publishes block_emb), each shard read once, checked as read."""
  export = versioned.latest_version(index_dir)
  if export is None:
    raise FileNotFoundError(f"{index_dir}: no committed index")
  shards = export.manifest["shards"]
  out = np.zeros([len(picks), int(export.manifest.get("dimension") or shards[0]["dimension"])],
                 np.float32)
  found = np.zeros([len(picks)], bool)
  for info in shards:
    if not info["num_blocks"]:
      continue
    ids = load_shard_array(export, info["shard"], len(shards), "block_ids.npy")
    where = np.searchsorted(ids, picks)
    inside = (where < len(ids)) & (ids[np.minimum(where, len(ids) - 1)] == picks)
    if inside.any():
      vectors = load_shard_array(export, info["shard"], len(shards), "embeddings.npy")
      out[inside] = vectors[where[inside]]
      found |= inside
  if not found.all():
    raise ValueError(f"{export.path}: rows {picks[~found][:5].tolist()} are not in the index")
  return out


def check_block_emb(run_dir: str, rows: int = 300, config=None,
                    all_variants: bool = False) -> dict:
  """Re-embeds `rows` of the run's blocks with its document tower and compares them with
  the index's rows (the released block_emb): the release's own check of the tower.

  The run's config is tried first; when it does not match (relative L2 error within
  BLOCK_EMB_RELATIVE_ERROR and cosine at least BLOCK_EMB_COSINE on every row; or with
  `all_variants`), every TOWER_VARIANTS variant is tried too, so the result says which
  LayerNorm epsilon and GELU form reproduce block_emb.

  Args:
    run_dir: an imported run (its checkpoint, block text store and index written).
    rows: blocks to re-embed, spread over the corpus.
    config: the run's config (default its params.yaml).
    all_variants: try every variant even when the run's own matches.
  Returns:
    {rows, max_relative_error, min_cosine (the thresholds), run: {epsilon, activation,
    min_cosine, mean_cosine, max_relative_error, matches}, variants: [the same per variant
    tried], best: the variant with the smallest error}.
  """
  config = config or load_config(layout.params_path(run_dir))
  store = block_texts.HostBlockTexts(config.index.text_store)
  picks = sample_rows(len(store), rows)
  want = _index_rows(layout.index_dir(run_dir, config.index.index_dir), picks)
  want_norms = np.maximum(np.linalg.norm(want, axis=1), 1e-12)
  tokenizer = Tokenizer(config.model.tokenizer.vocab_file, config.model.tokenizer.lower_case)
  inputs = tokenizer.encode(tf.constant([store.titles[int(r)] for r in picks]),
                            config.model.retriever.block_seq_length,
                            pair_texts=tf.constant([store.texts[int(r)] for r in picks])).as_dict()
  checkpoint = layout.latest_checkpoint(run_dir)
  kind = "openqa" if config.task.type == "openqa" else "pretrain"

  def measure(epsilon: float, activation: str) -> dict:
    variant = config.replace(model=dict(
        encoder=dict(hidden_activation=activation),
        retriever=dict(projection_layer_norm_epsilon=epsilon)))
    model = build_model(variant, kind)
    tf.train.Checkpoint(model=model).read(checkpoint).expect_partial()
    got = np.concatenate([
        model.retriever.embed_documents({k: v[i:i + CHECK_BATCH] for k, v in inputs.items()}
                                        ).numpy()
        for i in range(0, len(picks), CHECK_BATCH)])
    error = np.linalg.norm(got - want, axis=1) / want_norms
    cosine = np.sum(got * want, axis=1) / (
        np.maximum(np.linalg.norm(got, axis=1), 1e-12) * want_norms)
    return dict(epsilon=epsilon, activation=activation,
                min_cosine=round(float(cosine.min()), 7),
                mean_cosine=round(float(cosine.mean()), 7),
                max_relative_error=float(f"{error.max():.3g}"),
                matches=bool(error.max() <= BLOCK_EMB_RELATIVE_ERROR
                             and cosine.min() >= BLOCK_EMB_COSINE))

  own = (config.model.retriever.projection_layer_norm_epsilon
         if config.model.retriever.projection_layer_norm else 0.0,
         config.model.encoder.hidden_activation)
  result = dict(rows=int(len(picks)), max_relative_error=BLOCK_EMB_RELATIVE_ERROR,
                min_cosine=BLOCK_EMB_COSINE, run=measure(*own))
  tried = [result["run"]]
  if all_variants or not result["run"]["matches"]:
    for variant in TOWER_VARIANTS:
      if variant != own and config.model.retriever.projection_layer_norm:
        tried.append(measure(*variant))
  result["variants"] = tried
  result["best"] = min(tried, key=lambda v: v["max_relative_error"])
  logging.info("block_emb check over %d blocks: %s", len(picks), result["best"])
  return result


def tower_that_reproduces(config, check: dict, block_emb_checkpoint: str):
  """The run's config with the tower variant that reproduces block_emb best (check_block_emb's
  `best`); the run's own config when that is it.

  Args:
    config: the run's config, as check_block_emb measured it.
    check: check_block_emb's result.
    block_emb_checkpoint: the checkpoint holding block_emb (named in the error).
  Returns:
    The config the run keeps.
  Raises:
    ReleasedFormatError: even the best variant is off by more than BLOCK_EMB_REFUSE: the
      embedder module and block_emb do not belong together.
  """
  best = check["best"]
  if best["max_relative_error"] > BLOCK_EMB_REFUSE:
    raise released.ReleasedFormatError(
        f"the imported document tower does not reproduce {block_emb_checkpoint}'s "
        f"{BLOCK_EMB} (best: relative error {best['max_relative_error']}, minimum cosine "
        f"{best['min_cosine']} over {check['rows']} blocks, with LayerNorm epsilon "
        f"{best['epsilon']} and {best['activation']}; at most {BLOCK_EMB_REFUSE} "
        f"accepted): the embedder module and block_emb do not belong together")
  if not best["matches"]:
    logging.warning("block_emb is reproduced only to a relative error of %g (a match is "
                    "%g): %s", best["max_relative_error"], BLOCK_EMB_RELATIVE_ERROR, check)
  if best is check["run"]:
    return config
  logging.warning("block_emb is reproduced with LayerNorm epsilon %g and %s, not the "
                  "names' defaults: the run uses them", best["epsilon"], best["activation"])
  return config.replace(model=dict(
      encoder=dict(hidden_activation=best["activation"]),
      retriever=dict(projection_layer_norm_epsilon=best["epsilon"])))
