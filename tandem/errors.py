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


class StageTimeout(TandemError):
    status, error_type = 504, "timeout_error"


class ConfigError(TandemError):
    """An operator's config is wrong; raised before anything is started."""

    status, error_type = 500, "config_error"
