"""Apache Pulsar broker subsystems from pylimiter's source documents, each a
library on pylimiter's public API plus, where it needs one, a PySpark
pipeline with an HTML report (on the shared ``pylimiter.spark`` kit):

``topiclist``  PIP-442: topic listing under heap and direct memory limits
               (a broker, a proxy and a load generator on Pulsar's protocol)
``balance``    bundle load balancing: Pulsar's bundles, split algorithms,
               placement and ThresholdShedder, and a PySpark replay that
               compares strategies on a cluster's topic load

These are models for operators and engineers asking what a setting or a
policy would do to a cluster; the limiter itself is ``pylimiter``.
"""
