"""A small corpus in the corpus pipeline's TFRecord layout, written through its schema.

Facts are invented ("the capital of Veloria is Talmont") so that a model can only predict
a masked name by retrieving the block that states it.
"""
import hashlib
import random


from realm_tf.corpus import published, schema

_COUNTRIES = ["Veloria", "Quessa", "Drantor", "Miravel", "Ostheim", "Calbria", "Tessaly",
              "Norwend", "Pallora", "Zeverin", "Aruvel", "Brisca"]
_CITIES = ["Talmont", "Ruvik", "Sennet", "Orlamb", "Kestrel", "Dunmere", "Valcor", "Lisk",
           "Mordane", "Pellet", "Arbor", "Quill"]
_RIVERS = ["Amsel", "Torva", "Glenn", "Sarn", "Ilse", "Vorn", "Kell", "Durra", "Maas",
           "Pryl", "Oder", "Lune"]


def _uid(title, text):
  return hashlib.sha1(f"{title}\n{text}".encode()).hexdigest()


def write_corpus(directory: str, seed: int = 0, num_shards: int = 1) -> dict:
  """blocks-*, pretraining-*, ict-* TFRecords, `num_shards` files each (row i in file
  i mod num_shards); returns counts and the doc uids."""
  rng = random.Random(seed)
  blocks, pretraining, ict = [], [], []
  for i, country in enumerate(_COUNTRIES):
    city, river = _CITIES[i], _RIVERS[i]
    sentences = [f"The capital of {country} is {city}.",
                 f"The river {river} flows through {city}.",
                 f"{country} joined the league in {1900 + 7 * i}."]
    title = country
    text = " ".join(sentences)
    uid = _uid(title, text)
    block_id = int(hashlib.sha1(f"{uid}:0".encode()).hexdigest()[:15], 16)
    blocks.append(dict(block_id=block_id, doc_uid=uid, title=title, text=text))
    for sentence, entity in zip(sentences, [city, river, country]):
      start = sentence.encode().index(entity.encode())
      pretraining.append(dict(text=sentence, block_id=block_id, doc_uid=uid,
                              salient_span_starts=[start],
                              salient_span_ends=[start + len(entity.encode())],
                              salient_span_labels=["LOC"]))
      # The same fact restated elsewhere: retrieving the block is useful but not trivial.
      restated = f"Travellers in {country} often visit {city}."
      rs = restated.encode().index(city.encode())
      pretraining.append(dict(text=restated, block_id=-1, doc_uid=f"news{i}",
                              salient_span_starts=[rs],
                              salient_span_ends=[rs + len(city.encode())],
                              salient_span_labels=["LOC"]))
      removed = rng.random() < 0.9
      evidence = " ".join(s for s in sentences if not (removed and s == sentence))
      ict.append(dict(query=sentence, query_removed=int(removed), block_id=block_id,
                      doc_uid=uid, title=title, text=evidence))
  # Published as beam.preprocess publishes a corpus (manifest.json last): every reader
  # opens a corpus through its manifest.
  published.publish_records(directory, dict(blocks=(blocks, schema.BLOCK),
                                            pretraining=(pretraining, schema.PRETRAINING),
                                            ict=(ict, schema.ICT)),
                            dict(kind="synthetic_corpus", seed=seed), overwrite=True,
                            num_shards=num_shards)
  return dict(blocks=len(blocks), pretraining=len(pretraining), ict=len(ict),
              doc_uids={b["block_id"]: b["doc_uid"] for b in blocks})
