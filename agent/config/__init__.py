"""The agent's config: every option of a run, its command line and its checks.

`options` is the flag framework (a field's `Option` makes its flag, help and bounds), `values`
the parsers of option values that are not a plain number or word, `fields` the config itself
(`AgentConfig`, one field per option), `checks` what a config as a whole must satisfy,
`command_line` the parser and the config of what was typed. Everything is checked once, before
any rank starts (`ringtop run` checks it in the launching process too).
"""

from ringtop.agent.config.checks import check_switch_tensor_parallel, check_tensor_parallel_world
from ringtop.agent.config.command_line import (
    add_agent_arguments,
    agent_parser,
    config_from_options,
    parse_agent_args,
)
from ringtop.agent.config.fields import (
    BUILTIN_DATA,
    BUILTIN_MODEL,
    CHECKPOINTS,
    FAULTS,
    MODEL_SIZE_HEADS,
    TELEMETRY,
    TRAINING,
    AgentConfig,
    cli_fields,
    load_command_ds_config,
)
from ringtop.agent.config.options import ConfigError
