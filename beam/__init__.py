"""Apache Beam pipelines that prepare REALM corpora (run on DirectRunner or Dataflow)."""
