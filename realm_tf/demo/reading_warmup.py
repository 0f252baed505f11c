"""The demo's MLM-head warm-up: a fresh head on MiniLM's frozen encoder learns to read.

MiniLM ships no MLM head, so REALM would start at chance. The registered realm/mlm_warmup
trains a fresh head with the null document alone: it can learn only which wordpieces are
masked most often, and in act 1 it filled about a quarter of the held-out blanks with
"century" (the commonest masked word of the demo's leads), with retrieval or without.
Here the head also sees a block that states the masked span, so that what it learns is to
read the answer off a document when one gives it:

  pre-training sentences ─ one example per salient span (maskable, as pre-training masks;
      a seeded sample of at most max_spans)
      ─ read twice: with another block that states the span ('reading'), and with the null
        document ('alone')
      ─ frozen encoder over [CLS] x [SEP] body [SEP], once ─ outputs at the masks, cached
      ─ the MLM head trained on the cache ─ a checkpoint task.pretrain.mlm_init_checkpoint
        reads (the pre-training run's object layout)

The sentence's own block is never its reading document: it contains x itself, and
pre-training never retrieves it (REALM's "no trivial retrievals"). Spans no other block
states are read alone only. A third reading beside a block that does not state the span
was tried in act 1 and changed nothing measurable there, at a third more encoding time.

Why by hand rather than `realm_tf.train --experiment realm/mlm_warmup`: while it warms up
the encoder is frozen and the head reads only the encoder's outputs at the masked
positions, so those outputs can be computed once per (sentence, document) and the head
trained for hundreds of steps on them, which gives the same updates as the trainer. The
trainer would run the frozen 6-layer encoder again on every step: at about 30 sequences
of 192 wordpieces a second on a 2-core CPU, 500 steps of batch 64 would take 18 minutes,
where encoding each pair once takes about one.
"""
import dataclasses
import os
import random
import time
import zlib
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import tensorflow as tf
import tf_keras

from realm_tf.data import pretraining_inputs
from realm_tf.demo import records
from realm_tf.demo.fill_in import fits_query
from realm_tf.demo.questions import AnswerLocator, Block, Sentence, answer_key
from realm_tf.io import layout
from realm_tf.modeling import factory
from realm_tf.modeling.spans import pack_reader_inputs
from realm_tf.text import Tokenizer

# What each example is read with; an example without a reading document has no 'reading'
# row.
DOCUMENTS = ("reading", "alone")


@dataclasses.dataclass(frozen=True)
class Example:
  """One masked span of a pre-training sentence and the documents it is read with."""
  sentence: Sentence  # the sentence with this one span
  reading_block_id: Optional[int]  # another block stating the span; None: none does


def examples(sentences: Sequence[Sentence], blocks: Sequence[Block],
             can_mask: Callable[[Sequence[Sentence]], List[bool]], seed: int,
             max_spans: int = 0) -> List[Example]:
  """One Example per salient span that pre-training's masking can mask whole.

  Args:
    sentences: the pre-training sentences (never the held-out ones).
    blocks: the corpus.
    can_mask: which of a list of one-span sentences salient-span masking masks whole
      (fill_in.fits_query with the run's sizes).
    seed: picks the spans kept and among the blocks that state a span.
    max_spans: at most this many spans, a seeded sample (0: all). Encoding costs about
      70 ms a span on a 2-core CPU, and a corpus of articles that mention each other has
      several salient spans in most sentences.

  Returns:
    The examples, in sentence and span order.
  """
  single = [Sentence(s.text, s.block_id, s.doc_uid, (span,)) for s in sentences
            for span in s.spans if answer_key(s.text[span[0]:span[1]])]
  single = [s for s, ok in zip(single, can_mask(single)) if ok]
  rng = random.Random(seed)
  if 0 < max_spans < len(single):
    keep = set(rng.sample(range(len(single)), max_spans))
    single = [s for i, s in enumerate(single) if i in keep]
  answers = [s.text[s.spans[0][0]:s.spans[0][1]] for s in single]
  locator = AnswerLocator(blocks, answers)
  out = []
  for sentence, answer in zip(single, answers):
    reading = sorted(locator.blocks_with(answer) - {sentence.block_id})
    out.append(Example(sentence, rng.choice(reading) if reading else None))
  return out


