"""One exception family for the whole broker.

Protocol errors carry an MQTT 5 style reason code (a superset of what 3.1.1
can express) so the same errors serve both protocol versions; the 3.1.1
CONNACK return code is derived from it where one exists.
"""

# Reason codes (MQTT 5.0 numbering, section 2.4; 3.1.1 maps a few of them onto CONNACK).
SUCCESS = 0x00                      # also: Normal disconnection, Granted QoS 0
GRANTED_QOS_1 = 0x01
GRANTED_QOS_2 = 0x02
DISCONNECT_WITH_WILL = 0x04
NO_MATCHING_SUBSCRIBERS = 0x10
NO_SUBSCRIPTION_EXISTED = 0x11
CONTINUE_AUTHENTICATION = 0x18
REAUTHENTICATE = 0x19
UNSPECIFIED_ERROR = 0x80
MALFORMED_PACKET = 0x81
PROTOCOL_ERROR = 0x82
IMPLEMENTATION_SPECIFIC_ERROR = 0x83
UNSUPPORTED_PROTOCOL_VERSION = 0x84
CLIENT_ID_NOT_VALID = 0x85
BAD_USERNAME_OR_PASSWORD = 0x86
NOT_AUTHORIZED = 0x87
SERVER_UNAVAILABLE = 0x88
SERVER_BUSY = 0x89
BANNED = 0x8A
SERVER_SHUTTING_DOWN = 0x8B
BAD_AUTHENTICATION_METHOD = 0x8C
KEEP_ALIVE_TIMEOUT = 0x8D
SESSION_TAKEN_OVER = 0x8E
TOPIC_FILTER_INVALID = 0x8F
TOPIC_NAME_INVALID = 0x90
PACKET_ID_IN_USE = 0x91
PACKET_ID_NOT_FOUND = 0x92
RECEIVE_MAXIMUM_EXCEEDED = 0x93
TOPIC_ALIAS_INVALID = 0x94
PACKET_TOO_LARGE = 0x95
MESSAGE_RATE_TOO_HIGH = 0x96
QUOTA_EXCEEDED = 0x97
ADMINISTRATIVE_ACTION = 0x98
PAYLOAD_FORMAT_INVALID = 0x99
RETAIN_NOT_SUPPORTED = 0x9A
QOS_NOT_SUPPORTED = 0x9B
USE_ANOTHER_SERVER = 0x9C
SERVER_MOVED = 0x9D
SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
CONNECTION_RATE_EXCEEDED = 0x9F
MAXIMUM_CONNECT_TIME = 0xA0
SUBSCRIPTION_IDS_NOT_SUPPORTED = 0xA1
WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2

# Names for log lines (the specification's wording); 0x00 reads per packet.
REASON_NAMES = {
    0x00: "Success", 0x01: "Granted QoS 1", 0x02: "Granted QoS 2",
    0x04: "Disconnect with Will Message", 0x10: "No matching subscribers",
    0x11: "No subscription existed", 0x18: "Continue authentication", 0x19: "Re-authenticate",
    0x80: "Unspecified error", 0x81: "Malformed Packet", 0x82: "Protocol Error",
    0x83: "Implementation specific error", 0x84: "Unsupported Protocol Version",
    0x85: "Client Identifier not valid", 0x86: "Bad User Name or Password",
    0x87: "Not authorized", 0x88: "Server unavailable", 0x89: "Server busy", 0x8A: "Banned",
    0x8B: "Server shutting down", 0x8C: "Bad authentication method",
    0x8D: "Keep Alive timeout", 0x8E: "Session taken over", 0x8F: "Topic Filter invalid",
    0x90: "Topic Name invalid", 0x91: "Packet Identifier in use",
    0x92: "Packet Identifier not found", 0x93: "Receive Maximum exceeded",
    0x94: "Topic Alias invalid", 0x95: "Packet too large", 0x96: "Message rate too high",
    0x97: "Quota exceeded", 0x98: "Administrative action", 0x99: "Payload format invalid",
    0x9A: "Retain not supported", 0x9B: "QoS not supported", 0x9C: "Use another server",
    0x9D: "Server moved", 0x9E: "Shared Subscriptions not supported",
    0x9F: "Connection rate exceeded", 0xA0: "Maximum connect time",
    0xA1: "Subscription Identifiers not supported",
    0xA2: "Wildcard Subscriptions not supported",
}

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

    def in_file(self, where: str | None) -> "ConfigError":
        """The same problems, each prefixed with the configuration file ``where`` (for checks
        made after the file was read, whose lines name only the key, as `config check` says
        them); itself for None or "" (no file: the built-in defaults, a command-line option)."""
        if not where:
            return self
        return ConfigError(*(f"{where}: {p}" for p in self.problems))


class AddressError(EdgebrokerError):
    """A broker address the client library cannot read, or a host name that cannot be looked
    up (client/address.py, client/handshake.py)."""


class ProtocolError(EdgebrokerError):
    """The peer broke the MQTT protocol; the connection must be closed.

    ``rule`` names the specification rule (for example ``MQTT-3.3.1-4``) so the
    log line tells an operator exactly what the client did wrong.
    """

    def __init__(self, message: str, *, rule: str = "", reason: int = MALFORMED_PACKET):
        super().__init__(message)
        self.rule = rule
        self.reason = reason
        self.connect5 = False   # raised by a CONNECT of protocol level 5: answered in 5.0
        self.max_packet5 = 0    # ... whose Maximum Packet Size (0: none) its answer keeps to
        # A frame over the size limit: its bytes from its first one, as far as they arrived
        # (a client reads past a PUBLISH so refused: client/oversize.py)
        self.frame: bytes | None = None

    def __str__(self) -> str:
        text = super().__str__()
        return f"{text} [{self.rule}]" if self.rule else text

    @property
    def connack_code(self) -> int | None:
        """The 3.1.1 CONNACK return code to send before closing, if any."""
        return CONNACK_CODES_311.get(self.reason)


def shown(text: str, limit: int, unit: str = "") -> str:
    """``text`` as an error or log line shows it: its repr, only its first ``limit``
    characters and "..." when it is longer, then its size in ``unit`` ("bytes" of UTF-8, or
    "characters") when one is given."""
    if len(text) <= limit:
        return repr(text)
    if not unit:
        return f"{text[:limit]!r}..."
    size = len(text.encode("utf-8", "replace")) if unit == "bytes" else len(text)
    return f"{text[:limit]!r}... ({size} {unit})"


def topic_shown(topic: str) -> str:
    """A topic name or filter (MQTT allows 64 KB) as an error or log line shows it: ``shown``
    with its first 200 characters."""
    return shown(topic, 200, "characters")


def name_shown(name: str) -> str:
    """A client id or user name (MQTT allows 64 KB; max_client_id_length is 65535 unless
    set) as an error or log line shows it: ``shown`` with its first 100 characters."""
    return shown(name, 100)
