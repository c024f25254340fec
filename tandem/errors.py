"""The one error hierarchy of Tandem: each error carries the HTTP status and OpenAI error type that
the ingress translates it to. Raised anywhere in the core; translated once, at the edge."""

from __future__ import annotations


class TandemError(Exception):
    """Base error. `status` is the HTTP status the client sees, `error_type` OpenAI's `type` field."""

    status: int = 500
    error_type: str = "internal_error"

    def __init__(self, message: str, *, param: str | None = None, retry_after_s: float | None = None):
        super().__init__(message)
        self.message = message
        self.param = param
        self.retry_after_s = retry_after_s

    def to_openai(self) -> dict:
        return {"error": {"message": self.message, "type": self.error_type, "param": self.param,
                          "code": self.status}}


class BadRequest(TandemError):
    status, error_type = 400, "invalid_request_error"


class Unauthorized(TandemError):
    status, error_type = 401, "authentication_error"


class NotFound(TandemError):
    status, error_type = 404, "not_found_error"


class PayloadTooLarge(TandemError):
    status, error_type = 413, "invalid_request_error"


class Overloaded(TandemError):
    status, error_type = 503, "overloaded_error"


class FeaturesLost(TandemError):
    """A model server could not fetch a request's image features: their owner, a VisionEncoder
    replica, is gone (scaled down or died). The pipeline encodes them again, once."""

    status, error_type = 503, "service_unavailable_error"


class ReplicaLost(TandemError):
    """A model replica died before it answered, and sending the call again did not reach a live
    one (or its stream had already sent text): the client may retry."""

    status, error_type = 503, "service_unavailable_error"


class StageTimeout(TandemError):
    status, error_type = 504, "timeout_error"


class ConfigError(TandemError):
    """An operator's config is wrong; raised before anything is started."""

    status, error_type = 500, "config_error"


def client_error(err: BaseException) -> TandemError | None:
    """`err` as the plain Tandem error a client should get, when it is the client's fault (a 4xx):
    an error raised on another replica arrives wrapped (Ray's dual exception class, whose text is a
    traceback with the replica's name, pid, address and file paths); only its class, message and
    field travel on. None for anything that is not a client error."""
    if not isinstance(err, TandemError) or err.status >= 500:
        return None
    cls = next(c for c in type(err).__mro__ if issubclass(c, TandemError) and c.__module__ == __name__)
    return cls(err.message, param=err.param, retry_after_s=err.retry_after_s)
