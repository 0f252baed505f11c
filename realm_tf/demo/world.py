"""The demo's second act: REALM's knowledge lives in its corpus, shown on invented facts.

  (act 1's world, pretrain) ─ world_openqa ─ world_export ─ world_edit ─ world_serve

  world_openqa  python -m realm_tf.train --experiment realm/openqa from act 1's REALM
                pre-training checkpoint (retriever and reader), on the world's questions
                about facts its pre-training sentences state, over its blocks: the paper's
                order, pre-training then fine-tuning
  world_export  python -m realm_tf.export: the realm_qa SavedModel over the world's blocks
  world_edit    python -m beam.embed_corpus: the edited blocks (act 1's world stage rewrote
                every held-out fact) embedded by the run's own document tower (no parameter
                changes)
  world_serve   python -m serving.server on the export; held-out questions asked over gRPC;
                then python -m realm_tf.export --blocks <edited blocks> --index_dir <its
                index> publishes the edited corpus as the next version while the server
                runs, the server loads it, and every held-out question is asked again

Why: an invented person's held-out fact is written nowhere but in their blocks, so a right
answer to a held-out question was retrieved and read, and an answer that follows the edit
was read from the new block, not remembered.
"""
import json
import os
import shutil
import time
from typing import Callable

from realm_tf.configs import experiments
from realm_tf.demo import records
from realm_tf.demo.serve import Server
from realm_tf.demo.stages import Stages, clock, python_module, run_command
from realm_tf.io import layout
from realm_tf.text.answers import exact_match



