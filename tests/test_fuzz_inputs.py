"""Bad input, generated (hypothesis): every reader of untrusted bytes ends each input in a
document, a set-aside record with its reason, or a clear error naming the file and record;
none raises anything else, and no valid record mixed with the garbage is lost.

  corpus readers   read_json_lines / read_wikipedia_pages + their parsers (jsonl, ccnews,
                   wikipedia_xml), and the Beam path: ReadRawRecords → ParseDocuments, with a
                   damaged .gz among the inputs
  questions        realm_tf.data.openqa_inputs.read_questions
  peer replies     realm_tf.training.watchdog.parse_status: what a peer's watchdog answers
  server           serving.tensors (TensorProto decoding and signature checks), Predict over
                   gRPC and REST on a live in-process server (which must keep answering)

Example counts are set per property (EXAMPLES); docs/reliability.md states them.
"""
import gzip
import io
import json
import os
import urllib.request

import apache_beam as beam
from apache_beam.testing.util import assert_that
import grpc
from hypothesis import HealthCheck, given, settings, strategies as st
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.framework import tensor_pb2
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc
from tensorflow_serving.config import model_server_config_pb2

from realm_tf.corpus import formats, json_records, readers, records, wikipedia
from realm_tf.corpus.records import SetAsideError
from realm_tf.data.openqa_inputs import read_questions
from realm_tf.pipelines.transforms.parse import SET_ASIDE, ParseDocuments
from realm_tf.pipelines.transforms.read import ReadRawRecords
from realm_tf.training import watchdog
from serving import errors, tensors
from tests import serving_harness, serving_models

pytestmark = pytest.mark.fuzz

# Examples tried per property; sized so the whole file runs in about two minutes on the
# 2-core development machine.
EXAMPLES = dict(json_lines=2000, news=1000, wikipedia=1000, beam=8, questions=1000,
                question_bytes=1000, tensor_protos=3000, request_bytes=2000,
                signature_checks=2000, grpc_predict=1000, rest_predict=1000,
                peer_replies=2000)
# `make test` runs each property at a fraction of its count (REALM_FUZZ_FRACTION=0.25 there:
# 250 to 750 inputs each, still more than hypothesis' default of 100), so the whole suite
# fits its time budget; `pytest -m fuzz` without it runs the full counts above.
FRACTION = float(os.environ.get("REALM_FUZZ_FRACTION", "1"))
MIN_EXAMPLES = 8  # the Beam property's count: it is never cut below that


def examples(name: str) -> int:
  """The property's example count scaled by FRACTION, never below MIN_EXAMPLES (or its
  full count, when that is smaller)."""
  if not 0 < FRACTION <= 1:
    raise ValueError(f"REALM_FUZZ_FRACTION={FRACTION}: give a fraction in (0, 1]")
  return min(EXAMPLES[name], max(MIN_EXAMPLES, round(EXAMPLES[name] * FRACTION)))


def fuzz(name):
  return settings(max_examples=examples(name), deadline=None, database=None,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


MAX_CHARS = 8000  # parser limit in these tests: longer text is TOO_LARGE
MAX_RECORD_BYTES = 8 * MAX_CHARS + 1024  # the reader's bound (as PreprocessConfig derives it)
PARSED = records.BAD_INPUT | records.BY_RULE

# ------------------------------------------------------------------------------ strategies

_word = st.from_regex(r"[A-Za-z]{1,10}", fullmatch=True)
sentence = st.lists(_word, min_size=1, max_size=8).map(lambda w: " ".join(w) + ".")
title = st.from_regex(r"[A-Z][a-z]{1,12}( [A-Z][a-z]{1,10})?", fullmatch=True).filter(
    lambda t: not t.startswith(("List", "Index", "Outline", "Indices")))
# Arbitrary text (hypothesis never draws lone surrogates for st.text()).
any_text = st.text(max_size=60)
json_scalar = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), any_text)
json_value = st.recursive(json_scalar, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(any_text, inner, max_size=4)), max_leaves=12)