def masked_queries(sentences: Sequence[Sentence], directory: str, tokenizer,
                   query_seq_length: int, max_predictions: int) -> dict:
  """The sentences masked at their one span exactly as pre-training masks them.

  Published in `directory` as pre-training records and read back through
  pretraining_inputs.pretraining_dataset (salient-span masking), so the warm-up's masks
  and queries are the pre-training task's own.

  Returns:
    {'query': [N, Lq] encoder inputs, 'masked_lm': {'positions', 'ids', 'weights'}
    [N, M]} numpy arrays, one row per sentence in order.

  Raises:
    ValueError: a sentence could not be masked at its span.
  """
  path = records.write_sentences(directory, sentences)
  dataset = pretraining_inputs.pretraining_dataset(
      path, tokenizer, query_seq_length, "salient_spans", max_predictions,
      batch_size=len(sentences), seed=0, repeat=False, shuffle_buffer=0,
      skip_unsalient=True, drop_remainder=False)
  features = tf.nest.map_structure(lambda t: t.numpy(), next(iter(dataset)))
  if len(features["block_id"]) != len(sentences):
    raise ValueError(f"{path}: {len(features['block_id'])} of {len(sentences)} warm-up "
                     f"sentences could be masked at their span")
  return features


class MaskFeatures:
  """The frozen encoder's outputs at the masked positions of [CLS] x [SEP] body [SEP]."""

  def __init__(self, encoder: tf_keras.layers.Layer, tokenizer, reader_seq_length: int,
               batch_size: int = 32):
    self.encoder = encoder
    self.tokenizer = tokenizer
    self.reader_seq_length = reader_seq_length
    self.batch_size = batch_size

    @tf.function(jit_compile=True)
    def outputs(inputs, positions):
      sequence = self.encoder(inputs, training=False)["sequence_output"]  # [b, L, H]
      return tf.gather(sequence, positions, batch_dims=1)  # [b, M, H]
    self._outputs = outputs

  def __call__(self, queries: dict, bodies: Optional[Sequence[str]]) -> np.ndarray:
    """[N, M, H] float32 outputs at `queries`' masked positions.

    Args:
      queries: masked_queries' result (N rows).
      bodies: N block bodies to read each query with; None: the null document (an empty
        body: [CLS] x [SEP] [SEP], packed at the query's length plus one).
    """
    word_ids = queries["query"]["input_word_ids"]
    mask = queries["query"]["input_mask"]
    positions = queries["masked_lm"]["positions"]
    n, query_length = word_ids.shape
    length = query_length + 1 if bodies is None else self.reader_seq_length
    b = self.batch_size
    out = []
    for i in range(0, n, b):
      rows = slice(i, min(n, i + b))
      count = rows.stop - rows.start
      if bodies is None:
        body_ids = tf.zeros([count, 1, 1], tf.int32)
        body_lengths = tf.zeros([count, 1], tf.int32)
      else:
        ragged = self.tokenizer.tokenize(tf.constant(list(bodies[rows])))
        body_ids = tf.cast(ragged.to_tensor(), tf.int32)[:, None, :]  # [b, 1, Lb]
        body_lengths = tf.cast(ragged.row_lengths(), tf.int32)[:, None]  # [b, 1]
      packed = pack_reader_inputs(tf.constant(word_ids[rows]), tf.constant(mask[rows]),
                                  body_ids, body_lengths, length, self.tokenizer.sep_id)
      # A full batch every call (the last one padded): one compilation per length.
      inputs = {k: tf.pad(packed[k][:, 0], [[0, b - count], [0, 0]])
                for k in ("input_word_ids", "input_mask", "input_type_ids")}
      at = tf.pad(tf.constant(positions[rows]), [[0, b - count], [0, 0]])
      out.append(self._outputs(inputs, at).numpy()[:count])
    return np.concatenate(out)


