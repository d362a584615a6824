"""The stores: where a backend's scripts run.

``base``        the ``Store`` protocol and the one translation of redis-py and socket errors
``memory``      ``memory://``: every script answered by its Python twin, on Redis's
                keyspace rules (``memory.keyspace``)
``wire``        one multiplexed, auto-pipelined connection per server (``endpoint``: where
                and how it connects)
``standalone``  one Redis server (``redis://``, ``rediss://``, ``unix://``, or a client
                passed in), and its dedicated pub/sub subscriber (``pubsub``)
``sentinel``    the server the sentinels name as the master
``cluster``     the master that owns the keys' slot, and its sharded subscriber
                (``cluster_pubsub``)
``notify``      wake-ups: one pub/sub subscriber per backend, fanned out to local waiters
``loops``       one running event loop at a time: the check before a store moves to another

Nothing here imports ``_backend`` or a primitive: stores know scripts, keys and arguments,
never what a limiter or a lock means.
"""
