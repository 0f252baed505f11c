"""TF Serving's PredictionService and ModelService on the official generated servicers."""
import logging
from typing import Callable

import grpc
from tensorflow_serving.apis import get_model_metadata_pb2
from tensorflow_serving.apis import get_model_status_pb2
from tensorflow_serving.apis import model_management_pb2
from tensorflow_serving.apis import model_pb2
from tensorflow_serving.apis import model_service_pb2_grpc
from tensorflow_serving.apis import predict_pb2
from tensorflow_serving.apis import prediction_service_pb2_grpc

from serving import errors
from serving import tensors
from serving.metrics import GRPC, ServingMetrics
from serving.model_manager import ModelManager
from serving.prediction import Predictor
from serving.servable import DEFAULT_SIGNATURE

log = logging.getLogger(__name__)

SIGNATURE_DEF_FIELD = "signature_def"


def _version_choice(model_spec):
  choice = model_spec.WhichOneof("version_choice")
  version = model_spec.version.value if choice == "version" else None
  label = model_spec.version_label if choice == "version_label" else None
  return version, label


def _abort(context: grpc.ServicerContext, error: errors.ServingError):
  context.abort(error.code, error.message)


def model_metadata(manager: ModelManager, request: get_model_metadata_pb2.GetModelMetadataRequest
                   ) -> get_model_metadata_pb2.GetModelMetadataResponse:
  """The signature_def map of one version, as TF Serving reports it."""
  if not request.metadata_field:
    raise errors.invalid_argument("GetModelMetadataRequest must name at least one "
                                  f"metadata_field (supported: {SIGNATURE_DEF_FIELD!r})")
  for field in request.metadata_field:
    if field != SIGNATURE_DEF_FIELD:
      raise errors.invalid_argument(f"metadata field {field!r} is not supported "
                                    f"(supported: {SIGNATURE_DEF_FIELD!r})")
  version, label = _version_choice(request.model_spec)
  servable = manager.acquire(request.model_spec.name, version, label)
  try:
    signature_map = get_model_metadata_pb2.SignatureDefMap()
    for name, signature_def in servable.signature_defs.items():
      signature_map.signature_def[name].CopyFrom(signature_def)
    response = get_model_metadata_pb2.GetModelMetadataResponse()
    response.model_spec.name = servable.model_name
    response.model_spec.version.value = servable.version
    response.metadata[SIGNATURE_DEF_FIELD].Pack(signature_map)
    return response
  finally:
    servable.exit()


def model_status(manager: ModelManager, request: get_model_status_pb2.GetModelStatusRequest
                 ) -> get_model_status_pb2.GetModelStatusResponse:
  spec = request.model_spec
  version, label = _version_choice(spec)
  if label:
    labels = dict(manager.spec(spec.name).version_labels)
    if label not in labels:
      raise errors.not_found(f"model {spec.name!r} has no version label {label!r}")
    version = labels[label]
  response = get_model_status_pb2.GetModelStatusResponse()
  for status in manager.status(spec.name, version):
    entry = response.model_version_status.add(version=status.version, state=int(status.state))
    entry.status.SetInParent()  # error_code OK is reported, not left out
    if status.error is not None:
      entry.status.error_code = status.error.tf_error_code
      entry.status.error_message = status.error.message
  return response


class PredictionServicer(prediction_service_pb2_grpc.PredictionServiceServicer):
  """Predict and GetModelMetadata; Classify, Regress and MultiInference are not served.

  Every call is counted and access-logged through `metrics.request` (serving.metrics).
  """

  def __init__(self, predictor: Predictor, max_decoded_bytes: int,
               metrics: ServingMetrics):
    self._predictor = predictor
    self._max_decoded_bytes = max_decoded_bytes
    self._metrics = metrics

  def Predict(self, request: predict_pb2.PredictRequest, context: grpc.ServicerContext):
    version, label = _version_choice(request.model_spec)
    try:
      with self._metrics.request(GRPC) as call:
        call.asked_for("Predict", request.model_spec.name, version, label)
        result = self._predictor.predict(
            request.model_spec.name, version, label,
            request.model_spec.signature_name or DEFAULT_SIGNATURE,
            lambda signature: tensors.decode_inputs(request.inputs, self._max_decoded_bytes),
            output_filter=list(request.output_filter),
            client_timeout=context.time_remaining(),
            on_reached=call.served_by)
        response = predict_pb2.PredictResponse()
        response.model_spec.name = result.model_name
        response.model_spec.version.value = result.version
        response.model_spec.signature_name = result.signature_name
        for name, value in result.outputs.items():
          response.outputs[name].CopyFrom(tensors.to_tensor_proto(value))
        return response
    except errors.ServingError as e:
      _abort(context, e)

  def GetModelMetadata(self, request, context):
    try:
      with self._metrics.request(GRPC) as call:
        call.asked_for("GetModelMetadata", request.model_spec.name,
                       *_version_choice(request.model_spec))
        response = model_metadata(self._predictor.manager, request)
        call.served_by(response.model_spec.version.value)
        return response
    except errors.ServingError as e:
      _abort(context, e)

  def _unimplemented(self, method: str, model_spec, context: grpc.ServicerContext):
    try:
      with self._metrics.request(GRPC) as call:
        call.asked_for(method, model_spec.name, *_version_choice(model_spec))
        raise errors.ServingError(grpc.StatusCode.UNIMPLEMENTED,
                                  f"{method} is not implemented by this server; use Predict")
    except errors.ServingError as e:
      _abort(context, e)

  def Classify(self, request, context):
    self._unimplemented("Classify", request.model_spec, context)

  def Regress(self, request, context):
    self._unimplemented("Regress", request.model_spec, context)

  def MultiInference(self, request, context):
    # Its tasks each name a model; the access log names the first.
    spec = request.tasks[0].model_spec if request.tasks else model_pb2.ModelSpec()
    self._unimplemented("MultiInference", spec, context)


class ModelServicer(model_service_pb2_grpc.ModelServiceServicer):
  """GetModelStatus and HandleReloadConfigRequest, counted and logged as PredictionServicer's."""

  def __init__(self, manager: ModelManager,
               reload_config: Callable[[object], model_management_pb2.ReloadConfigResponse],
               metrics: ServingMetrics):
    self._manager = manager
    self._reload_config = reload_config
    self._metrics = metrics

  def GetModelStatus(self, request, context):
    try:
      with self._metrics.request(GRPC) as call:
        call.asked_for("GetModelStatus", request.model_spec.name,
                       *_version_choice(request.model_spec))
        return model_status(self._manager, request)
    except errors.ServingError as e:
      _abort(context, e)

  def HandleReloadConfigRequest(self, request, context):
    try:
      with self._metrics.request(GRPC) as call:
        call.asked_for("HandleReloadConfigRequest", "")
        return self._reload_config(request.config)
    except errors.ServingError as e:
      _abort(context, e)
