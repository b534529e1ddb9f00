"""ringtop's wire and disk contract. Imports only the stdlib, msgspec and pyzmq — never torch."""

from .codec import MAX_FRAME_BYTES, decode, encode, from_json_line, read_log, to_json_line
from .commands import COMMANDS, IMMEDIATE_COMMANDS, validate_command
from .endpoints import (
    DEFAULT_CONTROL_ADDRESS,
    DEFAULT_PUBLISH_ADDRESS,
    DEFAULT_RELAY_ADDRESS,
    EndpointError,
    Endpoints,
    check_bind_safe,
    free_tcp_port,
    parse_tcp,
)
from .errors import (
    BadArgumentsError,
    InvalidMessageError,
    MalformedError,
    OversizeError,
    ProtocolError,
    UnknownCommandError,
    UnknownTypeError,
    VersionError,
)
from .messages import (
    PROTOCOL_VERSION,
    UI_RANK,
    Bye,
    Command,
    CommStat,
    Digest,
    Event,
    GoodputSoFar,
    GpuSample,
    GroupCursor,
    Heartbeat,
    Hello,
    InFlight,
    MemorySample,
    Message,
    Prediction,
    Reply,
    Sample,
    Sharding,
    StageSpan,
    Stall,
    Step,
    StepBrief,
    Telemetry,
    Timeline,
)

__all__ = [name for name in dir() if not name.startswith("_")]
