"""Maximum inner product search over block embeddings.

One `Searcher` interface, two backends (exact TF matmul + top_k; ScaNN TF ops), sharded
search with merged top-k, versioned atomic index exports, and a watcher that swaps in
newer exports while callers keep searching.
"""
from realm_tf.retrieval.exact import ExactSearcher
from realm_tf.retrieval.index_export import (
    IndexExport, ShardData, commit_export, garbage_collect, latest_export, list_exports,
    new_export_dir, write_export, write_shard)
from realm_tf.retrieval.loading import load_searcher
from realm_tf.retrieval.scann_searcher import ScannParams, ScannSearcher, scann_params_for
from realm_tf.retrieval.searcher import Searcher, SearchResult
from realm_tf.retrieval.sharded import ShardedSearcher
from realm_tf.retrieval.watcher import IndexWatcher

__all__ = [
    "ExactSearcher", "IndexExport", "IndexWatcher", "ScannParams", "ScannSearcher",
    "SearchResult", "Searcher", "ShardData", "ShardedSearcher", "commit_export",
    "garbage_collect", "latest_export", "list_exports", "load_searcher", "new_export_dir",
    "scann_params_for", "write_export", "write_shard",
]
