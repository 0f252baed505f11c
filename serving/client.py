"""`python -m serving.client`: ask the served REALM QA model, see where the answer came from.

    python -m serving.client --server localhost:8500 "who wrote the iliad?" ["..." ...]
        [--model realm_qa] [--signature serving_default] [--timeout 10] [--top_blocks 5]
        [--json] [--leaves_fraction 0.1 --reorder_num_neighbors 200]
        [--tls] [--ssl_ca_file ca.pem] [--ssl_cert_file client.pem --ssl_key_file client.key]

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

A ScaNN export (realm_qa_scann) also serves `answer_with_search_options`, the same
contract plus two scalar inputs chosen per request: leaves_fraction (float32, in (0, 1]:
the fraction of each ScaNN shard's tree leaves searched) and reorder_num_neighbors
(int32, at least the blocks retrieved: the candidates re-scored). --leaves_fraction and
--reorder_num_neighbors (both or neither) send them, to that signature by default.

Every QA export also serves `retrieve` (question [B] → block_ids int64 [B, K],
block_titles string [B, K], retrieval_scores float32 [B, K], nothing read) and
`retrieve_embedding` (query_embedding float32 [B, P] → the same outputs): `retrieve` below.

TLS (a server started with --ssl_config_file): --ssl_ca_file is the CA that signed the
server's certificate (default: the system's roots, with --tls); --ssl_cert_file and
--ssl_key_file are this client's certificate and key, for a server that checks them
(client_verify). Any of the three implies --tls.
"""
import argparse
import json
import sys
from typing import Optional, Sequence

import grpc
import numpy as np
import tensorflow as tf
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

QUESTION = "question"
SEARCH_OPTIONS_SIGNATURE = "answer_with_search_options"
LEAVES_FRACTION = "leaves_fraction"
REORDER_NUM_NEIGHBORS = "reorder_num_neighbors"
RETRIEVE_SIGNATURE = "retrieve"
RETRIEVE_EMBEDDING_SIGNATURE = "retrieve_embedding"
QUERY_EMBEDDING = "query_embedding"
RETRIEVE_OUTPUTS = ("block_ids", "block_titles", "retrieval_scores")
PER_QUESTION = ("answer", "score", "answer_block")
PER_BLOCK = ("block_ids", "block_titles", "block_texts", "retrieval_probs")
MAX_MESSAGE_BYTES = 64 << 20


def _text(value) -> str:
  return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def ask(stub: prediction_service_pb2_grpc.PredictionServiceStub, questions: Sequence[str],
        model: str = "realm_qa", signature: Optional[str] = None,
        timeout: float = 10.0, leaves_fraction: Optional[float] = None,
        reorder_num_neighbors: Optional[int] = None) -> list:
  """One Predict for all `questions`; a dict per question with its answer and provenance.

  Args:
    stub: a PredictionService stub on a gRPC channel (serving.server or
      tensorflow_model_server).
    questions: the questions, one request for all of them.
    model: the served model's name.
    signature: the signature to call (QA contract above); default serving_default, or
      answer_with_search_options when search options are given.
    timeout: the request's deadline in seconds.
    leaves_fraction: with reorder_num_neighbors, the ScaNN search options (see above).
    reorder_num_neighbors: with leaves_fraction.

  Returns:
    One dict per question, in order: {"question", "answer", "score", "answer_block",
    "model": {"name", "version", "signature"}, "blocks": [{"rank", "block_id", "title",
    "text", "retrieval_prob", "is_answer_block"}, ...] (K blocks, best first)}.

  Raises:
    ValueError: no questions, only one of the search options, or a response that does
      not follow the QA contract (missing outputs, wrong ranks or row counts).
    grpc.RpcError: the server's error (unknown model, deadline, overload, ...).
  """
  if not questions:
    raise ValueError("ask: no questions")
  if (leaves_fraction is None) != (reorder_num_neighbors is None):
    # The signature takes both: there is no one value meaning every shard's own.
    raise ValueError("ask: leaves_fraction and reorder_num_neighbors go together")
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model
  request.model_spec.signature_name = signature or (
      "serving_default" if leaves_fraction is None else SEARCH_OPTIONS_SIGNATURE)
  encoded = np.array([q.encode("utf-8") for q in questions], dtype=object)  # [B]
  request.inputs[QUESTION].CopyFrom(tf.make_tensor_proto(encoded))
  if leaves_fraction is not None:
    request.inputs[LEAVES_FRACTION].CopyFrom(
        tf.make_tensor_proto(np.float32(leaves_fraction)))  # []
    request.inputs[REORDER_NUM_NEIGHBORS].CopyFrom(
        tf.make_tensor_proto(np.int32(reorder_num_neighbors)))  # []
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


