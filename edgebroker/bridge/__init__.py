"""Bridges upstream: each ``[[bridge]]`` is a log consumer with its own cursor that forwards
matching records to a remote MQTT broker over the client library's sans-I/O connection, and
publishes the remote's messages here (docs/bridge.md). It runs on the core loop: its link is
one more socket of the loop, not a thread.

``bridges.Bridges`` is what the server uses; ``bridge.Bridge`` one bridge; ``outbound`` the
cursor; ``inbound`` the local publishing; ``link`` the socket and TLS; ``rules`` the topic
rules; ``checkpoint`` the cursor file.
"""
