"""Held-out masked sentences filled in with and without retrieval (the paper's Table 3).

The pre-trained REALM model reads each held-out masked sentence x twice: as in
pre-training (the top-k retrieved blocks, plus the null document when the run includes it;
the prediction is the argmax of the marginal Σ_z p(z|x) p(y|z,x)), and with the null
document alone (no retrieval: what the same reader knows by itself). Both use the
pre-training task's own step code (`PretrainTask.forward`), on the run's newest index, or
at step 0 on the index the run started from (what REALM's objective had to work with).
own_block_top1 then says how often the most probable block is the one stating the fact.
"""
import collections
import math
from typing import List, Sequence

import numpy as np
import tensorflow as tf

from realm_tf import tasks
from realm_tf.configs import load_config
from realm_tf.data import pretraining_inputs
from realm_tf.demo.sentences import Sentence, answer_key, states
from realm_tf.io import layout, versioned


def wordpieces_text(vocab: Sequence[str], ids: Sequence[int]) -> str:
  """Wordpiece ids → text, '##' continuations joined to the piece before."""
  out = ""
  for token in (vocab[int(i)] for i in ids):
    out += token[2:] if token.startswith("##") and out else (" " if out else "") + token
  return out


def fill_in(model_dir: str, heldout_path: str, sentences: Sequence[Sentence],
            at_start: bool = False, index_root: str = "") -> List[dict]:
  """One dict per held-out sentence (in file order): the masked x, the answer, the
  predictions with and without retrieval with the probability each gives the answer,
  and the retrieved blocks with p(z|x), most probable first.

  Args:
    model_dir: a pre-training run (its params.yaml; its newest checkpoint).
    heldout_path: the held-out sentences' PRETRAINING records.
    sentences: the records of `heldout_path`, in file order.
    at_start: read the run's weights at step 0 instead of its newest checkpoint: the
      retriever of its init_checkpoint and the reader of its mlm_init_checkpoint, restored
      as its task does before the first step (what the run started from).
    index_root: a committed index to search (its newest version) instead of the run's
      own: with at_start, the index the run started from (the run's builder deletes old
      versions).

  Raises:
    FileNotFoundError: no committed index, or no checkpoint.
    ValueError: a held-out sentence that cannot be masked at its span.
  """
  config = load_config(layout.params_path(model_dir))
  pretrain = dict(start_index_builder=False)
  if not at_start:
    # The weights come from the run's checkpoint: no warm start, no initial checkpoints.
    config = config.replace(model=dict(warm_start=dict(source="")))
    pretrain.update(init_checkpoint="", mlm_init_checkpoint="")
  config = config.replace(task=dict(pretrain=pretrain))
  strategy = tf.distribute.get_strategy()
  task = tasks.get_task(config, model_dir)
  model = task.build_model()
  index = task.build_index(strategy)
  root = index_root or layout.index_dir(model_dir, config.index.index_dir)
  export = versioned.latest_version(root)
  if export is None:
    raise FileNotFoundError(f"{root}: no committed index to retrieve from")
  index.swap(export)
  null_task = tasks.get_task(config.replace(task=dict(pretrain=dict(retrieval=False))),
                             model_dir)
  null_task.build_index(strategy)  # only the null document's inputs
  c = config.task.pretrain
  dataset = pretraining_inputs.pretraining_dataset(
      heldout_path, task.tokenizer, config.model.retriever.query_seq_length,
      "salient_spans", c.max_predictions_per_seq, batch_size=max(1, len(sentences)), seed=0,
      repeat=False, shuffle_buffer=0, skip_unsalient=True, drop_remainder=False)
  features = next(iter(dataset))
  if at_start:
    task.initialize(model)
    checkpoint = (f"step 0: retriever {config.task.pretrain.init_checkpoint}, reader "
                  f"{config.task.pretrain.mlm_init_checkpoint}")
    _, out = task.forward(model, features, training=False)
  else:
    checkpoint = layout.latest_checkpoint(model_dir)
    status = tf.train.Checkpoint(model=model).read(checkpoint)
    status.expect_partial()
    _, out = task.forward(model, features, training=False)
    status.assert_existing_objects_matched()
  _, alone = null_task.forward(model, features, training=False)

  vocab = task.tokenizer.vocab
  weights = features["masked_lm"]["weights"].numpy()  # [B, M]
  gold = features["masked_lm"]["ids"].numpy()
  p_z = tf.nn.softmax(out["retrieval_logits"], axis=-1).numpy()  # [B, K], null first
  token_log_probs = out["token_log_probs"].numpy()  # [B, K, M]
  # log p(y_m | x) = log Σ_z p(z|x) p(y_m|z,x), per masked wordpiece; the span's
  # probability is their product (REALM marginalises each masked token on its own).
  marginal = np.log(np.maximum(np.einsum("bk,bkm->bm", p_z, np.exp(token_log_probs)),
                               1e-30))
  alone_log_probs = alone["token_log_probs"].numpy()[:, 0]  # [B, M]
  block_ids = out["block_ids"].numpy()  # [B, k]
  store = index.store
  offset = p_z.shape[1] - block_ids.shape[1]  # 1 with the null document first
  results = []
  if len(weights) != len(sentences):
    raise ValueError(f"{heldout_path}: {len(weights)} of {len(sentences)} held-out sentences "
                     f"could be masked at their span")
  for b, sentence in enumerate(sentences):
    n = int(weights[b].sum())
    start, end, label = sentence.spans[0]
    rows = store.rows(block_ids[b])
    blocks = [dict(block_id=int(block_ids[b, j]), title=store.title_strings[rows[j]],
                   text=store.text_strings[rows[j]], p=float(p_z[b, j + offset]))
              for j in range(block_ids.shape[1])]
    blocks.sort(key=lambda x: -x["p"])
    results.append(dict(
        masked=sentence.text[:start] + "___" + sentence.text[end:],
        answer=sentence.text[start:end], label=label,
        answer_wordpieces=wordpieces_text(vocab, gold[b, :n]),
        with_retrieval=wordpieces_text(vocab, out["mlm_predictions"].numpy()[b, :n]),
        without_retrieval=wordpieces_text(vocab, alone["mlm_predictions"].numpy()[b, :n]),
        p_answer_with_retrieval=float(np.exp(marginal[b, :n].sum())),
        p_answer_without_retrieval=float(np.exp(alone_log_probs[b, :n].sum())),
        p_null_document=float(p_z[b, 0]) if offset else 0.0,
        source_block_id=sentence.block_id, blocks=blocks,
        checkpoint=checkpoint, index_version=index.version))
  return results


