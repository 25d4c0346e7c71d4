"""PIP-442 end to end: a topic-list broker and proxy speaking Pulsar's binary
protocol, memory-bounded by pylimiter's AsyncDualMemoryLimiter, and a load
generator.  Run ``python -m pylimiter.pulsar.topiclist broker``; needs the
``topiclist`` extra, ``pip install '.[topiclist]'`` from a checkout (protobuf,
prometheus_client, aiohttp, google-re2, google-crc32c)."""