class WorldAct:
  """Runs the stages of the module docstring through `stages`; `train(stage_dir, label,
  experiment, values)` runs python -m realm_tf.train with the demo's config."""

  def __init__(self, stages: Stages, train: Callable[[str, str, str, dict], None],
               config_identity: dict, log: Callable[[str], None] = print):
    self.stages = stages
    self.train = train
    self.config_identity = config_identity
    self.log = log

  def openqa(self, world: dict, pretrain_dir: str, steps: int, batch: int,
             learning_rate: float) -> dict:
    def body(directory):
      self.train(directory, "world_openqa", experiments.OPENQA, {
          "index.blocks": world["corpus_dir"],
          "task.openqa.train_data.input_path": world["train_questions"],
          "task.openqa.validation_data.input_path": world["heldout_questions"],
          "task.openqa.train_data.global_batch_size": batch,
          "task.openqa.init_from": "realm", "task.openqa.init_checkpoint": pretrain_dir,
          # Two blocks read per question, as in pre-training: a person's two blocks, which
          # act 1's retriever ranks first.
          "task.openqa.num_candidates": 2,
          # A question is at most about 20 wordpieces (invented names split into several)
          # and a block's body about 25: everything is read at the reader's 48.
          "task.openqa.query_seq_length": 24,
          "task.openqa.reader_seq_length": 48,
          "trainer.train_steps": steps,
          "trainer.steps_per_loop": min(steps, 10),
          "trainer.summary_interval": min(steps, 10),
          "trainer.checkpoint_interval": steps,
          "trainer.learning_rate": learning_rate,
          "trainer.warmup_steps": max(1, steps // 10),
          "trainer.validation_interval": steps})
      metrics = records.last_evaluation(directory)
      return dict(model_dir=directory, exact_match=metrics.get("exact_match"),
                  recall_at_5=metrics.get("recall@5"),
                  eval_questions=metrics.get("num_questions"))

    return self.stages.run("world_openqa", "reader fine-tuning on the world's questions "
                           "(Open-QA, from the pre-trained REALM checkpoint)",
                           dict(config=self.config_identity, steps=steps, batch=batch,
                                lr=learning_rate),
                           ["world", "pretrain"], body)

  def export(self, openqa_dir: str) -> dict:
    def body(directory):
      models = os.path.join(directory, "models")
      run_command(python_module("realm_tf.export", "--model_dir", openqa_dir, "--output_dir",
                                models, "--kinds", "realm_qa"), directory, "export", self.log)
      base_path = os.path.join(models, "realm_qa")
      return dict(base_path=base_path, version=max(int(v) for v in os.listdir(base_path)
                                                   if v.isdigit()))

    return self.stages.run("world_export", "the realm_qa SavedModel over the world", {},
                           ["world_openqa"], body)

  def edit_index(self, world: dict, openqa_dir: str) -> dict:
    def body(directory):
      output = os.path.join(directory, "index")
      run_command(python_module("beam.embed_corpus", "--blocks", world["edited_dir"],
                                "--encoder", layout.block_encoder_dir(openqa_dir),
                                "--output_dir", output, "--no_scann", "--version", "0"),
                  directory, "embed", self.log)
      return dict(index_dir=output)

    return self.stages.run("world_edit", "the edited world embedded by the run's document "
                           "tower (beam.embed_corpus)", {}, ["world", "world_openqa"], body)

  def serve(self, world: dict, openqa_dir: str, export: dict, edit: dict,
            num_asked: int) -> dict:
    """Asks the first `num_asked` held-out questions, publishes the edited corpus as the next
    version while the server runs, and asks every held-out question (all are counted; how
    many the first version got right is world_openqa's evaluation, on the same model and
    questions). Never reused: the served root is made afresh."""
    directory = self.stages.path("world_serve")
    start = time.time()
    before_rows = records.read_json_lines(world["heldout_questions"])
    after_rows = records.read_json_lines(world["edited_questions"])
    questions = [q["question"] for q in before_rows]
    if questions != [q["question"] for q in after_rows]:
      raise ValueError(f"{world['edited_questions']}: not the held-out questions of "
                       f"{world['heldout_questions']} in the same order")
    # The served root holds the first version only; the edit is published into it later
    # (realm_tf.export --output_dir <models> writes <models>/realm_qa/<version>).
    shutil.rmtree(directory, ignore_errors=True)
    models = os.path.join(directory, "models")
    base_path = os.path.join(models, "realm_qa")
    version = export["version"]
    shutil.copytree(os.path.join(export["base_path"], str(version)),
                    os.path.join(base_path, str(version)))
    self.log(f"[world_serve] serving {base_path} over gRPC on localhost: asking "
             f"{min(num_asked, len(questions))} held-out questions, publishing the edited "
             f"corpus, then asking all {len(questions)} ...")
    with Server(base_path, directory, self.log, poll_seconds=1.0) as server:
      before = server.ask(questions[:num_asked])
      edited_version = version + 1
      publish_dir = os.path.join(directory, "publish")
      os.makedirs(publish_dir)
      run_command(python_module(
          "realm_tf.export", "--model_dir", openqa_dir, "--output_dir",
          models, "--kinds", "realm_qa", "--version", str(edited_version),
          "--blocks", world["edited_dir"], "--index_dir", edit["index_dir"]),
          publish_dir, "publish", self.log)
      server.wait_for_version(edited_version, questions[0])
      after = _ask_in_chunks(server, questions)
    rows = []
    for q_before, q_after, a_after in zip(before_rows, after_rows, after):
      rows.append(dict(
          question=q_before["question"], entity=q_before["title"],
          old_value=q_before["answer"][0], new_value=q_after["answer"][0],
          answer_after=a_after["answer"], version_after=a_after["model"]["version"],
          follows_edit=exact_match(a_after["answer"], q_after["answer"]),
          still_old=exact_match(a_after["answer"], q_before["answer"]),
          block_after=_read_block(a_after),
          retrieved_after=[b["text"] for b in a_after["blocks"]]))
    for row, q_before, a_before in zip(rows, before_rows, before):
      row.update(answer_before=a_before["answer"], version_before=a_before["model"]["version"],
                 right_before=exact_match(a_before["answer"], q_before["answer"]),
                 block_before=_read_block(a_before),
                 retrieved_before=[b["text"] for b in a_before["blocks"]])
    out = os.path.join(directory, "answers.json")
    with open(out, "w", encoding="utf-8") as f:
      json.dump(rows, f, indent=2, ensure_ascii=False)
    seconds = time.time() - start
    shown = rows[:num_asked]
    summary = dict(answers=out, asked=len(rows), shown=len(shown),
                   follows_edit=sum(r["follows_edit"] for r in rows),
                   still_old=sum(r["still_old"] for r in rows),
                   shown_right_before=sum(r["right_before"] for r in shown),
                   shown_follows_edit=sum(r["follows_edit"] for r in shown),
                   version_before=version, version_after=edited_version)
    self.stages.record("world_serve", "ask, publish the edited corpus, ask again (gRPC)",
                       seconds, summary)
    self.log(f"[world_serve] done in {clock(seconds)}; server stopped")
    return dict(summary, rows=shown)

  def run(self, world: dict, pretrain_dir: str, steps: int, batch: int,
          learning_rate: float, num_asked: int) -> dict:
    """`world`: act 1's world stage; `pretrain_dir`: the REALM pre-training run whose
    checkpoint fine-tuning starts from."""
    qa = self.openqa(world, pretrain_dir, steps, batch, learning_rate)
    export = self.export(qa["model_dir"])
    edit = self.edit_index(world, qa["model_dir"])
    served = self.serve(world, qa["model_dir"], export, edit, num_asked)
    return dict(openqa=qa, export=export, served=served)


def _ask_in_chunks(server: Server, questions: list, chunk: int = 100) -> list:
  """One Predict per `chunk` questions (the server caps a request's batch)."""
  return [a for i in range(0, len(questions), chunk)
          for a in server.ask(questions[i:i + chunk])]


def _read_block(answer: dict) -> dict:
  block = answer["blocks"][answer["answer_block"]]
  return dict(title=block["title"], text=block["text"],
              retrieval_prob=block["retrieval_prob"])


def format_world(result: dict) -> str:
  """The act's printout: each question before and after the edit, and the tally."""
  served, lines = result["served"], []
  for r in served["rows"]:
    lines.append(f"Q: {r['question']}")
    lines.append(f"   version {r['version_before']} (the corpus as built): "
                 f"{r['answer_before']!r}  (the block says {r['old_value']!r}: "
                 f"{'right' if r['right_before'] else 'wrong'})")
    lines.append(f"      read from [{r['block_before']['title']}] p(z|x) = "
                 f"{r['block_before']['retrieval_prob']:.2f}: {r['block_before']['text']}")
    lines.append(f"   version {r['version_after']} (the block edited, no parameter changed): "
                 f"{r['answer_after']!r}  (the edited block says {r['new_value']!r}: "
                 f"{'follows the edit' if r['follows_edit'] else 'does not follow it'}"
                 f"{'; the old value' if r['still_old'] else ''})")
    lines.append(f"      read from [{r['block_after']['title']}] p(z|x) = "
                 f"{r['block_after']['retrieval_prob']:.2f}: {r['block_after']['text']}")
  qa = result["openqa"]
  lines.append("What this shows: act 1's pre-trained retriever and reader, fine-tuned to "
               "answer questions, answer ones whose facts are found only in the corpus, and "
               "an edit of the blocks changes the served answers with no parameter changed.")
  lines.append(f"Shown: {served['shown_right_before']} of {served['shown']} right; after the "
               f"edit {served['shown_follows_edit']} of {served['shown']} follow the edited "
               f"blocks.")
  lines.append(f"All {served['asked']} held-out questions over gRPC after the edit (version "
               f"{served['version_after']}): {served['follows_edit']} follow the edited blocks, "
               f"{served['still_old']} still give the old value.")
  if qa.get("exact_match") is not None:
    lines.append(f"Open-QA on all {qa['eval_questions']} held-out world questions: exact "
                 f"match {100 * qa['exact_match']:.1f}%, recall@5 "
                 f"{100 * qa['recall_at_5']:.1f}%.")
  return "\n".join(lines)


__all__ = ["WorldAct", "format_world"]
