"""Scaled-down files in the exact layout of the REALM authors' release, and an independent
NumPy transcription of the authors' computation over them.

The files (tf.compat.v1.train.Saver checkpoints under the released tensor names, with Adam
slots and global_step where the release has them):
Laid out as docs/released_models.md's download (benchmarks.released_nq reads it so):
  cc_news_pretrained/embedder/variables/variables
                                 the embedder hub module: BERT under module/bert/, `dense`,
                                 then `layer_normalization` (ICT code) or `LayerNorm`
                                 (HuggingFace's map), plus an MLM head the retriever skips
  .../embedder/assets/vocab.txt  the uncased BERT vocabulary
  .../embedder/encoded/encoded.ckpt
                                 block_emb [N, P]: the document tower over
                                 [CLS] title [SEP] block [SEP], computed here in NumPy
  cc_news_pretrained/bert/variables/variables
                                 the knowledge-augmented encoder's module: BERT and its
                                 MLM head (cls/predictions/...)
  orqa_nq_model_from_realm/export/best_default/checkpoint/model.ckpt-300000
                                 the fine-tuned query tower under module/ and the reader
                                 under reader/ (reader/module/bert, reader/dense,
                                 reader/layer_normalization, reader/dense_1)
  enwiki-20181220/blocks.tfr, titles.tfr
                                 one block string / its title per record
  resplit/NaturalQuestions.resplit.test.jsonl
                                 questions {question, answer: [...]}
The reference: BERT (benchmarks/bert_reference.py), pooled [CLS] → dense → LayerNorm for the
towers (the authors' ICT module / HF's RealmEmbedder), and orqa_model.read's span scoring
(dense → split halves → relu(start + end) → LayerNorm → dense_1, plus the retrieval score).
"""
import json
import os
import shutil

import numpy as np
import tensorflow as tf

from realm_tf.pretrained import minilm_vocab_file
from benchmarks.bert_reference import bert_forward

SIZES = dict(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64,
             max_position_embeddings=512, type_vocab_size=2, projection_size=16,
             span_hidden_size=8)
STEP = 300000
MAX_SPAN_WIDTH = 10  # the authors' (realm_tf.import_released.release.MAX_SPAN_WIDTH)
READER_SEQ_LENGTH = 320
EMBEDDER_BERT = "module/"  # BERT of the embedder hub module: module/bert/...
QUERY_BERT = "module/module/"  # the same module nested once more in the Open-QA model
QUERY_HEAD = "module/"  # module/dense, module/layer_normalization
READER_BERT = "reader/module/"
# Where each tower sits in the checkpoints. 'release': the fixture's spelling above.
# 'hugging_face': the nesting HuggingFace's load_tf_weights_in_realm maps (module/module/
# module/bert/ and module/module/{dense,LayerNorm}/ for the embedder; module/module/module/
# module/bert/ and module/module/module/{dense,LayerNorm}/ for the Open-QA query tower).
# The import finds BERT and its head under any prefix, so both must import alike.
NESTINGS = {
    "release": dict(embedder_bert=EMBEDDER_BERT, embedder_head="", query_bert=QUERY_BERT,
                    query_head=QUERY_HEAD),
    "hugging_face": dict(embedder_bert="module/module/module/", embedder_head="module/module/",
                         query_bert="module/module/module/module/",
                         query_head="module/module/module/"),
}
# (title, block): two articles of several blocks, plus one-block articles.
BLOCKS = (
    ("Paris", "Paris is the capital and most populous city of France."),
    ("Paris", "The city is a major railway, highway and air-transport hub."),
    ("Paris", "Paris hosted the Summer Olympic Games in 1900 and 1924."),
    ("Nile", "The Nile is a major north-flowing river in northeastern Africa."),
    ("Nile", "The river flows through Cairo before it reaches the Mediterranean Sea."),
    ("Ada Lovelace", "Ada Lovelace was an English mathematician and writer."),
    ("Alan Turing", "Alan Mathison Turing was an English computer scientist."),
    ("Mount Everest", "Mount Everest is the highest mountain above sea level."),
    ("Oxygen", "Oxygen is the chemical element with the symbol O and atomic number 8."),
    ("Jupiter", "Jupiter is the fifth planet from the Sun and the largest in the system."),
    ("Tokyo", "Tokyo is the capital of Japan and one of its forty-seven prefectures."),
)
QUESTIONS = (
    ("what is the capital of france?", ["Paris"]),
    ("which river flows through cairo?", ["the Nile", "Nile"]),
    ("who was a pioneer of computer science?", ["Alan Turing"]),
)


def layer_norm(x, gamma, beta, eps):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + eps) * gamma + beta


