"""Errors for bad input on either channel; each carries a short stable `code` for replies and logs."""


class ProtocolError(ValueError):
    code = "protocol_error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class OversizeError(ProtocolError):
    code = "oversize"


class MalformedError(ProtocolError):
    """The bytes are not MessagePack / JSON at all, or not a map."""

    code = "malformed"


class VersionError(ProtocolError):
    code = "bad_version"


class UnknownTypeError(ProtocolError):
    code = "unknown_type"


class InvalidMessageError(ProtocolError):
    """Known type, but a field is missing or of the wrong type."""

    code = "invalid"


class UnknownCommandError(ProtocolError):
    code = "unknown_command"


class BadArgumentsError(ProtocolError):
    code = "bad_arguments"
