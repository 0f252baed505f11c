"""The synthetic knowledge world (realm_tf.corpus.knowledge_world): its properties, and the
learning signal REALM is for, measured on it at tiny scale (benchmarks.knowledge's arms)."""
import json
import os

import numpy as np
import pytest
import tensorflow as tf

from benchmarks import knowledge
from realm_tf.corpus import knowledge_world, schema
from realm_tf.training import train_lib


@pytest.fixture(scope="module")
def world(tmp_path_factory):
  directory = str(tmp_path_factory.mktemp("world"))
  return directory, knowledge_world.write_world(directory, knowledge_world.WorldConfig(
      seed=3, entities=12))


def _records(pattern, record_schema):
  files = tf.io.gfile.glob(pattern)
  out = []
  for serialized in tf.data.TFRecordDataset(files).batch(1000):
    parsed = record_schema.parse(serialized)
    n = int(tf.shape(serialized)[0])
    out += [{k: (v[i].numpy().tolist() if isinstance(v, tf.RaggedTensor) else v[i].numpy())
             for k, v in parsed.items()} for i in range(n)]
  return out


def test_the_same_seed_gives_the_same_world_and_another_seed_another():
  a = knowledge_world.make_world(knowledge_world.WorldConfig(seed=1, entities=8))
  assert a == knowledge_world.make_world(knowledge_world.WorldConfig(seed=1, entities=8))
  b = knowledge_world.make_world(knowledge_world.WorldConfig(seed=2, entities=8))
  assert [e["name"] for e in a["entities"]] != [e["name"] for e in b["entities"]]


def test_names_are_invented_and_every_value_is_one_wordpiece(world, tokenizer):
  """No entity name is a word of the WordPiece vocabulary (so no warm start knows it); every
  attribute value is one wordpiece, so a span's [MASK] count tells nothing of its value."""
  _, w = world
  vocab = set(tokenizer.vocab)
  names = {part.lower() for e in w["entities"] for part in e["name"].split()}
  assert len(names) == 2 * len(w["entities"])  # all distinct
  assert not names & vocab
  values = [v for attribute_values in w["values"].values() for v in attribute_values]
  assert len(set(values)) == len(values) > 0
  pieces = tokenizer.tokenize(tf.constant(values))  # [values, (pieces)]
  assert pieces.row_lengths().numpy().tolist() == [1] * len(values), values
  assert knowledge_world.one_piece_years()[:3] == [1600, 1603, 1604]


def test_held_out_pairs_never_appear_in_x_and_their_facts_are_in_z(world):
  _, w = world
  trained = {(r["entity"], r["attribute"]) for r in w["x"]}
  held = {(r["entity"], r["attribute"]) for r in w["held_out"]}
  assert held and not held & trained
  assert len(held) == len(w["entities"])  # one attribute per entity
  blocks = {b["block_id"]: b for b in w["blocks"]}
  entities = {e["name"]: e for e in w["entities"]}
  x_texts = {r["text"] for r in w["x"]}
  block_texts = {b["text"] for b in w["blocks"]}
  for r in w["held_out"]:
    block = blocks[r["gold_block_id"]]
    assert block["title"] == r["entity"]
    assert r["value"] == entities[r["entity"]]["facts"][r["attribute"]]
    assert r["value"] in block["text"]  # the fact is stated in the entity's own block
    # Other wordings than Z: no held-out or X sentence is a sentence of a block.
    assert not any(r["text"] in t for t in block_texts)
  assert not any(t in b for t in x_texts for b in block_texts)


