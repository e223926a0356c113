"""The ZeroMQ transport: actor farm, cluster master/workers and web monitor.

One module per job:

- ``wire``: the envelope (and the frame helpers both ends share); ``security``: CURVE keys
  (every socket, loopback included), the ZAP handler and the actor-endpoint check;
  ``fields``: validation of what peers send the master.
- ``client``: ``connect(address, **options)`` -> ``ZmqClient``, with ``options``
  (``ZmqOptions``), ``handle`` (one actor's handle, calls and futures), ``receiver``
  (completing futures nobody reads), ``farm`` (the embedded local farm) and ``masterlink``
  (a cluster client's link to its master).
- ``shipping``: local code packed by the client and installed by the actor.
- ``launcher`` (actor process handles), ``zygote`` (the fork server), ``actor`` (an actor
  process and its serving loop), ``process`` (the process plumbing those three share).
- ``master`` (socket, loop, message handlers) on ``tables`` (peers, jobs, placement, status);
  ``worker``: a worker host; ``monitor``: the web monitor, its page in ``monitor.html``.
- ``inference``: the relay of central inference for a cluster's actors (raw frames into the
  learner's policy server).
- ``command``: the ``harness cluster`` command's arguments (a ``CommandSpec``; no pyzmq);
  ``cli``: its commands, with ``clusters`` (this host's state files) and ``control`` (asking
  a master for its status or to stop); ``plugin``: the registration.
"""
