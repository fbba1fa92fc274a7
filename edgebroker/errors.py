"""One exception family for the whole broker.

Protocol errors carry an MQTT 5 style reason code (a superset of what 3.1.1
can express) so the same errors serve both protocol versions; the 3.1.1
CONNACK return code is derived from it where one exists.
"""

# Reason codes (MQTT 5.0 numbering; 3.1.1 maps a few of them onto CONNACK).
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_ID_NOT_VALID = 0x85
BAD_USERNAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_NAME_INVALID = 0x90
PACKET_TOO_LARGE = 0x95

# 3.1.1 CONNACK return codes for the reason codes that have one.
CONNACK_CODES_311 = {
    UNSUPPORTED_PROTOCOL_VERSION: 1,
    CLIENT_ID_NOT_VALID: 2,
    SERVER_UNAVAILABLE: 3,
    BAD_USERNAME_OR_PASSWORD: 4,
    NOT_AUTHORIZED: 5,
}


class EdgebrokerError(Exception):
    """Base class of every error the broker raises on purpose."""


class ConfigError(EdgebrokerError):
    """A configuration file or option is wrong; the message names the key. One error may
    carry several problems, one message each (``config.load`` reports all those of a file)."""

    def __init__(self, *problems: str, partial=None):
        super().__init__("; ".join(problems))
        self.problems = list(problems)
        # config.load: what the valid keys make (the wrong ones left at their defaults), for
        # `config check` to go on checking the files it names.
        self.partial = partial


class ProtocolError(EdgebrokerError):
    """The peer broke the MQTT protocol; the connection must be closed.

    ``rule`` names the specification rule (for example ``MQTT-3.3.1-4``) so the
    log line tells an operator exactly what the client did wrong.
    """

    def __init__(self, message: str, *, rule: str = "", reason: int = MALFORMED_PACKET):
        super().__init__(message)
        self.rule = rule
        self.reason = reason

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} [{self.rule}]" if self.rule else text

    @property
    def connack_code(self) -> int | None:
        """The 3.1.1 CONNACK return code to send before closing, if any."""
        return CONNACK_CODES_311.get(self.reason)