def test_an_edit_changes_each_held_out_fact_in_its_block_and_nothing_else(world, tmp_path):
  _, w = world
  edited = knowledge_world.edit_world(w, seed=5)
  assert edited == knowledge_world.edit_world(w, seed=5)
  assert edited["x"] == w["x"]
  gold = {e["block_id"]: e for e in w["entities"]}
  assert len(edited["blocks"]) == len(w["blocks"])
  revised = {}
  for before, block in zip(w["blocks"], edited["blocks"]):
    if before["block_id"] not in gold:
      assert block == before  # distractors untouched
      continue
    entity = gold[before["block_id"]]
    attribute = entity["held_out"]
    new_entity = next(e for e in edited["entities"] if e["name"] == entity["name"])
    old, new = entity["facts"][attribute], new_entity["facts"][attribute]
    assert old != new and new in w["values"][attribute]
    assert block["text"] == before["text"].replace(old, new, 1)
    assert block["title"] == before["title"]
    # A new document to the corpus schema: new ids, which the entity now names.
    assert block["block_id"] != before["block_id"] and block["doc_uid"] != before["doc_uid"]
    assert new_entity["block_id"] == block["block_id"]
    revised[block["block_id"]] = block
  after = {b["block_id"]: b for b in edited["blocks"]}
  assert len(after) == len(edited["blocks"])
  assert len(edited["held_out"]) == len(w["held_out"])
  for row, old_row in zip(edited["held_out"], w["held_out"]):
    assert row["old_value"] == old_row["value"] != row["value"]
    assert row["text"] == old_row["text"].replace(old_row["value"], row["value"])
    assert row["gold_block_id"] in revised and row["value"] in after[row["gold_block_id"]]["text"]
    assert row["text"].encode()[row["start"]:row["end"]] == row["value"].encode()
  written = knowledge_world.write_files(str(tmp_path / "edited"), edited)
  blocks = _records(written["files"]["blocks"], schema.BLOCK)
  assert [b["text"].decode() for b in blocks] == [b["text"] for b in edited["blocks"]]


def test_distractors_share_names_and_values(world):
  _, w = world
  names = {e["name"] for e in w["entities"]}
  firsts = {n.split()[0] for n in names}
  namesakes = [b for b in w["blocks"] if b["title"] not in names and
               b["title"].split()[0] in firsts]
  assert namesakes
  assert any(b["title"] in w["towns"] for b in w["blocks"])
  assert len(w["blocks"]) > len(w["entities"])


def test_records_follow_the_corpus_schema_and_spans_mask_the_attribute(world):
  directory, w = world
  blocks = _records(os.path.join(directory, "blocks-*"), schema.BLOCK)
  assert sorted(b["block_id"] for b in blocks) == sorted(b["block_id"] for b in w["blocks"])
  for split, rows in (("pretraining", w["x"]), ("heldout", w["held_out"])):
    records = _records(os.path.join(directory, f"{split}-*"), schema.PRETRAINING)
    assert len(records) == len(rows)
    for record, row in zip(records, rows):
      text = record["text"]
      assert text.decode() == row["text"]
      # The salient span is exactly the attribute value, so salient-span masking masks it.
      (start,), (end,) = record["salient_span_starts"], record["salient_span_ends"]
      assert text[start:end].decode() == row["value"]
      # x is from no block of Z: retrieval may return the entity's own block.
      assert record["block_id"] == -1
  assert _records(os.path.join(directory, "ict-*"), schema.ICT)
  with open(os.path.join(directory, "world.json")) as f:
    assert json.load(f)["held_out"] == w["held_out"]


# configs/knowledge.yaml's mean-pooled, L2-normalised towers (with BERT's [CLS] pooling a
# random-init tiny retriever sends every query to the same few hub blocks: gold top-1 0.0
# before and after ICT) on tiny.yaml's 32-wide encoder, the cheapest that learns here.
_RETRIEVER = ["model.retriever.pooling=mean", "model.retriever.normalize=true",
              "model.retriever.scale=10", "model.retriever.projection=none"]
_TINY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                     "tiny.yaml")


