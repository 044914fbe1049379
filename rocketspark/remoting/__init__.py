"""RocketMQ's TCP remoting protocol: what a client of a real cluster speaks.

The numbers of the protocol (``codes``); the one command and its frame, in both
header encodings (``command``); typed request and response headers that travel
as a command's ext fields (``headers``); and one TCP connection that matches
responses to requests and serves the server's own requests (``connection``).
Nothing here imports the store, the client or Spark: only
:mod:`rocketspark.errors` and :mod:`rocketspark.message`.
"""
