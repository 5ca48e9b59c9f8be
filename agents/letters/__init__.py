"""The letters agent: two real model calls per rollout, rewarded by the share of early-alphabet letters
in the replies. Small and fast, so the trainer's tests and benchmarks train against it (``main``), a
slowed-down variant with seeded long-tailed episode lengths (``sleepy``), and the rows and config of a
small run against it (``run_files``)."""