def head_variables(model) -> list:
  """The MLM head's own weights (task.pretrain.trainable=mlm_head's rule: a head tied to
  the encoder's word embeddings leaves them frozen)."""
  frozen = {v.ref() for v in model.encoder.trainable_variables}
  return [v for v in model.masked_lm.trainable_variables if v.ref() not in frozen]


def _head_log_probs(model, features: tf.Tensor) -> tf.Tensor:
  """[T, V] log-probabilities of the head over [T, H] outputs at masked positions."""
  logits = model.masked_lm(features[:, None, :],
                           masked_positions=tf.zeros([tf.shape(features)[0], 1], tf.int32))
  return tf.nn.log_softmax(tf.cast(logits[:, 0], tf.float32))


def train_head(model, features: np.ndarray, ids: np.ndarray, steps: int, batch_size: int,
               learning_rate: float, seed: int) -> List[float]:
  """Trains `model`'s MLM head on cached encoder outputs, one masked wordpiece per row.

  Args:
    model: the KnowledgeAugmentedEncoder whose head trains.
    features: [T, H] MaskFeatures outputs at real masked wordpieces (no padding: a
      sentence's M slots are mostly padding, and every row costs a [H, V] product);
      ids: [T] their wordpieces.
    steps, batch_size, learning_rate: Adam's (a constant rate: a few hundred steps over a
      few thousand rows need no schedule).
    seed: the batches' order.

  Returns:
    The loss (mean negative log-likelihood per masked wordpiece) of every step.
  """
  variables = head_variables(model)
  optimizer = tf_keras.optimizers.Adam(learning_rate)

  @tf.function(jit_compile=True)
  def step(x, y):
    with tf.GradientTape() as tape:
      loss = -tf.reduce_mean(tf.gather(_head_log_probs(model, x), y, batch_dims=1))
    optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
    return loss

  rng = np.random.default_rng(seed)
  losses = []
  for _ in range(steps):
    rows = rng.choice(len(features), batch_size, replace=len(features) < batch_size)
    losses.append(float(step(features[rows], ids[rows])))
  return losses


def span_accuracy(model, features: np.ndarray, ids: np.ndarray, weights: np.ndarray) -> float:
  """The share of spans ([N, M, H] outputs, [N, M] ids and weights) whose every masked
  wordpiece is the head's argmax."""
  if not len(features):
    return float("nan")
  real = weights > 0
  predicted = np.zeros(ids.shape, ids.dtype)
  predicted[real] = np.argmax(_head_log_probs(model, tf.constant(features[real])).numpy(), -1)
  return float(np.mean(~((predicted != ids) & real).any(axis=1)))