def bert_tensors(rng, prefix: str, vocab_size: int, mlm_head: bool, sizes=None,
                 scale: float = 0.3) -> dict:
  """Random weights of a BERT (default the scaled-down SIZES) under `prefix + bert/`
  (Google's names), normal with standard deviation `scale`."""
  sizes = sizes or SIZES
  h, inter = sizes["hidden_size"], sizes["intermediate_size"]
  shapes = {"bert/embeddings/word_embeddings": (vocab_size, h),
            "bert/embeddings/position_embeddings": (sizes["max_position_embeddings"], h),
            "bert/embeddings/token_type_embeddings": (sizes["type_vocab_size"], h),
            "bert/embeddings/LayerNorm/gamma": (h,), "bert/embeddings/LayerNorm/beta": (h,),
            "bert/pooler/dense/kernel": (h, h), "bert/pooler/dense/bias": (h,)}
  for i in range(sizes["num_layers"]):
    layer = f"bert/encoder/layer_{i}/"
    for name in ("query", "key", "value"):
      shapes[f"{layer}attention/self/{name}/kernel"] = (h, h)
      shapes[f"{layer}attention/self/{name}/bias"] = (h,)
    shapes.update({
        f"{layer}attention/output/dense/kernel": (h, h),
        f"{layer}attention/output/dense/bias": (h,),
        f"{layer}attention/output/LayerNorm/gamma": (h,),
        f"{layer}attention/output/LayerNorm/beta": (h,),
        f"{layer}intermediate/dense/kernel": (h, inter),
        f"{layer}intermediate/dense/bias": (inter,),
        f"{layer}output/dense/kernel": (inter, h), f"{layer}output/dense/bias": (h,),
        f"{layer}output/LayerNorm/gamma": (h,), f"{layer}output/LayerNorm/beta": (h,)})
  if mlm_head:
    shapes.update({"cls/predictions/transform/dense/kernel": (h, h),
                   "cls/predictions/transform/dense/bias": (h,),
                   "cls/predictions/transform/LayerNorm/gamma": (h,),
                   "cls/predictions/transform/LayerNorm/beta": (h,),
                   "cls/predictions/output_bias": (vocab_size,)})
  out = {}
  for name, shape in shapes.items():
    value = rng.normal(size=shape).astype(np.float32) * scale
    if name.endswith("gamma"):
      value = 1.0 + value * 0.3
    out[prefix + name] = value.astype(np.float32)
  return out


def head_tensors(rng, scope: str, norm: str, sizes=None) -> dict:
  """The embedder's projection and its LayerNorm under `scope` (`norm`: 'LayerNorm' or
  'layer_normalization')."""
  sizes = sizes or SIZES
  h, p = sizes["hidden_size"], sizes["projection_size"]
  return {scope + "dense/kernel": (rng.normal(size=(h, p)) * 0.3).astype(np.float32),
          scope + "dense/bias": (rng.normal(size=(p,)) * 0.1).astype(np.float32),
          scope + f"{norm}/gamma": (1.0 + rng.normal(size=(p,)) * 0.1).astype(np.float32),
          scope + f"{norm}/beta": (rng.normal(size=(p,)) * 0.1).astype(np.float32)}


def reader_head_tensors(rng, sizes=None) -> dict:
  """The reader's span head (orqa_model.read's dense, layer_normalization, dense_1)."""
  sizes = sizes or SIZES
  h, s = sizes["hidden_size"], sizes["span_hidden_size"]
  return {"reader/dense/kernel": (rng.normal(size=(h, 2 * s)) * 0.3).astype(np.float32),
          "reader/dense/bias": (rng.normal(size=(2 * s,)) * 0.3).astype(np.float32),
          "reader/layer_normalization/gamma": (1.0 + rng.normal(size=(s,)) * 0.2
                                               ).astype(np.float32),
          "reader/layer_normalization/beta": (rng.normal(size=(s,)) * 0.2).astype(np.float32),
          "reader/dense_1/kernel": (rng.normal(size=(s, 1))).astype(np.float32),
          "reader/dense_1/bias": (rng.normal(size=(1,))).astype(np.float32)}


def save_checkpoint(prefix: str, tensors: dict, step=None, adam_slots: bool = False):
  """A TF1 checkpoint (tf.compat.v1.train.Saver) of `tensors` by name."""
  os.makedirs(os.path.dirname(prefix), exist_ok=True)
  variables = {name: tf.Variable(value) for name, value in tensors.items()}
  if adam_slots:  # BERT's AdamWeightDecayOptimizer slots, as a training checkpoint has
    for name, value in tensors.items():
      variables[name + "/adam_m"] = tf.Variable(np.zeros_like(value))
      variables[name + "/adam_v"] = tf.Variable(np.zeros_like(value))
  if step is not None:
    variables["global_step"] = tf.Variable(np.int64(step))
  # As the authors' exporter leaves it: checkpoint files only, no `checkpoint` state file
  # (BestSavedModelAndCheckpointExporter copies model.ckpt-N.* alone).
  tf.compat.v1.train.Saver(var_list=variables).save(None, prefix, write_meta_graph=False,
                                                    write_state=False)