def test_ict_on_the_world_finds_each_entitys_own_block(tmp_path):
  """The retriever half of the learning signal, at tiny scale: an ICT warm start on Z's
  blocks alone (no X, no held-out sentence) makes the entity's own block the top-1 for
  held-out sentences in X's wordings, from chance at random init. REALM's own claim (the
  MLM loss alone raises the own block's top-1) is asserted by
  tests/test_knowledge_reader.py and measured by benchmarks/knowledge.py."""
  args = knowledge.parse_args(
      ["--entities", "24", "--batch_size", "8", "--ict_steps", "300", "--work_dir",
       str(tmp_path), "--no_write",
       "--config", _TINY]
      + [f"--override={o}" for o in _RETRIEVER])
  world = knowledge_world.write_world(str(tmp_path / "world"), knowledge_world.WorldConfig(
      seed=args.seed, entities=args.entities))
  world["dir"] = str(tmp_path / "world")
  random_init = knowledge.arm_config("realm", world["dir"], args)
  retriever = knowledge.retriever_from(random_init)
  at_random = knowledge.gold_top1(random_init, retriever, retriever, world)
  ict_dir = str(tmp_path / "ict")
  train_lib.run_experiment(knowledge.ict_config(world["dir"], args), ict_dir)
  warm = knowledge.arm_config("realm", world["dir"], args, ict_dir)
  retriever = knowledge.retriever_from(warm)
  after_ict = knowledge.gold_top1(warm, retriever, retriever, world)
  assert at_random <= 0.2, at_random  # 42 blocks: chance is 1/42
  assert after_ict >= 0.9, after_ict


def test_questions_split_like_x_and_follow_an_edit(world, tmp_path):
  """Fine-tuning questions ask the pairs stated in X; held-out questions the pairs whose
  answer is only in Z, and after an edit they expect the edited value."""
  directory, w = world
  train = [json.loads(line) for line in open(os.path.join(directory, "questions-train.jsonl"))]
  held = [json.loads(line) for line in open(os.path.join(directory, "questions-heldout.jsonl"))]
  entities = {e["name"]: e for e in w["entities"]}
  assert len(train) == 2 * len(entities) and len(held) == len(entities)
  for q in held:
    e = entities[q["title"]]
    assert q["answer"] == [e["facts"][e["held_out"]]]
    assert q["question"] == knowledge_world.QUESTIONS[e["held_out"]].format(name=e["name"])
  assert not {q["question"] for q in held} & {q["question"] for q in train}
  edited = knowledge_world.write_files(str(tmp_path / "edited"),
                                       knowledge_world.edit_world(w, seed=1))
  after = [json.loads(line) for line in open(edited["files"]["questions_heldout"])]
  assert [q["question"] for q in after] == [q["question"] for q in held]
  assert all(a["answer"] != b["answer"] for a, b in zip(after, held))


def test_top1_kinds_tell_the_own_block_from_namesakes_towns_and_other_entities(world):
  """benchmarks.knowledge.top1_kinds: what a retriever fetches instead of the own block
  (a retriever can raise p(y|x) by fetching a town block: it narrows the answer set)."""
  _, w = world
  firsts = {}
  for b in w["blocks"]:
    firsts.setdefault(b["title"].split(" ")[0], []).append(b)
  # A held-out row whose entity has a namesake block (half of the entities do).
  with_namesake = next(r for r in w["held_out"] if any(
      b["title"] != r["entity"] for b in firsts[r["entity"].split(" ")[0]]))
  rows = [w["held_out"][0], with_namesake, w["held_out"][0], w["held_out"][0]]
  namesake = next(b["block_id"] for b in firsts[with_namesake["entity"].split(" ")[0]]
                  if b["title"] != with_namesake["entity"])
  by_title = {b["title"]: b["block_id"] for b in w["blocks"]}
  other = next(e["block_id"] for e in w["entities"]
               if e["name"].split(" ")[0] != rows[3]["entity"].split(" ")[0])
  top = [rows[0]["gold_block_id"], namesake, by_title[w["towns"][0]], other]
  kinds = knowledge.top1_kinds(top, dict(w, held_out=rows))
  assert kinds == dict(own=0.25, namesake=0.25, town=0.25, other_entity=0.25)


