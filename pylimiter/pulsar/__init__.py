"""Apache Pulsar broker subsystems from pylimiter's source documents, each a
library on pylimiter's public API plus, where it needs one, a PySpark
pipeline with an HTML report (on the shared ``pylimiter.spark`` kit):

``topiclist``  PIP-442: topic listing under heap and direct memory limits
               (a broker, a proxy and a load generator on Pulsar's protocol)
``cache``      PIP-430: the broker entry cache (global removal queue with
               expected-read-count eviction, a read path bounded by an
               AsyncSemaphore) and a policy simulator on Spark

These are models for operators and engineers asking what a setting or a
policy would do to a cluster; the limiter itself is ``pylimiter``.
"""
