"""ringtop's wire and disk contract. Imports only the stdlib, msgspec and pyzmq — never torch."""

from ringtop.protocol.codec import MAX_FRAME_BYTES, decode, encode, from_json_line, read_log, to_json_line
from ringtop.protocol.commands import COMMANDS, IMMEDIATE_COMMANDS, validate_command
from ringtop.protocol.endpoints import (
    DEFAULT_CONTROL_ADDRESS,
    DEFAULT_PUBLISH_ADDRESS,
    DEFAULT_RELAY_ADDRESS,
    EndpointError,
    Endpoints,
    check_bind_safe,
    free_tcp_port,
    free_tcp_ports,
    parse_tcp,
)
from ringtop.protocol.errors import (
    BadArgumentsError,
    InvalidMessageError,
    MalformedError,
    OversizeError,
    ProtocolError,
    UnknownCommandError,
    UnknownTypeError,
    VersionError,
)
from ringtop.protocol.messages import (
    PROTOCOL_VERSION,
    UI_RANK,
    Bye,
    CollectiveCall,
    CollectiveCalls,
    Command,
    CommStat,
    Digest,
    Event,
    GoodputSoFar,
    GpuSample,
    GroupCursor,
    HangReport,
    Heartbeat,
    Hello,
    InFlight,
    MemorySample,
    Message,
    Prediction,
    RankExit,
    RankLook,
    RecentSteps,
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