def test_a_two_source_world_states_every_fact_in_two_blocks_naming_the_entity():
  """blocks_per_entity 2: each entity has two blocks, titled and naming it in full, each
  stating every fact in its own wording; every sentence's gold blocks are both; top1_kinds
  counts either as the own block; an edit rewrites both and nothing else."""
  w = knowledge_world.make_world(knowledge_world.WorldConfig(seed=3, entities=12,
                                                             blocks_per_entity=2))
  blocks = {b["block_id"]: b for b in w["blocks"]}
  assert len(blocks) == len(w["blocks"])
  x_texts = {r["text"] for r in w["x"] + w["held_out"]}
  for e in w["entities"]:
    own = [b for b in w["blocks"] if b["title"] == e["name"]]
    assert [b["block_id"] for b in own] == e["block_ids"] and e["block_id"] == own[0]["block_id"]
    assert own[0]["text"] != own[1]["text"]
    for block in own:
      assert all(value in block["text"] for value in e["facts"].values())
      assert not any(t in block["text"] for t in x_texts)
  for r in w["held_out"] + w["x"]:
    entity = next(e for e in w["entities"] if e["name"] == r["entity"])
    assert r["gold_block_ids"] == entity["block_ids"] and r["gold_block_id"] == entity["block_id"]
  row = w["held_out"][0]
  kinds = knowledge.top1_kinds(row["gold_block_ids"], dict(w, held_out=[row, row]))
  assert kinds["own"] == 1.0

  edited = knowledge_world.edit_world(w, seed=5)
  changed = [(a, b) for a, b in zip(w["blocks"], edited["blocks"]) if a != b]
  assert len(changed) == 2 * len(w["entities"])
  after = {b["block_id"]: b for b in edited["blocks"]}
  for row in edited["held_out"]:
    assert len(row["gold_block_ids"]) == 2
    assert all(row["value"] in after[b]["text"] for b in row["gold_block_ids"])
  with pytest.raises(ValueError, match="blocks_per_entity"):
    knowledge_world.WorldConfig(blocks_per_entity=3)


