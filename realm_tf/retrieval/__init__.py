"""Maximum inner product search over block embeddings.

One `Searcher` interface, two backends (exact TF matmul + top_k; ScaNN TF ops), sharded
search with merged top-k, versioned index exports, and the KnowledgeIndex the trainer
searches in its step and swaps to each newer export (the one way an index is hot-swapped;
the server swaps whole servable versions). The retriever's encoder exports, the snapshots
the trainer hands to the index builder and the refresher that runs it are here too.
"""
from realm_tf.retrieval.exact import ExactSearcher
from realm_tf.retrieval.index_export import (
    IndexExport, ShardData, commit_export, garbage_collect, latest_export, list_exports,
    new_export_dir, write_export, write_shard)
from realm_tf.retrieval.index_loading import load_searcher
from realm_tf.retrieval.scann_index import ScannParams, ScannSearcher, scann_params_for
from realm_tf.retrieval.searcher import Searcher, SearchResult
from realm_tf.retrieval.sharded import ShardedSearcher

__all__ = [
    "ExactSearcher", "IndexExport", "ScannParams", "ScannSearcher",
    "SearchResult", "Searcher", "ShardData", "ShardedSearcher", "commit_export",
    "garbage_collect", "latest_export", "list_exports", "load_searcher", "new_export_dir",
    "scann_params_for", "write_export", "write_shard",
]
