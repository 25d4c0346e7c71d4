"""Apache Pulsar broker subsystems from pylimiter's source documents, each a
library on pylimiter's public API plus, where it needs one, a PySpark
pipeline with an HTML report (on the shared ``pylimiter.spark`` kit):

``topiclist``  PIP-442: topic listing under heap and direct memory limits
               (a broker, a proxy and a load generator on Pulsar's protocol)
``cache``      PIP-430: the broker entry cache (global removal queue with
               expected-read-count eviction, a read path bounded by an
               AsyncSemaphore) and a policy simulator on Spark
``cursor``     message lifecycle (seed 003): acknowledgment holes as range
               sets, a cursor with hole compensation and backlog quotas,
               TTL that never expires a delayed message before it could be
               read, and a subscription simulator on Spark
``balance``    bundle load balancing: Pulsar's bundles, split algorithms,
               placement and ThresholdShedder, and a PySpark replay that
               compares strategies on a cluster's topic load

These are models for operators and engineers asking what a setting or a
policy would do to a cluster; the limiter itself is ``pylimiter``.
"""