def test_per_attribute_splits_the_held_out_accuracy_the_run_reports(world, tmp_path):
  """benchmarks.knowledge.per_attribute re-reads the held-out sentences with a trained
  checkpoint over the arm's index: its per-attribute accuracies, weighted by their
  sentences, are the span accuracy the run's own evaluation reports, and the own block's
  top-1 / read shares are those of an exact search, by brute force, of the step-0 index
  (what the frozen run searched) with the checkpoint's query tower; p(value | own block)
  is there exactly for the attributes whose own block some sentence read. The checkpoint
  curve's figures are that search's too, and the document tower's cosine to step 0."""
  directory, w = world
  w = dict(w, dir=directory)
  args = knowledge.parse_args(
      ["--steps", "4", "--batch_size", "4", "--refresh_every", "2", "--curve_every", "4",
       "--ict_steps", "0", "--work_dir", str(tmp_path), "--no_write", "--config", _TINY]
      + [f"--override={o}" for o in _RETRIEVER])
  config = knowledge.arm_config("frozen", directory, args)
  model_dir = str(tmp_path / "frozen")
  start = knowledge.retriever_from(config)
  knowledge.publish_index(config, start, model_dir)
  train_lib.run_experiment(config, model_dir)
  reported, _ = train_lib.evaluate_checkpoint(config, model_dir)
  split = knowledge.per_attribute(config, model_dir, w, start)
  assert set(split) == {r["attribute"] for r in w["held_out"]}
  n = sum(a["sentences"] for a in split.values())
  assert n == len(w["held_out"])
  weighted = sum(a["span_accuracy"] * a["sentences"] for a in split.values()) / n
  assert weighted == pytest.approx(reported["span_accuracy"], abs=1e-4)
  # The step-0 index (version 0) and the newest checkpoint's towers, searched by brute
  # force: each held-out sentence's best num_retrieved blocks (the null document aside).
  task, index = knowledge.world_index(config)
  block_ids = np.asarray(index.store.block_ids, np.int64)
  searched = knowledge.index_embeddings(model_dir, 0, block_ids)
  _, step0 = knowledge.tower_embeddings(config, w, start, task, index)
  checkpoints = knowledge.checkpoints(model_dir)
  towers = [knowledge.tower_embeddings(config, w, knowledge.retriever_from(config, path), task,
                                       index) for _, path in checkpoints]
  queries = towers[-1][0]  # [H, P]: what per_attribute's newest checkpoint asks

  def best(queries, documents, k):  # [H, k] block ids, best first (a full sort)
    return block_ids[np.argsort(-(queries @ documents.T), axis=1)[:, :k]]

  def own(found):  # [H] whether any of each sentence's found blocks is its entity's own
    return np.array([np.isin(r["gold_block_ids"], f).any() for f, r in zip(found, w["held_out"])])

  retrieved = best(queries, searched, task.num_retrieved)
  top1, read = own(retrieved[:, :1]), own(retrieved)
  attributes = np.array([r["attribute"] for r in w["held_out"]])
  for attribute, a in split.items():
    mine = attributes == attribute
    assert a["own_block_top1"] == pytest.approx(top1[mine].mean(), abs=6e-5), attribute
    assert a["own_block_read"] == pytest.approx(read[mine].mean(), abs=6e-5), attribute
    assert (a["p_value_given_own_block"] is None) == (not read[mine].any()), attribute
    # The confusion matrix counts every sentence once, its diagonal the right ones.
    m = np.array(a["confusion"]["matrix"])
    assert m.sum() == a["sentences"] and m.shape[1] == len(a["confusion"]["values"]) + 1
    assert np.trace(m[:, :-1]) == pytest.approx(a["span_accuracy"] * a["sentences"], abs=0.5)
  # The frozen run searched its step-0 index throughout: at every checkpoint the index in
  # use is version 0, and the top-1 against it is the step-0 top-1 of the current queries.
  curve = knowledge.checkpoint_curve(config, model_dir, w, start)
  assert curve[0]["step"] == 0 and curve[0]["top1_searched"] == curve[0]["top1_exact"]
  assert [p["step"] for p in curve[1:]] == [c for c, _ in checkpoints]
  k = config.task.pretrain.num_candidates
  for p, (queries, fresh) in zip(curve[1:], towers):
    assert p["index_version"] == 0 and p["k"] == k
    stale, exact = best(queries, searched, k), best(queries, fresh, k)
    assert p["overlap_at_k"] == pytest.approx(
        np.mean([len(set(a) & set(b)) / k for a, b in zip(stale, exact)]), abs=6e-5)
    assert p["overlap_at_1"] == pytest.approx(np.mean(stale[:, 0] == exact[:, 0]), abs=6e-5)
    assert p["top1_searched"] == pytest.approx(own(stale[:, :1]).mean(), abs=6e-5)
    assert p["top1_exact"] == pytest.approx(own(exact[:, :1]).mean(), abs=6e-5)
    cosines = np.sum(fresh * step0, 1) / (np.linalg.norm(fresh, axis=1) *
                                          np.linalg.norm(step0, axis=1))
    assert p["document_cosine_to_step0"] == pytest.approx(cosines.mean(), abs=6e-5)


def test_the_confusion_matrix_names_values_and_sets_aside_other_predictions(tokenizer):
  """benchmarks.knowledge.confusion: rows are the true values in id order, by their words;
  a prediction outside them goes to the last column; top_confusions lists the off-diagonal
  cells, commonest first."""
  ids = tokenizer.tokenize(tf.constant(["york", "dover", "the"])).flat_values.numpy().tolist()
  york, dover, the = ids
  pairs = [(york, york), (york, dover), (york, dover), (dover, the), (dover, dover)]
  c = knowledge.confusion(pairs, tokenizer)
  order = sorted([york, dover])
  assert c["values"] == [{york: "york", dover: "dover"}[i] for i in order]
  row = {v: r for v, r in zip(c["values"], c["matrix"])}
  assert row["york"] == ([1, 2, 0] if order[0] == york else [2, 1, 0])
  assert row["dover"] == ([0, 1, 1] if order[0] == york else [1, 0, 1])
  assert knowledge.top_confusions(c) == [("york", "dover", 2), ("dover", "(other)", 1)]