def run(config, sentences: Sequence[Sentence], blocks: Sequence[Block], directory: str,
        steps: int, batch_size: int, learning_rate: float, seed: int, max_spans: int = 0,
        log: Callable[[str], None] = print) -> Dict[str, object]:
  """The warm-up: examples, cached encoder outputs, the head trained, a checkpoint.

  Args:
    config: the demo's ExperimentConfig (model, retriever query length, reader length,
      max predictions).
    sentences: the pre-training sentences; blocks: the corpus.
    directory: the stage directory; the checkpoint goes to its checkpoints/, where
      layout.latest_checkpoint(directory) (task.pretrain.mlm_init_checkpoint) finds it.
    steps, batch_size, learning_rate, seed: train_head's.
    max_spans: examples()'s.
    log: progress lines.

  Returns:
    The checkpoint's path; example counts; the head's first and last loss; and its span
    accuracy on held-back examples (the sentences of a tenth of the documents, never
    trained on), reading a block that states the span and alone.

  Raises:
    ValueError: no salient span can be masked.
  """
  tokenizer = Tokenizer(config.model.tokenizer.vocab_file or None,
                        config.model.tokenizer.lower_case)
  query_length = config.model.retriever.query_seq_length
  max_predictions = config.task.pretrain.max_predictions_per_seq
  chosen = examples(sentences, blocks, lambda s: fits_query(
      tokenizer, s, query_length, max_predictions), seed, max_spans)
  if not chosen:
    raise ValueError("no salient span of the pre-training sentences can be masked: the "
                     "MLM-head warm-up has nothing to learn from")
  start = time.time()
  queries = masked_queries([e.sentence for e in chosen],
                           os.path.join(directory, "warmup_spans"), tokenizer,
                           query_length, max_predictions)
  text = {b.block_id: b.text for b in blocks}
  tf_keras.utils.set_random_seed(seed)
  model = factory.build_knowledge_augmented_encoder(config)
  encode = MaskFeatures(model.encoder, tokenizer, config.model.reader.seq_length)
  reads = np.array([e.reading_block_id is not None for e in chosen])
  outputs = dict(  # [N, M, H] each; 'reading' has only the rows where `reads`
      reading=encode(_rows(queries, reads),
                     [text[e.reading_block_id] for e in chosen if e.reading_block_id is not None]),
      alone=encode(queries, None))
  log(f"  {len(chosen)} masked salient spans of {len(sentences)} pre-training sentences"
      f"{f' (a sample of at most {max_spans})' if max_spans else ''}, "
      f"{int(reads.sum())} of them stated by another block; each encoded with its "
      f"documents in {time.time() - start:.0f} s")
  ids, weights = queries["masked_lm"]["ids"], queries["masked_lm"]["weights"]
  held = np.array([_held_back(e.sentence.doc_uid) for e in chosen])
  rows = dict(reading=reads, alone=np.ones_like(reads))
  train_x, train_y = [], []
  for name in DOCUMENTS:
    train = ~held[rows[name]]  # rows of outputs[name] that are trained on
    real = weights[rows[name]][train] > 0
    train_x.append(outputs[name][train][real])  # [T, H]
    train_y.append(ids[rows[name]][train][real])  # [T]
  start = time.time()
  losses = train_head(model, np.concatenate(train_x), np.concatenate(train_y), steps,
                      batch_size, learning_rate, seed)
  info = dict(
      examples=len(chosen), stated_elsewhere=int(reads.sum()), held_back=int(held.sum()),
      trained_wordpieces=int(sum(len(y) for y in train_y)),
      first_loss=losses[0], last_loss=losses[-1],
      held_back_reading_accuracy=span_accuracy(
          model, outputs["reading"][held[reads]], ids[reads & held], weights[reads & held]),
      held_back_alone_accuracy=span_accuracy(model, outputs["alone"][held], ids[held],
                                             weights[held]))
  log(f"  head trained {steps} steps in {time.time() - start:.0f} s, loss "
      f"{losses[0]:.2f} → {losses[-1]:.2f}; held-back spans ({info['held_back']}) filled "
      f"right: {100 * info['held_back_reading_accuracy']:.0f}% reading a block that states "
      f"them, {100 * info['held_back_alone_accuracy']:.0f}% alone")
  manager = tf.train.CheckpointManager(
      tf.train.Checkpoint(model=tf.train.Checkpoint(knowledge_augmented_encoder=model)),
      layout.checkpoint_dir(directory), max_to_keep=1)
  info["checkpoint"] = manager.save(checkpoint_number=steps)
  return info


def _rows(queries: dict, keep: np.ndarray) -> dict:
  return tf.nest.map_structure(lambda a: a[keep], queries)


def _held_back(doc_uid: str) -> bool:
  """A stable tenth of the documents (crc32 of the uid: Python's hash is salted)."""
  return zlib.crc32(doc_uid.encode("utf-8")) % 10 == 0
