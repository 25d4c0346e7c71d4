"""Benchmark harness shipped with pylimiter.

``python -m pylimiter.bench`` runs the trial grid on Spark (the ``spark``
extra: ``pip install '.[spark]'`` in a checkout); :mod:`pylimiter.bench.scenarios`
holds the trials themselves and needs nothing beyond pylimiter.
"""
