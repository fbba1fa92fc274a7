"""The MQTT client library (3.1.1 and 5.0): a sans-I/O connection (connection.py), its events
and requests, and the synchronous event loop over a transport (loop.py). docs/client.md."""
