"""TF Serving's gRPC/REST API over realm_tf's SavedModel exports (no model server binary).

`python -m serving.server` serves exports laid out as TF Serving expects
(`<base_path>/<version>/saved_model.pb`) through the official `tensorflow_serving.apis`
services, so clients use the official stubs unchanged and the same exports load in a real
tensorflow_model_server. `python -m serving.client` asks the REALM QA model questions.
"""