def write_params_json(model_dir: str, num_block_records: int, **overrides) -> str:
  """<model_dir>/params.json as ORQA's experiment writes it (experiment_utils: every flag
  of orqa_experiment, indented, keys sorted), with the authors' defaults."""
  params = dict(batch_size=16, block_records_path="gs://orqa-data/enwiki-20181220/blocks.tfr",
                block_seq_len=288, data_root="gs://orqa-data/resplit", eval_batch_size=1,
                learning_rate=1e-5, max_span_width=MAX_SPAN_WIDTH,
                num_block_records=num_block_records, num_train_steps=STEP,
                query_seq_len=64, reader_beam_size=5,
                reader_module_path="gs://realm-data/cc_news_pretrained/bert",
                reader_seq_len=READER_SEQ_LENGTH,
                retriever_beam_size=5000,
                retriever_module_path="gs://realm-data/cc_news_pretrained/embedder",
                span_hidden_size=SIZES["span_hidden_size"], use_tpu=False)
  params.update(overrides)
  path = os.path.join(model_dir, "params.json")
  with open(path, "w") as f:
    json.dump(params, f, indent=2, sort_keys=True)
  return path


class Reference:
  """The authors' computation over the released tensors, in float64 NumPy."""

  def __init__(self, embedder: dict, orqa: dict, vocab: list[str], norm_eps: float,
               norm: str, nesting: str = "release", sizes=None):
    self.embedder, self.orqa, self.norm_eps, self.norm = embedder, orqa, norm_eps, norm
    self.scopes = NESTINGS[nesting]
    self.sizes = sizes or SIZES
    self.index = {token: i for i, token in enumerate(vocab)}
    self.cls, self.sep = self.index["[CLS]"], self.index["[SEP]"]

  def _bert(self, values, prefix, ids, types):
    return bert_forward(lambda n: values[prefix + n].astype(np.float64),
                        np.asarray([ids]), np.asarray([types]),
                        num_layers=self.sizes["num_layers"],
                        num_heads=self.sizes["num_heads"],
                        convention="google", approximate_gelu=True)[0]  # [L, H]

  def tower(self, values, bert_prefix, head_scope, ids, types):
    """BERT pooled [CLS] → dense → LayerNorm (the 'projected' signature)."""
    seq = self._bert(values, bert_prefix, ids, types)
    g = lambda n: values[bert_prefix + n].astype(np.float64)  # noqa: E731
    pooled = np.tanh(seq[0] @ g("bert/pooler/dense/kernel") + g("bert/pooler/dense/bias"))
    h = lambda n: values[head_scope + n].astype(np.float64)  # noqa: E731
    projected = pooled @ h("dense/kernel") + h("dense/bias")
    return layer_norm(projected, h(f"{self.norm}/gamma"), h(f"{self.norm}/beta"),
                      self.norm_eps)

  def block_inputs(self, title_ids, body_ids):
    ids = [self.cls] + title_ids + [self.sep] + body_ids + [self.sep]
    return ids, [0] * (len(title_ids) + 2) + [1] * (len(body_ids) + 1)

  def document_embedding(self, title_ids, body_ids):
    ids, types = self.block_inputs(title_ids, body_ids)
    return self.tower(self.embedder, self.scopes["embedder_bert"],
                      self.scopes["embedder_head"], ids, types)

  def query_embedding(self, question_ids):
    ids = [self.cls] + question_ids + [self.sep]
    return self.tower(self.orqa, self.scopes["query_bert"], self.scopes["query_head"], ids,
                      [0] * len(ids))

  def reader_logits(self, ids, types, first: int, length: int) -> dict:
    """orqa_model.read's span scores over reader inputs `ids`/`types` (all real tokens)
    whose block occupies positions [first, first + length): {(start, end): logit}."""
    seq = self._bert(self.orqa, READER_BERT, ids, types)
    r = lambda n: self.orqa["reader/" + n].astype(np.float64)  # noqa: E731
    projection = seq @ r("dense/kernel") + r("dense/bias")  # [L, 2S]
    start, end = np.split(projection, 2, axis=-1)
    logits = {}
    for s in range(first, first + length):
      for e in range(s, min(s + MAX_SPAN_WIDTH, first + length)):
        hidden = layer_norm(np.maximum(start[s] + end[e], 0.0), r("layer_normalization/gamma"),
                            r("layer_normalization/beta"), 1e-3)
        logits[(s, e)] = float(hidden @ r("dense_1/kernel")[:, 0] + r("dense_1/bias")[0])
    return logits

  def span_logits(self, question_ids, body_ids) -> dict:
    """orqa_model.read's span scores (before the retrieval score) of one block:
    {(start, end) in reader-input positions: logit} over the spans inside the block."""
    body = body_ids[:READER_SEQ_LENGTH - len(question_ids) - 3]
    ids = [self.cls] + question_ids + [self.sep] + body + [self.sep]
    types = [0] * (len(question_ids) + 2) + [1] * (len(body) + 1)
    return self.reader_logits(ids, types, first=len(question_ids) + 2, length=len(body))


