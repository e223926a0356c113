"""The ZeroMQ transport: actor farm, cluster master/workers and web monitor."""
