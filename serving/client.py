"""`python -m serving.client`: ask the served REALM QA model, see where the answer came from.

    python -m serving.client --server localhost:8500 "who wrote the iliad?" ["..." ...]
        [--model realm_qa] [--signature serving_default] [--timeout 10] [--top_blocks 5]
        [--json]

Uses only the official tensorflow-serving-api stubs, so it works the same against
`python -m serving.server` and a real tensorflow_model_server. The contract of the QA
signature (inputs and outputs, B questions, K retrieved blocks):

  question         string  [B]
  answer           string  [B]      the best span
  score            float32 [B]      its score
  answer_block     int32   [B]      which of the K blocks it was read from
  block_ids        int64   [B, K]   retrieved blocks, best first
  block_titles     string  [B, K]
  block_texts      string  [B, K]
  retrieval_probs  float32 [B, K]   p(z|x)
"""
import argparse
import json
import sys
from typing import Sequence

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

QUESTION = "question"
PER_QUESTION = ("answer", "score", "answer_block")
PER_BLOCK = ("block_ids", "block_titles", "block_texts", "retrieval_probs")
MAX_MESSAGE_BYTES = 64 << 20


def _text(value) -> str:
  return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def ask(stub: prediction_service_pb2_grpc.PredictionServiceStub, questions: Sequence[str],
        model: str = "realm_qa", signature: str = "serving_default",
        timeout: float = 10.0) -> list:
  """One Predict for all `questions`; a dict per question with its answer and provenance.

  Args:
    stub: a PredictionService stub on a gRPC channel (serving.server or
      tensorflow_model_server).
    questions: the questions, one request for all of them.
    model: the served model's name.
    signature: the signature to call (QA contract above).
    timeout: the request's deadline in seconds.

  Returns:
    One dict per question, in order: {"question", "answer", "score", "answer_block",
    "model": {"name", "version", "signature"}, "blocks": [{"rank", "block_id", "title",
    "text", "retrieval_prob", "is_answer_block"}, ...] (K blocks, best first)}.

  Raises:
    ValueError: no questions, or a response that does not follow the QA contract
      (missing outputs, wrong ranks or row counts).
    grpc.RpcError: the server's error (unknown model, deadline, overload, ...).
  """
  if not questions:
    raise ValueError("ask: no questions")
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model
  request.model_spec.signature_name = signature
  encoded = np.array([q.encode("utf-8") for q in questions], dtype=object)  # [B]
  request.inputs[QUESTION].CopyFrom(tf.make_tensor_proto(encoded))
  response = stub.Predict(request, timeout=timeout)
  outputs = {}
  batch = len(questions)
  for name in PER_QUESTION + PER_BLOCK:
    if name not in response.outputs:
      raise ValueError(f"the response of model {model!r} has no output {name!r} "
                       f"(it has {sorted(response.outputs)})")
    outputs[name] = tf.make_ndarray(response.outputs[name])
    rank = 1 if name in PER_QUESTION else 2
    if outputs[name].ndim != rank or outputs[name].shape[0] != batch:
      raise ValueError(f"output {name!r} has shape {list(outputs[name].shape)}; expected "
                       f"rank {rank} with {batch} rows")
  num_blocks = outputs["block_ids"].shape[1]
  for name in PER_BLOCK:
    if outputs[name].shape[1] != num_blocks:
      raise ValueError(f"output {name!r} has {outputs[name].shape[1]} blocks per question, "
                       f"block_ids has {num_blocks}")
  served = {"name": response.model_spec.name, "version": response.model_spec.version.value,
            "signature": response.model_spec.signature_name}
  answers = []
  for row, question in enumerate(questions):
    answer_block = int(outputs["answer_block"][row])
    blocks = [{
        "rank": k + 1,
        "block_id": int(outputs["block_ids"][row, k]),
        "title": _text(outputs["block_titles"][row, k]),
        "text": _text(outputs["block_texts"][row, k]),
        "retrieval_prob": float(outputs["retrieval_probs"][row, k]),
        "is_answer_block": k == answer_block,
    } for k in range(num_blocks)]
    answers.append({
        "question": question,
        "answer": _text(outputs["answer"][row]),
        "score": float(outputs["score"][row]),
        "answer_block": answer_block,
        "model": served,
        "blocks": blocks,
    })
  return answers


def format_answer(answer: dict, top_blocks: int) -> str:
  """Q/A lines, then the top retrieved blocks with p(z|x), the answer's block marked.

  Args:
    answer: one of ask's dicts.
    top_blocks: blocks to list; the answer's own block is listed too if it is not among
      them.

  Returns:
    The text to print (lines joined by newlines).
  """
  lines = [f"Q: {answer['question']}",
           f"A: {answer['answer']} (score {answer['score']:.2f})"]
  shown = answer["blocks"][:top_blocks]
  if not any(block["is_answer_block"] for block in shown) and answer["blocks"]:
    shown.append(answer["blocks"][answer["answer_block"]])  # always show the answer's source
  for block in shown:
    marker = "  ← answer" if block["is_answer_block"] else ""
    lines.append(f"  [{block['rank']}] p(z|x)={block['retrieval_prob']:.2f}  "
                 f"{block['title']}{marker}")
  return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
  """The command line of `python -m serving.client` (see the module docstring)."""
  parser = argparse.ArgumentParser(prog="python -m serving.client", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("questions", nargs="+", help="one or more questions")
  parser.add_argument("--server", default="localhost:8500", help="host:port of the gRPC API")
  parser.add_argument("--model", default="realm_qa")
  parser.add_argument("--signature", default="serving_default")
  parser.add_argument("--timeout", type=float, default=10.0, help="deadline in seconds")
  parser.add_argument("--top_blocks", type=int, default=5, help="retrieved blocks to print")
  parser.add_argument("--json", action="store_true", help="print the answers as JSON")
  return parser


def main(argv=None) -> int:
  """Asks the questions on the command line and prints the answers.

  Args:
    argv: the arguments (default: sys.argv[1:]).

  Returns:
    The exit status: 0, or 1 when the server refused or answered outside the contract
    (the reason on stderr).
  """
  args = build_parser().parse_args(argv)
  options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
  with grpc.insecure_channel(args.server, options=options) as channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
      answers = ask(stub, args.questions, args.model, args.signature, args.timeout)
    except grpc.RpcError as e:
      print(f"serving.client: {args.server}: {e.code().name}: {e.details()}", file=sys.stderr)
      return 1
    except ValueError as e:
      print(f"serving.client: {e}", file=sys.stderr)
      return 1
  if args.json:
    print(json.dumps(answers, indent=2, ensure_ascii=False))
  else:
    print("\n\n".join(format_answer(answer, args.top_blocks) for answer in answers))
  return 0


if __name__ == "__main__":
  sys.exit(main())