def write_released(root: str, seed: int = 0, norm: str = "layer_normalization",
                   tokenize=None, nesting: str = "release") -> dict:
  """Writes the scaled-down release under `root`; returns paths, tensors and a Reference.

  tokenize: str → list of wordpiece ids (the uncased BERT tokenizer).
  nesting: where the towers sit in the checkpoints (NESTINGS).
  """
  scopes = NESTINGS[nesting]
  rng = np.random.default_rng(seed)
  vocab_path = minilm_vocab_file()
  with open(vocab_path, encoding="utf-8") as f:
    vocab = f.read().split("\n")
  if vocab[-1] == "":
    vocab.pop()
  embedder_dir = os.path.join(root, "cc_news_pretrained", "embedder")
  os.makedirs(os.path.join(embedder_dir, "assets"), exist_ok=True)
  shutil.copy(vocab_path, os.path.join(embedder_dir, "assets", "vocab.txt"))
  embedder = bert_tensors(rng, scopes["embedder_bert"], len(vocab), mlm_head=True)
  embedder.update(head_tensors(rng, scopes["embedder_head"], norm))
  save_checkpoint(os.path.join(embedder_dir, "variables", "variables"), embedder)

  orqa = bert_tensors(rng, scopes["query_bert"], len(vocab), mlm_head=False)
  orqa.update(head_tensors(rng, scopes["query_head"], norm))
  orqa.update(bert_tensors(rng, READER_BERT, len(vocab), mlm_head=True))
  orqa.update(reader_head_tensors(rng))
  orqa_dir = os.path.join(root, "orqa_nq_model_from_realm")
  orqa_prefix = os.path.join(orqa_dir, "export", "best_default", "checkpoint",
                             f"model.ckpt-{STEP}")
  save_checkpoint(orqa_prefix, orqa, step=STEP, adam_slots=True)
  write_params_json(orqa_dir, num_block_records=len(BLOCKS))

  eps = {"layer_normalization": 1e-3, "LayerNorm": 1e-12}[norm]
  reference = Reference(embedder, orqa, vocab, eps, norm, nesting)
  block_emb = np.stack([reference.document_embedding(tokenize(title), tokenize(text))
                        for title, text in BLOCKS]).astype(np.float32)
  save_checkpoint(os.path.join(embedder_dir, "encoded", "encoded.ckpt"),
                  {"block_emb": block_emb})

  corpus = os.path.join(root, "enwiki-20181220")
  os.makedirs(corpus, exist_ok=True)
  for name, column in (("blocks.tfr", 1), ("titles.tfr", 0)):
    with tf.io.TFRecordWriter(os.path.join(corpus, name)) as writer:
      for block in BLOCKS:
        writer.write(block[column].encode("utf-8"))
  # The knowledge-augmented encoder's module: BERT and its MLM head under plain names
  # (drawn last, so the other tensors do not depend on it).
  bert = bert_tensors(rng, "", len(vocab), mlm_head=True)
  save_checkpoint(os.path.join(root, "cc_news_pretrained", "bert", "variables", "variables"),
                  bert)
  questions = os.path.join(root, "resplit", "NaturalQuestions.resplit.test.jsonl")
  os.makedirs(os.path.dirname(questions), exist_ok=True)
  with open(questions, "w") as f:
    for question, answers in QUESTIONS:
      f.write(json.dumps(dict(question=question, answer=answers)) + "\n")
  return dict(root=root, embedder=embedder_dir, orqa=orqa_dir, orqa_prefix=orqa_prefix,
              blocks=os.path.join(corpus, "blocks.tfr"),
              titles=os.path.join(corpus, "titles.tfr"), questions=questions,
              bert=os.path.join(root, "cc_news_pretrained", "bert"),
              embedder_tensors=embedder, orqa_tensors=orqa, bert_tensors=bert,
              block_emb=block_emb,
              reference=reference)