def _one_line(data: bytes) -> bytes:
  return data.replace(b"\n", b" ").replace(b"\r", b" ")


@st.composite
def valid_document(draw):
  """A JSON line every parser must accept: (line, title, text)."""
  doc_title, text = draw(title), " ".join(draw(st.lists(sentence, min_size=1, max_size=4)))
  extra = draw(st.dictionaries(st.sampled_from(["id", "url", "category"]), json_scalar,
                               max_size=2))
  return json.dumps(dict(extra, title=doc_title, text=text)).encode(), doc_title, text


deep = st.integers(2_000, 60_000)
garbage_line = st.one_of(
    st.binary(max_size=200).map(_one_line),                                 # arbitrary bytes
    st.binary(min_size=1, max_size=80).map(lambda b: b"\xff" + _one_line(b)),  # not UTF-8
    deep.map(lambda n: b"[" * n + b"]" * n),                               # deep nesting
    deep.map(lambda n: b'{"title": "t", "text": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(5_000, 20_000).map(lambda n: b'{"title": ' + b"7" * n + b"}"),  # huge int
    json_value.map(lambda v: json.dumps(v).encode()),                      # wrong types
    st.fixed_dictionaries({"title": json_value, "text": json_value}).map(
        lambda d: json.dumps(d).encode()),
    st.integers(MAX_CHARS + 1, 3 * MAX_CHARS).map(                         # text too long
        lambda n: json.dumps({"title": "T", "text": "word " * (n // 5 + 1)}).encode()),
    st.integers(MAX_RECORD_BYTES, 4 * MAX_RECORD_BYTES).map(lambda n: b"x" * n),  # huge line
    st.just(b'{"title": "T", "text": "lone \\ud800 surrogate"}'),
)


def _parse_all(record_list, parser):
  """RawRecords → ({index: (title, text)}, {index: reason}); any other exception fails."""
  documents, set_aside = {}, {}
  for record in record_list:
    try:
      if record.defect:
        raise SetAsideError(record.defect, "flagged by the reader")
      documents[record.index] = parser(record.payload, MAX_CHARS)
    except SetAsideError as e:
      assert e.reason in PARSED, e.reason
      set_aside[record.index] = e.reason
  for doc_title, text in documents.values():  # the pipeline writes documents as UTF-8
    doc_title.encode("utf-8"), text.encode("utf-8")
  return documents, set_aside


# ------------------------------------------------------------------------------ JSON lines


@fuzz("json_lines")
@given(st.lists(st.one_of(valid_document(), garbage_line), max_size=12))
def test_json_lines_keep_every_valid_record_and_set_aside_the_rest(lines):
  payloads = [line[0] if isinstance(line, tuple) else line for line in lines]
  stream = io.BytesIO(b"\n".join(payloads))
  read = list(readers.read_json_lines(stream, "in.jsonl", MAX_RECORD_BYTES))
  non_blank = [p for p in payloads if p.strip()]
  assert len(read) == len(non_blank)  # one record per non-blank line, none merged or lost
  documents, set_aside = _parse_all(read, json_records.plain_document)
  assert len(documents) + len(set_aside) == len(read)
  ordinal = 0
  for line, payload in zip(lines, payloads):
    if not payload.strip():
      continue
    if isinstance(line, tuple):
      _, doc_title, text = line
      assert documents[ordinal] == (doc_title, text), (payload[:200], set_aside.get(ordinal))
    else:
      assert ordinal in set_aside or documents[ordinal][1].strip()
    ordinal += 1


@fuzz("news")
@given(st.lists(st.one_of(
    valid_document().map(lambda d: (d[0].replace(b'"text"', b'"maintext"'), d[1], d[2])),
    st.tuples(valid_document(), st.sampled_from(["de", "fr"])).map(
        lambda d: json.dumps(dict(json.loads(d[0][0]), language=d[1])).encode()),
    garbage_line), max_size=10))
def test_news_reader_sets_aside_other_languages_and_garbage(lines):
  parser = formats.get("ccnews", news_language="en").parser
  payloads = [line[0] if isinstance(line, tuple) else line for line in lines]
  read = list(readers.read_json_lines(io.BytesIO(b"\n".join(payloads)), "news.jsonl",
                                      MAX_RECORD_BYTES))
  documents, set_aside = _parse_all(read, parser)
  assert len(documents) + len(set_aside) == len(read) == len([p for p in payloads
                                                                if p.strip()])
  ordinal = 0
  for line, payload in zip(lines, payloads):
    if not payload.strip():
      continue
    if isinstance(line, tuple):
      assert documents[ordinal] == (line[1], line[2])
    elif b'"language": "de"' in payload or b'"language": "fr"' in payload:
      assert set_aside.get(ordinal) in (records.LANGUAGE, records.TOO_LARGE), payload[:200]
    ordinal += 1


# ------------------------------------------------------------------------------ Wikipedia XML


def _page(page_title: str, body: str, namespace: int = 0) -> bytes:
  return (f"  <page>\n    <title>{page_title}</title>\n    <ns>{namespace}</ns>\n    <revision>\n"
          f"      <text xml:space=\"preserve\">{body}</text>\n    </revision>\n  </page>\n"
          ).encode()


@st.composite
def valid_page(draw):
  page_title = draw(title)
  body = " ".join(draw(st.lists(sentence, min_size=1, max_size=4)))
  return _page(page_title, body), page_title


def _inside_page(body: bytes) -> bytes:
  return b"  <page>" + _one_line(body) + b"</page>\n"


bad_page = st.one_of(
    st.binary(max_size=300).map(_inside_page),                              # arbitrary bytes
    st.binary(min_size=1, max_size=60).map(lambda b: _inside_page(b"<title>\xff" + b)),
    deep.map(lambda n: _inside_page(b"<a>" * n + b"</a>" * n)),             # deep XML
    st.integers(1000, (MAX_CHARS - 1) // 4).map(                           # deep templates
        lambda n: _page("Deep", "{{" * n + "x" + "}}" * n)),
    st.integers(3, 40).map(lambda n: _inside_page(                          # entity bomb
        b'<!DOCTYPE p [<!ENTITY a "' + b"x" * n + b'">]><title>&a;</title>')),
    st.integers(MAX_RECORD_BYTES, 3 * MAX_RECORD_BYTES).map(                # huge page
        lambda n: _page("Huge", "word " * (n // 5))),
    st.integers(MAX_CHARS + 1, 2 * MAX_CHARS).map(lambda n: _page("Long", "w " * n)),
    title.map(lambda t: f"  <page>\n    <title>{t}</title>\n".encode()),     # never closed
    st.sampled_from([_page("Talk:X", "chat", namespace=1), _page("Y", "#REDIRECT [[Z]]"),
                     _page("Empty", "{{stub}}"), _page("A &amp; B", "{{disambiguation}}")]),
)


@fuzz("wikipedia")
@given(st.lists(st.one_of(valid_page(), bad_page), max_size=8))
def test_wikipedia_pages_keep_every_article_and_set_aside_the_rest(pages):
  chunks = [p[0] if isinstance(p, tuple) else p for p in pages]
  dump = (b"<mediawiki>\n  <siteinfo>\n  </siteinfo>\n" + b"".join(chunks)
          + b"</mediawiki>\n")
  read = list(readers.read_wikipedia_pages(io.BytesIO(dump), "dump.xml", MAX_RECORD_BYTES))
  assert len(read) == len(chunks)  # one record per page, closed or not
  documents, set_aside = _parse_all(read, wikipedia.article)
  assert len(documents) + len(set_aside) == len(read)
  for ordinal, page in enumerate(pages):
    if isinstance(page, tuple):
      assert ordinal in documents, (page[0][:200], set_aside.get(ordinal))
      assert documents[ordinal][0] == page[1]
    else:
      assert ordinal in set_aside, chunks[ordinal][:200]


# ------------------------------------------------------------------------------ Beam


@fuzz("beam")
@given(clean=st.lists(st.one_of(valid_document(), garbage_line), min_size=1, max_size=10),
       damaged=st.lists(valid_document(), min_size=1, max_size=6),
       cut=st.floats(0.2, 0.9))
def test_beam_read_and_parse_account_for_every_record(tmp_path_factory, clean, damaged, cut):
  """The pipeline's read and parse steps on a clean file and a truncated .gz: the clean
  file's valid records all come through and its garbage is set aside one for one; the
  damaged file gives a prefix of its records and one `unreadable` dead letter."""
  directory = tmp_path_factory.mktemp("beam_in")
  clean_payloads = [line[0] if isinstance(line, tuple) else line for line in clean]
  (directory / "a.jsonl").write_bytes(b"\n".join(clean_payloads) + b"\n")
  whole = gzip.compress(b"\n".join(d[0] for d in damaged) + b"\n")
  (directory / "b.jsonl.gz").write_bytes(whole[:max(20, int(len(whole) * cut))])
  expected_clean = sorted(d[1] for d in clean if isinstance(d, tuple))
  num_clean_records = len([p for p in clean_payloads if p.strip()])
  damaged_titles = [d[1] for d in damaged]

  def check(pair):
    documents, set_aside = pair
    from_clean = sorted(d.title for d in documents if d.path.endswith("a.jsonl"))
    from_damaged = sorted(d.title for d in documents if d.path.endswith(".gz"))
    assert from_clean == expected_clean
    assert from_damaged == sorted(damaged_titles[:len(from_damaged)])
    clean_aside = [s for s in set_aside if s.path.endswith("a.jsonl")]
    assert len(from_clean) + len(clean_aside) == num_clean_records
    unreadable = [s for s in set_aside if s.reason == records.UNREADABLE]
    assert len(unreadable) == 1 and unreadable[0].path.endswith("b.jsonl.gz")
    assert "cannot be decompressed" in unreadable[0].detail

  from apache_beam.io import fileio  # pylint: disable=g-import-not-at-top
  with beam.Pipeline() as pipeline:
    raw = (pipeline
           | beam.Create([str(directory / "a.jsonl"), str(directory / "b.jsonl.gz")])
           | fileio.MatchAll()
           | ReadRawRecords("jsonl", MAX_RECORD_BYTES))
    parsed = raw | ParseDocuments("jsonl", MAX_CHARS)
    documents = parsed.documents | "Documents" >> beam.combiners.ToList()
    set_aside = parsed[SET_ASIDE] | "SetAside" >> beam.combiners.ToList()
    both = documents | "Join" >> beam.Map(lambda docs, aside: (docs, aside),
                                          aside=beam.pvalue.AsSingleton(set_aside))
    assert_that(both, lambda actual: check(*actual))


# ------------------------------------------------------------------------------ questions


def _question_line(question, answers) -> bytes:
  return json.dumps({"question": question, "answer": answers}).encode()


valid_question = st.tuples(
    st.text(min_size=1, max_size=60).filter(lambda q: q.strip()),
    st.lists(st.text(max_size=20), min_size=1, max_size=3))
bad_question = st.one_of(
    st.binary(max_size=100).map(lambda b: b"\x80" + _one_line(b)),         # not UTF-8
    deep.map(lambda n: b"[" * n + b"]" * n),
    st.integers(5_000, 20_000).map(lambda n: b'{"question": ' + b"1" * n + b"}"),
    json_value.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"question": json_value.filter(lambda v: not isinstance(v, str)),
                           "answer": json_value}).map(lambda d: json.dumps(d).encode()),
    st.fixed_dictionaries({"question": st.just("q?"), "answer": json_value.filter(
        lambda v: not isinstance(v, str) and not (
            isinstance(v, list) and v and all(isinstance(a, str) for a in v)))}).map(
                lambda d: json.dumps(d).encode()),
    st.integers(1 << 16, 1 << 18).map(lambda n: b"y" * n),                # past the bound
    st.just(b'{"question": "x\\udfff?", "answer": ["a"]}'),
)


@fuzz("questions")
@given(st.lists(st.one_of(valid_question, bad_question), min_size=1, max_size=10))
def test_question_loader_reads_all_or_names_the_first_bad_line(tmp_path_factory, lines):
  path = str(tmp_path_factory.mktemp("q") / "questions.jsonl")
  payloads = [_question_line(*line) if isinstance(line, tuple) else line for line in lines]
  with open(path, "wb") as f:
    f.write(b"\n".join(payloads) + b"\n")
  bad = [n for n, line in enumerate(lines, 1) if not isinstance(line, tuple)]
  if bad:
    with pytest.raises(ValueError) as error:
      read_questions(path, max_record_bytes=1 << 16)
    assert str(error.value).startswith(f"{path}:{bad[0]}: "), str(error.value)[:300]
    if payloads[bad[0] - 1].startswith(b"yyyy"):  # refused by the bound, not by JSON
      assert "longer than 65536 bytes" in str(error.value)
  else:
    got = read_questions(path, max_record_bytes=1 << 16)
    assert [(e.question, e.answers) for e in got] == [(q.strip(), a) for q, a in lines]


@fuzz("question_bytes")
@given(st.binary(max_size=2000))
def test_question_loader_on_arbitrary_bytes(tmp_path_factory, data):
  path = str(tmp_path_factory.mktemp("q") / "bytes.jsonl")
  with open(path, "wb") as f:
    f.write(data)
  try:
    got = read_questions(path)
  except ValueError as e:
    assert str(e).startswith(path + ":"), str(e)[:300]
  else:
    assert got and all(e.question and e.answers for e in got)


# ---------------------------------------------------------------- watchdog: a peer's reply

# A status as Watchdog.status serves it, and the same with one field replaced by any JSON
# value or some fields left out.
peer_status = st.fixed_dictionaries(dict(
    task=st.sampled_from(["worker:1", "chief:0"]),
    trainer=st.sampled_from(["running", "stopped"]), exit=st.none(),
    heartbeat_age=st.one_of(st.none(), st.floats(0, 1e6)), batches=st.integers(0, 10**9),
    step=st.one_of(st.none(), st.integers(-1, 10**9)), phase=st.sampled_from(["train", "host"]),
    verdict=st.one_of(st.none(), st.lists(st.text(alphabet=st.characters(
        blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=30), max_size=2))))
damaged_status = st.one_of(
    st.tuples(peer_status, st.sampled_from(
        ["trainer", "exit", "heartbeat_age", "batches", "step", "verdict"]), json_value).map(
            lambda t: dict(t[0], **{t[1]: t[2]})),
    st.tuples(peer_status, st.sets(st.sampled_from(["trainer", "heartbeat_age", "batches"]),
                                   min_size=1)).map(
        lambda t: {k: v for k, v in t[0].items() if k not in t[1]}))
peer_reply = st.one_of(
    peer_status.map(lambda s: ("whole", s, json.dumps(s).encode())),
    st.tuples(peer_status, st.floats(0, 1, exclude_max=True)).map(  # closed part-way
        lambda t: ("cut", t[0], json.dumps(t[0]).encode()[:int(t[1] * len(json.dumps(t[0])))])),
    damaged_status.map(lambda s: ("any", s, json.dumps(s).encode())),
    json_value.map(lambda v: ("any", v, json.dumps(v).encode())),
    st.binary(max_size=300).map(lambda b: ("any", None, b)),
    deep.map(lambda n: ("any", None, b"[" * n + b"]" * n)),
    st.integers(5_000, 20_000).map(lambda n: ("any", None, b'{"batches": ' + b"7" * n + b"}")),
)


@fuzz("peer_replies")
@given(peer_reply)
def test_a_peer_reply_is_a_status_judge_reads_or_one_clause_naming_what_is_wrong(reply):
  """Whatever a peer's watchdog sends: a status the verdict can be judged on (a whole one
  read as sent), or BadReply with one line saying what is wrong (a reply cut part-way
  always)."""
  kind, sent, data = reply
  try:
    status = watchdog.parse_status(data)
  except watchdog.BadReply as e:
    assert kind != "whole", (data[:200], str(e))
    clause = str(e)
    assert clause.startswith("its reply") and len(clause) < 300, clause
    assert "\n" not in clause and "\r" not in clause, clause
    return
  assert kind != "cut", data[:200]
  if kind == "whole":
    assert status == sent
  own = dict(trainer="running", heartbeat_age=0.1, batches=3, step=2)
  verdict = watchdog.judge({"worker:0": own, "worker:1": status}, {"worker:0": "h0:1"})
  assert verdict and all("\n" not in line and "\r" not in line for line in verdict), verdict
  assert all(isinstance(line, str) and "\n" not in line for line in status.get("verdict") or [])


# ------------------------------------------------------------------------------ server: tensors

MAX_DECODED = 1 << 16
_DTYPE_ENUMS = [int(v) for v in tensor_pb2.TensorProto.DESCRIPTOR.fields_by_name[
    "dtype"].enum_type.values_by_number]


@st.composite
def tensor_proto(draw):
  proto = tensor_pb2.TensorProto()
  proto.dtype = draw(st.one_of(st.sampled_from(_DTYPE_ENUMS), st.integers(-5, 300)))
  if draw(st.booleans()):
    proto.tensor_shape.unknown_rank = True
  for size in draw(st.lists(st.one_of(st.integers(-3, 6), st.integers(-(1 << 62), 1 << 62)),
                            max_size=5)):
    proto.tensor_shape.dim.add(size=size)
  field = draw(st.sampled_from(["tensor_content", "float_val", "double_val", "int_val",
                                "int64_val", "string_val", "bool_val", "half_val",
                                "scomplex_val", "dcomplex_val", "uint32_val", "uint64_val",
                                "none"]))
  count = st.integers(0, 12)
  if field == "tensor_content":
    proto.tensor_content = draw(st.binary(max_size=200))
  elif field in ("float_val", "double_val", "scomplex_val", "dcomplex_val"):
    getattr(proto, field).extend(draw(st.lists(st.floats(width=32), max_size=12)))
  elif field in ("int_val", "half_val"):
    getattr(proto, field).extend(draw(st.lists(st.integers(-(1 << 31), (1 << 31) - 1),
                                               max_size=12)))
  elif field in ("int64_val",):
    proto.int64_val.extend(draw(st.lists(st.integers(-(1 << 63), (1 << 63) - 1),
                                         max_size=12)))
  elif field in ("uint32_val", "uint64_val"):
    getattr(proto, field).extend(draw(st.lists(st.integers(0, (1 << 32) - 1), max_size=12)))
  elif field == "string_val":
    proto.string_val.extend(draw(st.lists(st.binary(max_size=40), max_size=12)))
  elif field == "bool_val":
    proto.bool_val.extend(draw(st.lists(st.booleans(), max_size=draw(count))))
  return proto


@fuzz("tensor_protos")
@given(st.dictionaries(st.text(max_size=8), tensor_proto(), max_size=3))
def test_tensor_decoding_returns_arrays_or_invalid_argument(protos):
  try:
    arrays = tensors.decode_inputs(protos, MAX_DECODED)
  except errors.ServingError as e:
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT, e
    assert "input " in e.message
    return
  assert set(arrays) == set(protos)
  assert sum(a.nbytes for a in arrays.values() if a.dtype != object) <= MAX_DECODED


@fuzz("request_bytes")
@given(st.binary(max_size=400))
def test_arbitrary_bytes_as_a_predict_request(data):
  """What the gRPC layer hands over after parsing arbitrary bytes is decoded safely too."""
  try:
    request = predict_pb2.PredictRequest.FromString(data)
  except Exception:  # pylint: disable=broad-except
    return  # grpc answers a request it cannot parse itself (tested live below)
  try:
    tensors.decode_inputs(request.inputs, MAX_DECODED)
  except errors.ServingError as e:
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT


NUMERIC_SPECS = {"x": tf.TensorSpec([None, 3], tf.float32)}
SCALE_SPECS = {"x": tf.TensorSpec([None, 3], tf.float32), "factor": tf.TensorSpec([], tf.float32)}
_dtypes = st.sampled_from([np.float32, np.float64, np.int32, np.int64, np.bool_, object,
                           np.float16, np.uint8])


@st.composite
def arrays_for(draw, names):
  result = {}
  for name in draw(st.lists(st.sampled_from(names + ["other"]), unique=True, max_size=3)):
    shape = draw(st.lists(st.integers(0, 12), max_size=3))
    dtype = draw(_dtypes)
    result[name] = (np.full(shape, b"s", dtype=object) if dtype is object
                    else np.zeros(shape, dtype))
  return result


@fuzz("signature_checks")
@given(st.sampled_from([NUMERIC_SPECS, SCALE_SPECS]), st.data())
def test_signature_checks_accept_only_what_the_signature_takes(specs, data):
  inputs = data.draw(arrays_for(sorted(specs)))
  try:
    batch = tensors.validate_inputs(specs, inputs, max_batch_size=8)
  except errors.ServingError as e:
    assert e.code == grpc.StatusCode.INVALID_ARGUMENT
    return
  assert set(inputs) == set(specs) and 1 <= batch <= 8
  for name, spec in specs.items():
    assert tensors.dtype_of(inputs[name]) == spec.dtype
    assert spec.shape.is_compatible_with(inputs[name].shape)


# ------------------------------------------------------------------------------ live server


@pytest.fixture(scope="module")
def live_server(tmp_path_factory):
  """numeric (float inputs) and realm_qa (a string input), version 1 each."""
  root = tmp_path_factory.mktemp("fuzz_models")
  serving_models.publish(serving_models.save_numeric(str(root / "built_numeric")),
                         str(root / "models" / "numeric"), 1)
  serving_models.publish(serving_models.save_fake_realm_qa(str(root / "built_qa")),
                         str(root / "models" / "realm_qa"), 1)
  config = model_server_config_pb2.ModelServerConfig()
  for name in ("numeric", "realm_qa"):
    model = config.model_config_list.config.add()
    model.name, model.base_path = name, str(root / "models" / name)
    model.model_platform = "tensorflow"
  with serving_harness.running(config, rest_api_port=0, max_batch_size=8,
                               max_message_bytes=1 << 16) as served:
    yield served


def _valid_request(rows: int = 2) -> predict_pb2.PredictRequest:
  request = predict_pb2.PredictRequest()
  request.model_spec.name = "numeric"
  request.inputs["x"].CopyFrom(tf.make_tensor_proto(np.ones([rows, 3], np.float32)))
  return request


def _assert_still_answers(stub):
  response = stub.Predict(_valid_request(), timeout=10)
  np.testing.assert_allclose(tf.make_ndarray(response.outputs["y"]),
                             np.ones([2, 3], np.float32) @ (np.arange(6).reshape(3, 2) / 4)
                             + [0.5, -1.0], rtol=1e-6)


REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED}


@st.composite
def predict_request(draw):
  request = predict_pb2.PredictRequest()
  request.model_spec.name = draw(st.sampled_from(["numeric", "numeric", "", "nope"]))
  request.model_spec.signature_name = draw(st.sampled_from(["", "scale", "serving_default",
                                                            "missing"]))
  if draw(st.booleans()):
    request.model_spec.version.value = draw(st.integers(-(1 << 63), (1 << 63) - 1))
  for name, proto in draw(st.dictionaries(st.sampled_from(["x", "factor", "y", ""]),
                                          tensor_proto(), max_size=2)).items():
    request.inputs[name].CopyFrom(proto)
  request.output_filter.extend(draw(st.lists(st.sampled_from(["y", "calls", "zz"]),
                                             max_size=2)))
  return request


@fuzz("grpc_predict")
@given(st.one_of(predict_request(), st.binary(max_size=300)))
def test_grpc_predict_refuses_bad_requests_and_keeps_answering(live_server, request):
  _, channel = live_server
  stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
  if isinstance(request, bytes):
    raw = channel.unary_unary("/tensorflow.serving.PredictionService/Predict",
                              request_serializer=None, response_deserializer=None)
    try:
      raw(request, timeout=10)
    except grpc.RpcError as e:
      # grpc's own answer to bytes that do not parse; a parsed request is refused below.
      assert e.code() in REFUSALS | {grpc.StatusCode.INTERNAL}, e
      if e.code() == grpc.StatusCode.INTERNAL:
        assert "deserializ" in e.details().lower(), e.details()
  else:
    try:
      stub.Predict(request, timeout=10)
    except grpc.RpcError as e:
      assert e.code() in REFUSALS, (e.code(), e.details())
  _assert_still_answers(stub)


def _rest(server, body: bytes, path: str = "/v1/models/numeric:predict", method="POST"):
  request = urllib.request.Request(f"http://127.0.0.1:{server.rest_port}{path}",
                                   data=body if method == "POST" else None, method=method,
                                   headers={"Content-Type": "application/json"})
  try:
    with urllib.request.urlopen(request, timeout=10) as response:
      return response.status, json.loads(response.read())
  except urllib.error.HTTPError as e:
    return e.code, json.loads(e.read())


rest_body = st.one_of(
    st.binary(max_size=300),
    json_value.map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"instances": json_value}).map(lambda v: json.dumps(v).encode()),
    st.fixed_dictionaries({"inputs": st.dictionaries(st.sampled_from(["x", "factor", "q"]),
                                                     json_value, max_size=2),
                           "signature_name": st.sampled_from(["", "scale", 7])}).map(
                               lambda v: json.dumps(v).encode()),
    deep.map(lambda n: b'{"instances": ' + b"[" * n + b"]" * n + b"}"),
    st.integers(33, 900).map(lambda n: b'{"instances": ' + b"[" * n + b"1" + b"]" * n + b"}"),
    st.integers(33, 900).map(lambda n: b'{"instances": ' + b"[" * n + b'"q"' + b"]" * n + b"}"),
    st.lists(st.text(max_size=30), min_size=1, max_size=4).map(
        lambda q: json.dumps({"instances": q}).encode()),
    st.integers(5_000, 20_000).map(lambda n: b'{"instances": [[' + b"9" * n + b", 1, 2]]}"),
)
rest_model = st.sampled_from(["/v1/models/numeric", "/v1/models/realm_qa",
                              "/v1/models/numeric/versions/1", "/v1/models/realm_qa/labels/x",
                              "/v1/models/numeric/versions/99999999999999999999999",
                              "/v1/models/nope", "/v1/models/%ff%fe", "/v2/x"])
rest_action = st.sampled_from([":predict", ":predict", ":classify", "/metadata", ""])


@fuzz("rest_predict")
@given(rest_body, rest_model, rest_action, st.sampled_from(["POST", "POST", "GET"]))
def test_rest_predict_answers_json_errors_never_500(live_server, body, model, action,
                                                     method):
  server, channel = live_server
  status, payload = _rest(server, body, model + action, method)
  assert status != 500 and status < 600, (status, payload)
  assert status == 200 or ("error" in payload and payload["error"]), (status, payload)
  ok_status, ok = _rest(server, json.dumps({"instances": [[1.0, 1.0, 1.0]]}).encode())
  assert ok_status == 200 and len(ok["predictions"]) == 1
  _assert_still_answers(prediction_service_pb2_grpc.PredictionServiceStub(channel))