def _commonest(fills: Sequence[str]) -> dict:
  """The commonest of `fills` and its share (a collapsed head fills every blank alike)."""
  value, count = collections.Counter(fills).most_common(1)[0]
  return dict(fill=value, share=count / len(fills))


def score(results: Sequence[dict]) -> dict:
  """Fill-in accuracy with and without retrieval over fill_in's results.

  A blank is filled right when every masked wordpiece is the answer's. Beside each
  accuracy (± its binomial standard error): the commonest fill of a blank and the
  commonest predicted wordpiece, each with its share (of blanks, of masked wordpieces),
  which show a head that predicts one frequent word everywhere; and the share of
  sentences for which some retrieved block states the answer (what retrieval could give).

  Raises:
    ValueError: no results.
  """
  if not results:
    raise ValueError("no filled-in sentences to score")
  n = len(results)
  out = dict(count=n)
  for reading in ("with_retrieval", "without_retrieval"):
    right = sum(r[reading] == r["answer_wordpieces"] for r in results)
    p = right / n
    out[reading] = dict(
        right=right, accuracy=p, stderr=math.sqrt(p * (1 - p) / n),
        commonest_fill=_commonest([r[reading] for r in results]),
        commonest_wordpiece=_commonest([w for r in results for w in r[reading].split()]))
  key = [answer_key(r["answer"]) for r in results]
  out["answer_in_retrieved_block"] = sum(
      any(states(answer_key(b["text"]), k) for b in r["blocks"])
      for r, k in zip(results, key)) / n
  return out


def own_block_top1(results: Sequence[dict], own_block_ids: Sequence[Sequence[int]]) -> dict:
  """How often the most probable retrieved block (highest p(z|x)) is one that states the
  masked fact: the sentence's own block(s), in a world where only they state it.

  Args:
    results: fill_in's rows (blocks most probable first).
    own_block_ids: per row, the ids of the blocks that state its fact.

  Returns:
    {count, right, rate, stderr (binomial)}.

  Raises:
    ValueError: no rows, or not one list of own blocks per row.
  """
  if not results or len(results) != len(own_block_ids):
    raise ValueError(f"{len(results)} filled-in rows and {len(own_block_ids)} lists of own "
                     f"blocks: one list per row is needed")
  right = sum(bool(r["blocks"]) and r["blocks"][0]["block_id"] in set(ids)
              for r, ids in zip(results, own_block_ids))
  n = len(results)
  p = right / n
  return dict(count=n, right=right, rate=p, stderr=math.sqrt(p * (1 - p) / n))


def format_score(summary: dict) -> str:
  """score()'s figures as the lines the demo prints."""
  lines = [f"Fill-in accuracy over {summary['count']} held-out masked sentences "
           f"(answer stated in some retrieved block for "
           f"{100 * summary['answer_in_retrieved_block']:.0f}%):"]
  for reading, label in (("with_retrieval", "with retrieval   "),
                         ("without_retrieval", "without retrieval")):
    r = summary[reading]
    lines.append(f"  {label} {100 * r['accuracy']:5.1f}% ± {100 * r['stderr']:.1f} "
                 f"({r['right']} right); commonest fill {r['commonest_fill']['fill']!r} "
                 f"{100 * r['commonest_fill']['share']:.0f}% of blanks, commonest wordpiece "
                 f"{r['commonest_wordpiece']['fill']!r} "
                 f"{100 * r['commonest_wordpiece']['share']:.0f}% of masked wordpieces")
  return "\n".join(lines)


def format_results(results: Sequence[dict], top_blocks: int = 1) -> str:
  lines = []
  for r in results:
    lines.append(f"x: {r['masked']}")
    lines.append(f"   answer {r['answer']!r} ({r['label']})")
    lines.append(f"   without retrieval (null document only): {r['without_retrieval']!r}"
                 f"  p(answer|x) = {r['p_answer_without_retrieval']:.2g}")
    lines.append(f"   with retrieval:                         {r['with_retrieval']!r}"
                 f"  p(answer|x) = {r['p_answer_with_retrieval']:.2g}"
                 f"  (null document p(z|x) = {r['p_null_document']:.2f})")
    for block in r["blocks"][:top_blocks]:
      text = block["text"] if len(block["text"]) <= 110 else block["text"][:107] + "..."
      lines.append(f"   retrieved z: p(z|x) = {block['p']:.2f}  [{block['title']}] {text}")
  return "\n".join(lines)