def retrieve(stub: prediction_service_pb2_grpc.PredictionServiceStub,
             model: str = "realm_qa", questions: Optional[Sequence[str]] = None,
             query_embeddings: Optional[np.ndarray] = None, timeout: float = 10.0) -> dict:
  """One Predict on `retrieve` (questions) or `retrieve_embedding` (query embeddings):
  the K blocks the model's search finds for each, best first, nothing read.

  Args:
    stub: a PredictionService stub on a gRPC channel.
    model: the served model's name.
    questions: B question strings, or
    query_embeddings: [B, P] float32 query embeddings (the query tower's output space);
      exactly one of the two.
    timeout: the request's deadline in seconds.

  Returns:
    {"block_ids": int64 [B, K], "block_titles": [B, K] str, "retrieval_scores": float32
    [B, K]}.

  Raises:
    ValueError: neither or both inputs, an empty request, or a response without the
      retrieve outputs or with another number of rows.
    grpc.RpcError: the server's error.
  """
  if (questions is None) == (query_embeddings is None):
    raise ValueError("retrieve: give questions or query_embeddings, one of them")
  request = predict_pb2.PredictRequest()
  request.model_spec.name = model
  if questions is not None:
    request.model_spec.signature_name = RETRIEVE_SIGNATURE
    encoded = np.array([q.encode("utf-8") for q in questions], dtype=object)  # [B]
    request.inputs[QUESTION].CopyFrom(tf.make_tensor_proto(encoded))
    batch = len(encoded)
  else:
    embeddings = np.asarray(query_embeddings, np.float32)
    if embeddings.ndim != 2:
      raise ValueError(f"retrieve: query_embeddings must be [B, P], got shape "
                       f"{list(embeddings.shape)}")
    request.model_spec.signature_name = RETRIEVE_EMBEDDING_SIGNATURE
    request.inputs[QUERY_EMBEDDING].CopyFrom(tf.make_tensor_proto(embeddings))  # [B, P]
    batch = len(embeddings)
  if not batch:
    raise ValueError("retrieve: an empty request")
  response = stub.Predict(request, timeout=timeout)
  out = {}
  for name in RETRIEVE_OUTPUTS:
    if name not in response.outputs:
      raise ValueError(f"the response of model {model!r} has no output {name!r} "
                       f"(it has {sorted(response.outputs)})")
    out[name] = tf.make_ndarray(response.outputs[name])
    if out[name].ndim != 2 or out[name].shape[0] != batch:
      raise ValueError(f"output {name!r} has shape {list(out[name].shape)}; expected "
                       f"[{batch}, K]")
  out["block_titles"] = np.vectorize(_text, otypes=[object])(out["block_titles"])
  return out


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


def channel_credentials(ca_file: Optional[str] = None, cert_file: Optional[str] = None,
                        key_file: Optional[str] = None) -> grpc.ChannelCredentials:
  """TLS credentials for a channel to a server with --ssl_config_file.

  Args:
    ca_file: PEM file of the CA(s) to trust for the server's certificate; None: the
      system's roots (gRPC's default).
    cert_file: with key_file, this client's PEM certificate (for client_verify servers).
    key_file: this client's PEM private key, unencrypted.

  Returns:
    grpc.ssl_channel_credentials over the files' contents.

  Raises:
    ValueError: only one of cert_file and key_file, or a file that cannot be read (named).
  """
  if (cert_file is None) != (key_file is None):
    raise ValueError("a client certificate needs both --ssl_cert_file and --ssl_key_file")

  def read(flag, path):
    if path is None:
      return None
    try:
      with open(path, "rb") as f:
        return f.read()
    except OSError as e:
      raise ValueError(f"{flag} {path}: cannot read: {e.strerror}") from None

  return grpc.ssl_channel_credentials(root_certificates=read("--ssl_ca_file", ca_file),
                                      private_key=read("--ssl_key_file", key_file),
                                      certificate_chain=read("--ssl_cert_file", cert_file))


def build_parser() -> argparse.ArgumentParser:
  """The command line of `python -m serving.client` (see the module docstring)."""
  parser = argparse.ArgumentParser(prog="python -m serving.client", description=__doc__,
                                   formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("questions", nargs="+", help="one or more questions")
  parser.add_argument("--server", default="localhost:8500", help="host:port of the gRPC API")
  parser.add_argument("--model", default="realm_qa")
  parser.add_argument("--signature", default=None,
                      help="default serving_default, or answer_with_search_options with "
                      "the search options below")
  parser.add_argument("--timeout", type=float, default=10.0, help="deadline in seconds")
  parser.add_argument("--top_blocks", type=int, default=5, help="retrieved blocks to print")
  parser.add_argument("--json", action="store_true", help="print the answers as JSON")
  parser.add_argument("--leaves_fraction", type=float, default=None,
                      help="ScaNN exports: the fraction of each shard's leaves searched, "
                      "in (0, 1] (with --reorder_num_neighbors)")
  parser.add_argument("--reorder_num_neighbors", type=int, default=None,
                      help="ScaNN exports: candidates re-scored, at least the blocks "
                      "retrieved (with --leaves_fraction)")
  parser.add_argument("--tls", action="store_true",
                      help="connect with TLS (implied by the --ssl_* options)")
  parser.add_argument("--ssl_ca_file", default=None,
                      help="PEM CA certificate(s) to trust for the server's certificate "
                      "(default with --tls: the system's roots)")
  parser.add_argument("--ssl_cert_file", default=None,
                      help="this client's PEM certificate, for a server with client_verify "
                      "(with --ssl_key_file)")
  parser.add_argument("--ssl_key_file", default=None,
                      help="this client's PEM private key (with --ssl_cert_file)")
  return parser


def main(argv=None) -> int:
  """Asks the questions on the command line and prints the answers.

  Args:
    argv: the arguments (default: sys.argv[1:]).

  Returns:
    The exit status: 0, or 1 when the server refused or answered outside the contract
    (the reason on stderr).
  """
  parser = build_parser()
  args = parser.parse_args(argv)
  if (args.leaves_fraction is None) != (args.reorder_num_neighbors is None):
    parser.error("--leaves_fraction and --reorder_num_neighbors go together")
  options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)]
  if args.tls or args.ssl_ca_file or args.ssl_cert_file or args.ssl_key_file:
    try:
      credentials = channel_credentials(args.ssl_ca_file, args.ssl_cert_file,
                                        args.ssl_key_file)
    except ValueError as e:
      parser.error(str(e))
    channel = grpc.secure_channel(args.server, credentials, options=options)
  else:
    channel = grpc.insecure_channel(args.server, options=options)
  with channel:
    stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
    try:
      answers = ask(stub, args.questions, args.model, args.signature, args.timeout,
                    args.leaves_fraction, args.reorder_num_neighbors)
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
