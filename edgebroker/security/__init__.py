"""Who may connect and what they may touch: password hashes, ACLs, per-listener policy.

No sockets here. ``passwords`` and ``acl`` are plain data and functions;
``policy`` joins them into the per-listener object the core asks at CONNECT,
and ``authenticator`` runs the deliberately slow password checks on a small
worker pool so the core thread never waits for one.
"""
