"""One error type for everything a request can get wrong, carrying its gRPC status code.

The gRPC servicers abort with `code` and `message`; the REST front end maps `code` to an
HTTP status. Keeping the code on the error (rather than translating exception classes at
each front end) means both protocols answer the same mistake the same way.
"""
import grpc
import tensorflow as tf

# gRPC status → HTTP status, as TF Serving's REST front end maps them.
_HTTP_STATUS = {
    grpc.StatusCode.OK: 200,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}


class ServingError(Exception):
  """A request the server refuses or could not answer, with the status to answer it with."""

  def __init__(self, code: grpc.StatusCode, message: str, http_status: int = 0):
    super().__init__(message)
    self.code = code
    self.message = message
    self._http_status = http_status  # when HTTP has a more precise status than the code

  @property
  def http_status(self) -> int:
    return self._http_status or _HTTP_STATUS.get(self.code, 500)

  @property
  def tf_error_code(self) -> int:
    """The numeric code (tensorflow.error.Code uses gRPC's numbering) for a StatusProto."""
    return self.code.value[0]

  def __str__(self) -> str:
    return f"{self.code.name}: {self.message}"


def invalid_argument(message: str) -> ServingError:
  return ServingError(grpc.StatusCode.INVALID_ARGUMENT, message)


def not_found(message: str) -> ServingError:
  return ServingError(grpc.StatusCode.NOT_FOUND, message)


def resource_exhausted(message: str) -> ServingError:
  return ServingError(grpc.StatusCode.RESOURCE_EXHAUSTED, message)


def failed_precondition(message: str) -> ServingError:
  return ServingError(grpc.StatusCode.FAILED_PRECONDITION, message)


def deadline_exceeded(message: str) -> ServingError:
  return ServingError(grpc.StatusCode.DEADLINE_EXCEEDED, message)


def internal(message: str) -> ServingError:
  return ServingError(grpc.StatusCode.INTERNAL, message)


def from_tf_error(error: Exception) -> ServingError:
  """A model's own failure (tf.errors.OpError keeps its canonical code), else INTERNAL."""
  if isinstance(error, tf.errors.OpError):
    for code in grpc.StatusCode:
      if code.value[0] == error.error_code:
        return ServingError(code, error.message)
  return ServingError(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")
